"""Inspect: the first-iteration ‖w‖/‖∇w‖ table (LARS paper Table 2) and its bad inputs."""

from __future__ import annotations

import argparse
import logging
import math

import pytest
import torch
from imagegen import make_image_folder
from torch import nn

from bigbatch.commands import inspect as inspect_command
from bigbatch.errors import ConfigError
from bigbatch.models.alexnet import alexnet
from bigbatch.tools import inspect as inspect_tools
from bigbatch.tools.inspect import ParameterRatio, first_iteration_ratios, spread_summary


def parser_with_inspect() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bigbatch")
    inspect_command.add_commands(parser.add_subparsers())
    return parser


@pytest.fixture(scope="module")
def alexnet_output():
    """`bigbatch inspect --model alexnet` on synthetic 227x227 input (printed text, rows by name),
    run once for the module; the rows are the ones the command printed."""
    import contextlib
    import io

    printed = []
    real_inspect = inspect_tools.inspect_model

    def recording(*args, **kwargs):
        printed.extend(real_inspect(*args, **kwargs))
        return printed

    args = parser_with_inspect().parse_args(["inspect", "--model", "alexnet", "--batch", "4"])
    buffer = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(buffer):
        patch.setattr(inspect_tools, "inspect_model", recording)
        assert args.handler(args) == 0
    return buffer.getvalue(), {r.name: r for r in printed}


def test_ratios_are_weight_norm_over_gradient_norm_of_the_mean_loss():
    torch.manual_seed(0)
    model = nn.Linear(3, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]]))
    images = torch.tensor([[1.0, 1.0, 1.0], [2.0, 0.0, 0.0]])
    labels = torch.tensor([0, 1])
    (row,) = first_iteration_ratios(model, images, labels)
    # by hand: gradient of mean cross-entropy = (softmax - onehot)^T x / N
    probs = torch.softmax(images @ model.weight.detach().T, dim=1)
    grad = (probs - nn.functional.one_hot(labels, 2).float()).T @ images / 2
    assert row.weight_norm == pytest.approx(math.sqrt(5.0))
    assert row.grad_norm == pytest.approx(float(grad.norm()), rel=1e-5)
    assert row.ratio == pytest.approx(math.sqrt(5.0) / float(grad.norm()), rel=1e-5)


def test_alexnet_fc6_has_the_largest_weight_ratio_and_conv1_the_smallest(alexnet_output):
    """The order of Table 2's extremes (conv1.w 5.76 lowest, fc6.w 1345 highest), measured on
    synthetic 227x227 input. The gap is ~3x here, not the paper's 233x: see
    docs/results/trust_ratio/ for why the fc rows cannot reach it from Caffe's fillers."""
    _, rows = alexnet_output
    weights = {name: r.ratio for name, r in rows.items() if name.endswith(".weight")}
    assert max(weights, key=weights.get) == "fc6.weight", weights
    assert min(weights, key=weights.get) == "conv1.weight", weights
    assert weights["fc6.weight"] > 2.5 * weights["conv1.weight"], weights


def test_alexnet_ratios_spread_over_two_orders_of_magnitude_across_tensors(alexnet_output):
    """The point of Table 2: one global LR cannot suit every tensor."""
    _, rows = alexnet_output
    finite = [r.ratio for r in rows.values() if math.isfinite(r.ratio) and r.ratio > 0]
    assert max(finite) > 100 * min(finite)


def test_alexnet_bn_fc6_ratio_is_far_above_conv1():
    rows = {r.name: r.ratio for r in inspect_tools.inspect_model("alexnet_bn", batch=4)}
    assert rows["fc6.weight"] > 10 * rows["conv1.weight"], rows


def test_caffe_input_scale_brings_conv1_near_the_paper(alexnet_output):
    """Caffe fed 0-255 pixels: without the model's input scale (input_scale=1) conv1 sees 58x
    smaller inputs, its gradient shrinks with them and its ratio lands far above the paper's
    5.76 and above fc6's; with it (the default) conv1 is within 3x of the paper."""
    _, rows = alexnet_output
    assert 5.76 / 3 < rows["conv1.weight"].ratio < 5.76 * 3
    torch.manual_seed(0)
    unscaled = alexnet(1000, input_scale=1.0)
    images, labels, _ = inspect_tools.inspection_batch("synthetic", 4, 227, seed=0)
    unscaled_rows = {r.name: r.ratio for r in first_iteration_ratios(unscaled, images, labels)}
    assert unscaled_rows["conv1.weight"] > 10 * rows["conv1.weight"].ratio
    assert unscaled_rows["conv1.weight"] > unscaled_rows["fc6.weight"]


def test_alexnet_table_prints_a_row_per_parameter_with_the_paper_column(alexnet_output):
    text, rows = alexnet_output
    lines = text.splitlines()
    for name, row in rows.items():
        (line,) = [line for line in lines if line.split() and line.split()[0] == name]
        assert f"{row.ratio:.4g}" in line.split()
        paper = inspect_tools.PAPER_ALEXNET_RATIOS.get(name)
        if paper is not None:
            assert line.split()[-1] == f"{paper:.4g}"
    assert "227x227" in lines[0] and "spread:" in text
    assert sum(1 for line in lines if line.split() and line.split()[0] in rows) == len(rows)


def test_spread_summary_names_the_extremes():
    rows = [ParameterRatio("a", (1,), 10.0, 5.0), ParameterRatio("b", (1,), 100.0, 0.1),
            ParameterRatio("c", (1,), 1.0, 0.0)]  # zero gradient: infinite ratio, left out
    assert spread_summary(rows).startswith("spread: b 1000 / a 2 = 500x")


@pytest.mark.parametrize("argv, words", [
    (["--model", "no_such_model"], "no_such_model"),
    (["--model", "small_cnn", "--dataset", "imagenet"], "not supported"),
    (["--model", "small_cnn", "--dataset", "imagefolder"], "needs a folder"),
    pytest.param(["--model", "small_cnn", "--dataset", "fashion-mnist", "--batch", "10001"],
                 "larger than", marks=pytest.mark.fashion_mnist),
    (["--model", "small_cnn", "--batch", "1"], "at least 2"),
    (["--model", "small_cnn", "--input-std", "0"], "positive"),
])
def test_bad_inputs_are_config_errors(argv, words):
    args = parser_with_inspect().parse_args(["inspect", *argv])
    with pytest.raises(ConfigError, match=words):
        args.handler(args)


def test_image_folder_batch_skips_and_reports_unreadable_images(tmp_path, caplog):
    """Real data from an ImageNet-style folder: validation images spread over the classes; a
    broken file is left out with a warning, not a crash."""
    info = make_image_folder(tmp_path, per_class=2, val_per_class=3, broken=False)
    broken = tmp_path / "val" / info.classes[1] / "zero_bytes.JPEG"
    broken.write_bytes(b"")
    with caplog.at_level(logging.WARNING):
        images, labels, classes = inspect_tools.real_batch("imagefolder", str(tmp_path), 10,
                                                            32, seed=0)
    assert classes == len(info.classes)
    assert images.shape == (9, 3, 32, 32) and len(labels) == 9  # 10 chosen, 1 unreadable
    assert sorted(set(labels.tolist())) == [0, 1, 2]
    assert "zero_bytes.JPEG" in caplog.text and "1 of the 10 chosen" in caplog.text
    rows = inspect_tools.inspect_model("small_cnn", "imagefolder", 32, 4, 0,
                                        data_path=str(tmp_path))
    assert rows and all(math.isfinite(r.ratio) for r in rows)


@pytest.mark.fashion_mnist
def test_small_model_on_fashion_mnist_gives_finite_ratios_for_every_parameter():
    rows = inspect_tools.inspect_model("small_cnn", "fashion-mnist", None, 8, 0)
    model_parameters = [name for name, _ in
                        inspect_tools.build_fresh_model("small_cnn", 10, 1, 0).named_parameters()]
    assert [r.name for r in rows] == model_parameters
    assert all(math.isfinite(r.ratio) for r in rows)
    # the three BN shifts start at zero (ratio 0); every other tensor has a positive ratio
    assert [r.name for r in rows if r.ratio == 0] == [
        f"features.block{k}.1.bias" for k in (1, 2, 3)]
    assert all(r.ratio > 0 and r.grad_norm > 0 for r in rows if r.weight_norm > 0)


def test_model_options_reach_the_inspected_model(capsys):
    args = parser_with_inspect().parse_args(
        ["inspect", "--model", "small_cnn", "--option", "width=8", "--batch", "2"])
    assert args.handler(args) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith("small_cnn, width=8: first iteration")
    first_conv = [line for line in text.splitlines() if line.startswith("features.block1.0.weight")]
    assert first_conv and first_conv[0].split()[1] == "8x3x3x3"  # synthetic RGB


@pytest.mark.parametrize("option, words", [
    ("width", "--option expects key=value"),
    ("no_such=1", "unknown option 'no_such'"),
])
def test_bad_model_options_are_config_errors(option, words):
    args = parser_with_inspect().parse_args(["inspect", "--model", "small_cnn", "--option", option])
    with pytest.raises(ConfigError, match=words):
        args.handler(args)
