"""Models: registry, the paper's AlexNet / AlexNet-BN layouts, ResNets, small nets, FLOP counts."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from bigbatch.models import (
    count_parameters,
    create_model,
    forward_flops,
    forward_macs,
    model_names,
    model_spec,
)

# Smallest cheap input each family accepts in a test (default sizes are checked on meta).
TEST_IMAGE_SIZE = {
    "alexnet": 67,
    "alexnet_bn": 67,
    "resnet18": 32,
    "resnet50": 32,
    "small_cnn": 28,
    "small_resnet": 28,
}
DROPOUT_MODELS = [name for name in TEST_IMAGE_SIZE if "dropout" in model_spec(name).options]


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    # The tensors here are tiny; on a shared 2-core machine two OpenMP threads spin against other
    # processes and made this file 3x slower in wall time than one thread.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def shared_model(name: str, in_channels: int = 3, **options) -> nn.Module:
    """A real 10-class model built once per file (AlexNet's 61M-parameter init takes ~1 s).
    Tests that use it may run forwards but must not change its parameters."""
    defaults = model_spec(name).options
    changed = tuple(sorted((k, v) for k, v in options.items() if v != defaults[k]))
    return _build_once(name, in_channels, changed)


@functools.cache
def _build_once(name: str, in_channels: int, options: tuple) -> nn.Module:
    torch.manual_seed(0)
    return create_model(name, 10, in_channels=in_channels, **dict(options))


def meta_model(name: str, num_classes: int = 1000, **options) -> nn.Module:
    """Shapes only: builds in milliseconds and allocates nothing, for counts and layouts."""
    with torch.device("meta"):
        return create_model(name, num_classes, **options)


def test_registry_lists_every_model_with_its_default_image_size() -> None:
    assert model_names() == [
        "alexnet",
        "alexnet_bn",
        "resnet18",
        "resnet50",
        "small_cnn",
        "small_resnet",
    ]
    sizes = {name: model_spec(name).default_image_size for name in model_names()}
    assert sizes == {
        "alexnet": 227,
        "alexnet_bn": 227,
        "resnet18": 224,
        "resnet50": 224,
        "small_cnn": 28,
        "small_resnet": 28,
    }
    for name in model_names():
        spec = model_spec(name)
        assert spec.name == name
        assert spec.description and "\n" not in spec.description


def test_model_spec_is_frozen_and_exposes_option_defaults() -> None:
    spec = model_spec("alexnet_bn")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"  # type: ignore[misc]
    assert dict(spec.options) == {
        "dropout": 0.5, "bn_affine": False, "init": "caffe", "input_scale": None
    }
    assert dict(model_spec("resnet50").options) == {"zero_init_residual": False}
    assert dict(model_spec("small_resnet").options) == {
        "width": 32,
        "blocks_per_stage": 1,
        "dropout": 0.0,
    }


@pytest.mark.parametrize("in_channels", [1, 3])
@pytest.mark.parametrize("name", sorted(TEST_IMAGE_SIZE))
def test_every_model_maps_images_to_class_scores(name: str, in_channels: int) -> None:
    model = shared_model(name, in_channels)
    size = TEST_IMAGE_SIZE[name]
    images = torch.randn(2, in_channels, size, size)
    model.train()
    train_scores = model(images)
    model.eval()
    with torch.no_grad():
        eval_scores = model(images)
    assert train_scores.shape == (2, 10)
    assert eval_scores.shape == (2, 10)
    assert torch.isfinite(eval_scores).all()


def test_unknown_model_error_lists_the_choices() -> None:
    with pytest.raises(ValueError) as error:
        create_model("vgg16", 10)
    assert str(error.value) == (
        "unknown model 'vgg16'; choose one of: "
        "alexnet, alexnet_bn, resnet18, resnet50, small_cnn, small_resnet, "
        "or timm:NAME / torchvision:NAME"
    )
    with pytest.raises(ValueError, match="unknown model 'x'"):
        model_spec("x")


def test_unknown_or_mistyped_option_error_names_option_and_model() -> None:
    with pytest.raises(ValueError, match=r"unknown option 'depth' for model 'small_resnet'"):
        create_model("small_resnet", 10, depth=3)
    with pytest.raises(ValueError, match=r"'bn_affine'.*'alexnet'"):
        create_model("alexnet", 10, bn_affine=True)  # only alexnet_bn has BN layers
    with pytest.raises(ValueError, match=r"option 'width' of model 'small_cnn' must be int"):
        create_model("small_cnn", 10, width="32")
    with pytest.raises(ValueError, match=r"'zero_init_residual' of model 'resnet18' must be bool"):
        create_model("resnet18", 10, zero_init_residual=1)
    with pytest.raises(ValueError, match="num_classes"):
        create_model("small_cnn", 0)
    with pytest.raises(ValueError, match="dropout"):
        create_model("small_resnet", 10, dropout=1.0)


def test_integer_accepted_for_float_option() -> None:
    model = create_model("small_cnn", 10, dropout=0)
    assert model.head.dropout.p == 0.0


def test_parameter_counts_match_the_published_architectures() -> None:
    # AlexNet with Caffe's grouped conv2/conv4/conv5: 60,965,224 (the paper's "61M").
    assert count_parameters(meta_model("alexnet")) == 60_965_224
    # Caffe BN layers have no scale/shift: AlexNet-BN adds no parameters...
    assert count_parameters(meta_model("alexnet_bn")) == 60_965_224
    # ...unless asked for: gamma and beta for the 96 + 256 + 384 + 384 channels.
    affine = meta_model("alexnet_bn", bn_affine=True)
    assert count_parameters(affine) == 60_965_224 + 2 * (96 + 256 + 384 + 384)
    assert count_parameters(meta_model("resnet50")) == 25_557_032
    assert count_parameters(meta_model("resnet18")) == 11_689_512


def test_count_parameters_trainable_only_skips_frozen_tensors() -> None:
    model = create_model("small_cnn", 10)
    total = count_parameters(model)
    model.head.fc.weight.requires_grad_(False)
    assert count_parameters(model, trainable_only=True) == total - 4 * 32 * 10
    assert count_parameters(model) == total


def test_alexnet_layers_carry_caffe_names() -> None:
    keys = set(meta_model("alexnet").state_dict())
    expected = {f"conv{i}.{kind}" for i in range(1, 6) for kind in ("weight", "bias")}
    expected |= {f"fc{i}.{kind}" for i in range(6, 9) for kind in ("weight", "bias")}
    assert keys == expected


def test_alexnet_uses_caffe_lrn_and_groups() -> None:
    model = meta_model("alexnet")
    children = dict(model.named_children())
    norms = {name: m for name, m in children.items() if isinstance(m, nn.LocalResponseNorm)}
    assert sorted(norms) == ["norm1", "norm2"]
    for norm in norms.values():
        assert (norm.size, norm.alpha, norm.beta, norm.k) == (5, 1e-4, 0.75, 1.0)
    names = list(children)
    assert names.index("norm1") == names.index("relu1") + 1  # bvlc order: relu, LRN, pool
    assert names.index("pool1") == names.index("norm1") + 1
    groups = {f"conv{i}": children[f"conv{i}"].groups for i in range(1, 6)}
    assert groups == {"conv1": 1, "conv2": 2, "conv3": 1, "conv4": 2, "conv5": 2}
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())


def test_alexnet_bn_has_batchnorm_exactly_before_conv2_to_conv5() -> None:
    model = meta_model("alexnet_bn")
    children = list(model.named_children())
    followed_by_bn = [
        children[i + 1][0]
        for i, (_, module) in enumerate(children[:-1])
        if isinstance(module, nn.BatchNorm2d)
    ]
    assert followed_by_bn == ["conv2", "conv3", "conv4", "conv5"]
    assert sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()) == 4
    preceding = {children[i + 1][0]: children[i][0] for i in range(len(children) - 1)}
    assert [preceding[f"bn{i}"] for i in range(2, 6)] == ["pool1", "pool2", "relu3", "relu4"]
    for name in ("bn2", "bn3", "bn4", "bn5"):
        bn = getattr(model, name)
        assert (bn.eps, bn.momentum, bn.affine) == (1e-4, 0.1, False)
        assert bn.track_running_stats
    assert not any(isinstance(m, nn.LocalResponseNorm) for m in model.modules())
    assert model_spec("alexnet_bn").options["bn_affine"] is False
    assert all(
        getattr(meta_model("alexnet_bn", bn_affine=True), f"bn{i}").affine for i in range(2, 6)
    )


def test_alexnet_feature_map_sizes_at_227_are_caffes() -> None:
    model = meta_model("alexnet_bn")
    x = torch.empty(1, 3, 227, 227, device="meta")
    sizes = {}
    for name, module in model.named_children():
        x = module(x)
        sizes[name] = tuple(x.shape[1:])
    assert sizes["conv1"] == (96, 55, 55)
    assert sizes["pool1"] == (96, 27, 27)
    assert sizes["pool2"] == (256, 13, 13)
    assert sizes["conv5"] == (256, 13, 13)
    assert sizes["pool5"] == (256, 6, 6)
    assert sizes["fc8"] == (1000,)


def test_alexnet_rejects_inputs_below_its_minimum_size() -> None:
    model = meta_model("alexnet", 10).eval()
    assert model(torch.empty(1, 3, 39, 39, device="meta")).shape == (1, 10)
    with pytest.raises(ValueError, match="at least 39x39"):
        model(torch.empty(1, 3, 38, 64, device="meta"))


def test_alexnet_caffe_init_fillers() -> None:
    model = shared_model("alexnet")
    assert model.conv1.weight.std().item() == pytest.approx(0.01, rel=0.02)
    assert model.fc6.weight.std().item() == pytest.approx(0.005, rel=0.01)
    assert model.fc8.weight.std().item() == pytest.approx(0.01, rel=0.05)
    assert torch.all(model.conv2.bias == 0.1) and torch.all(model.conv1.bias == 0.0)
    torch_init = create_model("alexnet", 10, init="torch")
    # PyTorch's Kaiming-uniform(a=sqrt(5)) gives std 1/sqrt(3 * fan_in) = 1/sqrt(3 * 363).
    assert torch_init.conv1.weight.std().item() == pytest.approx((3 * 363) ** -0.5, rel=0.03)


def test_caffe_alexnet_scales_normalised_input_to_caffe_pixel_units() -> None:
    """Caffe's fillers were made for mean-subtracted 0-255 pixels (std ~58); the model rescales
    unit-std input by 255 x ImageNet's mean channel std, and Kaiming init keeps scale 1."""
    from bigbatch.models.alexnet import CAFFE_INPUT_SCALE

    assert CAFFE_INPUT_SCALE == pytest.approx(57.63, abs=0.01)
    assert create_model("alexnet", 10).input_scale == CAFFE_INPUT_SCALE
    assert create_model("alexnet_bn", 10).input_scale == CAFFE_INPUT_SCALE
    assert create_model("alexnet", 10, init="torch").input_scale == 1.0
    torch.manual_seed(0)
    scaled = create_model("alexnet", 10, dropout=0.0).eval()
    torch.manual_seed(0)
    unscaled = create_model("alexnet", 10, dropout=0.0, input_scale=1.0).eval()
    images = torch.randn(2, 3, 67, 67)
    with torch.no_grad():
        torch.testing.assert_close(scaled(images), unscaled(images * CAFFE_INPUT_SCALE))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan"), "58", True])
def test_alexnet_rejects_a_bad_input_scale(bad: object) -> None:
    with pytest.raises(ValueError, match="input_scale must be a positive number"):
        create_model("alexnet", 10, input_scale=bad)


def test_resnet_in_channels_replaces_only_the_stem() -> None:
    with torch.device("meta"):
        gray = create_model("resnet50", 10, in_channels=1)
        rgb = create_model("resnet50", 10, in_channels=3)
    assert gray.conv1.weight.shape == (64, 1, 7, 7)
    assert rgb.conv1.weight.shape == (64, 3, 7, 7)
    assert gray.fc.out_features == 10
    assert count_parameters(rgb) - count_parameters(gray) == 64 * 2 * 7 * 7


@pytest.mark.parametrize(("name", "last_bn"), [("resnet50", "bn3"), ("resnet18", "bn2")])
def test_zero_init_residual_zeroes_the_last_bn_gamma_of_each_block(name: str, last_bn: str) -> None:
    def last_gammas(model: nn.Module) -> list[torch.Tensor]:
        blocks = [
            b for layer in ("layer1", "layer2", "layer3", "layer4") for b in getattr(model, layer)
        ]
        return [getattr(block, last_bn).weight for block in blocks]

    zeroed = create_model(name, 10, zero_init_residual=True)
    default = create_model(name, 10)
    assert len(last_gammas(zeroed)) == (16 if name == "resnet50" else 8)
    assert all(torch.all(g == 0) for g in last_gammas(zeroed))
    assert all(torch.all(g == 1) for g in last_gammas(default))
    assert torch.all(zeroed.layer1[0].bn1.weight == 1)  # only the last BN of a block


@pytest.mark.parametrize("name", DROPOUT_MODELS)
def test_dropout_option_changes_train_mode_outputs(name: str) -> None:
    size = TEST_IMAGE_SIZE[name]
    images = torch.randn(4, 3, size, size)
    with_dropout = shared_model(name, dropout=0.5)
    without = shared_model(name, dropout=0.0)
    with_dropout.train()
    without.train()
    assert not torch.equal(with_dropout(images), with_dropout(images))
    assert torch.equal(without(images), without(images))
    with_dropout.eval()
    with torch.no_grad():
        assert torch.equal(with_dropout(images), with_dropout(images))


def test_small_resnet_options_shape_the_network() -> None:
    base = create_model("small_resnet", 10, in_channels=1)
    narrow = create_model("small_resnet", 10, in_channels=1, width=16)
    deep = create_model("small_resnet", 10, in_channels=1, blocks_per_stage=2)
    assert base.head.fc.in_features == 128 and narrow.head.fc.in_features == 64
    assert [len(s) for s in (deep.stage1, deep.stage2, deep.stage3)] == [2, 2, 2]
    assert count_parameters(narrow) < count_parameters(base) < count_parameters(deep)
    with pytest.raises(ValueError, match="width"):
        create_model("small_resnet", 10, width=0)


def test_small_nets_are_cheaper_than_the_budget() -> None:
    # Budget: a CPU epoch of Fashion-MNIST in seconds; small_cnn is the cheaper baseline.
    resnet_macs = forward_macs(create_model("small_resnet", 10, in_channels=1), (1, 28, 28))
    cnn_macs = forward_macs(create_model("small_cnn", 10, in_channels=1), (1, 28, 28))
    assert 8e6 < resnet_macs < 12e6
    assert cnn_macs < resnet_macs / 3


def test_forward_flops_of_resnet50_is_4_09_giga_macs_times_two() -> None:
    flops = forward_flops(meta_model("resnet50"), (3, 224, 224))
    assert flops == pytest.approx(2 * 4.09e9, rel=0.02)


def test_forward_macs_of_alexnet_counts_grouped_convs_exactly() -> None:
    # Hand count at 227: conv1 55^2*96*363, conv2 27^2*256*(48*25), conv3 13^2*384*2304,
    # conv4 13^2*384*(192*9), conv5 13^2*256*(192*9), fc6 9216*4096, fc7 4096^2, fc8 4096*1000.
    expected = (
        55**2 * 96 * 363
        + 27**2 * 256 * 48 * 25
        + 13**2 * 384 * 256 * 9
        + 13**2 * 384 * 192 * 9
        + 13**2 * 256 * 192 * 9
        + 9216 * 4096
        + 4096 * 4096
        + 4096 * 1000
    )
    assert expected == 724_406_816
    assert forward_macs(meta_model("alexnet"), (3, 227, 227)) == expected
    assert forward_flops(meta_model("alexnet_bn"), (3, 227, 227)) == 2 * expected


def test_forward_flops_leaves_a_real_model_untouched() -> None:
    model = create_model("small_resnet", 10, in_channels=1).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flops = forward_flops(model, (1, 28, 28))
    assert flops == 2 * forward_macs(model, (1, 28, 28)) > 0
    assert model.training and all(m.training for m in model.modules())
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # BN stats not updated
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert not model._forward_hooks and not model.stem[0]._forward_hooks


def test_models_command_lists_every_model_with_its_options(capsys) -> None:
    from bigbatch.commands import main

    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.split()[0] for line in lines if not line.startswith(" ")]
    assert names == model_names() + ["timm:NAME", "torchvision:NAME"]
    alexnet_options = lines[names.index("alexnet") * 2 + 1]
    assert "model.options" in alexnet_options
    assert "init=caffe" in alexnet_options and "input_scale=auto" in alexnet_options
