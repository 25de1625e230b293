"""Inspect: the first-iteration ‖w‖/‖∇w‖ table (LARS paper Table 2) and its bad inputs."""

from __future__ import annotations

import argparse
import math

import pytest
import torch
from torch import nn

from bigbatch import inspect_ratios
from bigbatch.errors import ConfigError
from bigbatch.inspect_ratios import ParameterRatio, first_iteration_ratios, spread_summary


def parser_with_inspect() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bigbatch")
    inspect_ratios.add_inspect_command(parser.add_subparsers())
    return parser


@pytest.fixture(scope="module")
def alexnet_output():
    """`bigbatch inspect --model alexnet` on synthetic 227x227 input (printed text, rows by name),
    run once for the module; the rows are the ones the command printed."""
    import contextlib
    import io

    printed = []
    real_inspect = inspect_ratios.inspect_model

    def recording(*args, **kwargs):
        printed.extend(real_inspect(*args, **kwargs))
        return printed

    args = parser_with_inspect().parse_args(["inspect", "--model", "alexnet", "--batch", "4"])
    buffer = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(buffer):
        patch.setattr(inspect_ratios, "inspect_model", recording)
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


def test_alexnet_ratios_spread_over_more_than_an_order_of_magnitude(alexnet_output):
    """The point of Table 2: one global LR cannot suit every layer.

    Measured, not the paper's ordering: with Caffe's init and normalised (std 1) synthetic input,
    conv1's ratio (~87 at batch 4-8) lies *above* fc6's (~20): the paper has conv1 5.76, fc6 1345.
    See test_caffe_pixel_scale_brings_conv1_near_the_paper for the input-scale part of the gap.
    """
    _, rows = alexnet_output
    weights = {name: r.ratio for name, r in rows.items() if name.endswith(".weight")}
    assert max(weights.values()) > 10 * min(weights.values()), weights
    assert weights["fc6.weight"] > weights["fc8.weight"]  # as in the paper: 1345 > 19


def test_alexnet_bn_fc6_ratio_is_far_above_conv1():
    rows = {r.name: r.ratio for r in inspect_ratios.inspect_model("alexnet_bn", batch=4)}
    assert rows["fc6.weight"] > 10 * rows["conv1.weight"], rows


def test_caffe_pixel_scale_brings_conv1_near_the_paper(alexnet_output):
    """Caffe fed 0-255 pixels (std ~58): conv1's gradient grows with the input scale, its ratio
    falls from ~87 to ~3 (paper 5.76), and fc6 then lies above conv1 as in the paper."""
    rows = {r.name: r.ratio for r in inspect_ratios.inspect_model(
        "alexnet", batch=4, input_std=inspect_ratios.CAFFE_PIXEL_STD)}
    _, normalised = alexnet_output
    assert rows["conv1.weight"] < normalised["conv1.weight"].ratio / 10
    assert 1.0 < rows["conv1.weight"] < 4 * 5.76
    assert rows["fc6.weight"] > rows["conv1.weight"]


def test_alexnet_table_prints_a_row_per_parameter_with_the_paper_column(alexnet_output):
    text, rows = alexnet_output
    lines = text.splitlines()
    for name, row in rows.items():
        (line,) = [line for line in lines if line.split() and line.split()[0] == name]
        assert f"{row.ratio:.4g}" in line.split()
        paper = inspect_ratios.PAPER_ALEXNET_RATIOS.get(name)
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
    (["--model", "small_cnn", "--data", "imagenet"], "not supported"),
    (["--model", "small_cnn", "--batch", "1"], "at least 2"),
    (["--model", "small_cnn", "--input-std", "0"], "positive"),
])
def test_bad_inputs_are_config_errors(argv, words):
    args = parser_with_inspect().parse_args(["inspect", *argv])
    with pytest.raises(ConfigError, match=words):
        args.handler(args)


def test_small_model_on_fashion_mnist_gives_finite_ratios_for_every_parameter():
    rows = inspect_ratios.inspect_model("small_cnn", "fashion-mnist", None, 8, 0)
    model_parameters = [name for name, _ in
                        inspect_ratios.build_fresh_model("small_cnn", 10, 1, 0).named_parameters()]
    assert [r.name for r in rows] == model_parameters
    assert all(math.isfinite(r.ratio) for r in rows)
    # the three BN shifts start at zero (ratio 0); every other tensor has a positive ratio
    assert [r.name for r in rows if r.ratio == 0] == [
        f"features.block{k}.1.bias" for k in (1, 2, 3)]
    assert all(r.ratio > 0 and r.grad_norm > 0 for r in rows if r.weight_norm > 0)
