"""timm:NAME and torchvision:NAME models: built by their libraries, options passed through,
trained end to end, and the LARS / weight-decay exclusion rule on their parameters."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from launch import run_bigbatch, summary
from torch import nn

from bigbatch.config import resolve_config
from bigbatch.errors import ConfigError
from bigbatch.models import create_model, default_image_size, model_spec
from bigbatch.optim import parameter_groups
from bigbatch.optim.groups import excluded_parameters

timm = pytest.importorskip("timm")

TINY_VIT = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)


def test_factories_get_classes_channels_and_options() -> None:
    vit = create_model("timm:vit_tiny_patch16_224", 7, 1, **TINY_VIT)
    assert vit.patch_embed.proj.in_channels == 1 and vit.head.out_features == 7
    assert vit.patch_embed.img_size == (32, 32) and len(vit.blocks) == 2
    assert vit(torch.zeros(2, 1, 32, 32)).shape == (2, 7)
    resnet = create_model("torchvision:resnet18", 5, 1)
    assert resnet.conv1.in_channels == 1 and resnet.fc.out_features == 5
    assert resnet(torch.zeros(2, 1, 32, 32)).shape == (2, 5)
    zeroed = create_model("torchvision:resnet18", 3, zero_init_residual=True)
    assert not zeroed.layer1[0].bn2.weight.any() and resnet.layer1[0].bn2.weight.all()
    assert default_image_size("timm:vit_tiny_patch16_224", TINY_VIT) == 32
    assert default_image_size("timm:vit_small_patch16_224") == 224
    assert model_spec("torchvision:inception_v3").default_image_size == 299


@pytest.mark.parametrize(("name", "options", "message"), [
    ("timm:no_such_net", {}, "unknown timm model 'no_such_net'"),
    ("torchvision:no_such_net", {}, "unknown torchvision classification model 'no_such_net'"),
    ("torchvision:resnet18", {"colour": 1}, "does not accept the options ['colour']"),
    ("keras:resnet50", {}, "timm:NAME / torchvision:NAME"),
])
def test_bad_names_and_options_are_one_clear_line(name, options, message) -> None:
    with pytest.raises(ValueError) as error:
        create_model(name, 10, **options)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_vision_transformers_are_built_for_the_data_image_size() -> None:
    """A ViT gets the data's side as its input size; patches that do not tile it, or an input
    size set to another side, are one line saying what to set; CNNs take any size."""
    small = dict(embed_dim=32, depth=1, num_heads=2)
    vit = create_model("timm:vit_tiny_patch16_224", 10, 1, image_size=64, **small)
    assert vit.patch_embed.img_size == (64, 64) and vit(torch.zeros(1, 1, 64, 64)).shape == (1, 10)
    fine = create_model("timm:vit_tiny_patch16_224", 10, 1, image_size=28, patch_size=7, **small)
    assert fine(torch.zeros(1, 1, 28, 28)).shape == (1, 10)
    with pytest.raises(ValueError, match=r"^timm:vit_tiny_patch16_224 cuts images into 16-pixel "
                       r"patches, which do not tile the data's 28-pixel images: set "
                       r"model.options.patch_size to a divisor of 28 \(2, 4, 7, 14\) or resize"):
        create_model("timm:vit_tiny_patch16_224", 10, 1, image_size=28, **small)
    with pytest.raises(ValueError, match=r"^timm:vit_tiny_patch16_224 is built for 32-pixel "
                       r"images but the data's are 64 pixels"):
        create_model("timm:vit_tiny_patch16_224", 10, 1, image_size=64, img_size=32, **small)
    tv_vit = create_model("torchvision:vit_b_16", 3, image_size=32)
    assert tv_vit.image_size == 32 and tv_vit(torch.zeros(1, 3, 32, 32)).shape == (1, 3)
    cnn = create_model("timm:resnet10t", 4, 1, image_size=28)
    assert cnn(torch.zeros(2, 1, 28, 28)).shape == (2, 4)


def test_config_validation_accepts_and_rejects_names(monkeypatch) -> None:
    for name in ("timm:resnet50d", "timm:vit_small_patch16_224", "torchvision:resnet101"):
        assert resolve_config(overrides=[f"model.name={name}"]).model.name == name
    with pytest.raises(ConfigError, match="'model.name': unknown timm model 'resnet5000'"):
        resolve_config(overrides=["model.name=timm:resnet5000"])
    monkeypatch.setitem(sys.modules, "timm", None)  # as if timm were not installed
    with pytest.raises(ConfigError, match="timm models need timm: pip install timm"):
        resolve_config(overrides=["model.name=timm:resnet50d"])


def test_vit_groups_exclude_norms_biases_position_embedding_and_class_token() -> None:
    vit = create_model("timm:vit_tiny_patch16_224", 10, **TINY_VIT)
    adapted, excluded = parameter_groups(vit, 5e-4)
    assert (adapted["lars"], excluded["lars"], excluded["weight_decay"]) == (True, False, 0.0)
    norms = [f"{path}.{leaf}" for path, module in vit.named_modules()
             if isinstance(module, nn.LayerNorm) for leaf in ("weight", "bias")]
    assert len(norms) == 2 * (2 * 2 + 1)  # norm1, norm2 per block and the final norm
    assert set(norms) | {"pos_embed", "cls_token"} <= set(excluded["names"])
    assert all(name.endswith("bias") or name in norms or name in ("pos_embed", "cls_token")
               for name in excluded["names"])
    assert set(adapted["names"]) == {name for name, p in vit.named_parameters()
                                     if name.endswith("weight") and name not in norms}
    assert len(parameter_groups(vit, 5e-4, exclude_bn_and_bias=False)) == 1


class RmsNorm(nn.Module):
    """A normalisation layer torch does not know, with a 2-D scale (rule 2 by class name)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1, channels))


class Exempting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.zeros(4, 4))
        self.kept = nn.Parameter(torch.zeros(4, 4))

    def no_weight_decay(self) -> set[str]:
        return {"table"}


def test_rule_recognises_every_normalisation_layer_bias_and_declared_name() -> None:
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), nn.GroupNorm(2, 4),
        nn.InstanceNorm2d(4, affine=True), nn.SyncBatchNorm(4), nn.LayerNorm([4, 2]),
        nn.RMSNorm([4, 2]), RmsNorm(4), timm.layers.LayerNorm2d(4), nn.Linear(4, 4),
        Exempting(),
    )
    expected = {"1.weight", "1.bias", "2.weight", "2.bias", "3.weight", "3.bias", "4.weight",
                "4.bias", "5.weight", "5.bias", "6.weight", "7.scale", "8.weight", "8.bias",
                "9.bias", "10.table"}
    assert excluded_parameters(model) == expected
    adapted = parameter_groups(model, 1e-4)[0]["names"]
    assert adapted == ["0.weight", "9.weight", "10.kept"]


@pytest.mark.slow
@pytest.mark.parametrize(("model", "options"), [
    ("timm:resnet10t", []),
    ("timm:vit_tiny_patch16_224", [f"model.options.{k}={v}" for k, v in TINY_VIT.items()]),
    ("torchvision:resnet18", ["data.image_size=32"]),
    ("timm:vit_tiny_patch16_224", ["data.image_size=64", "model.options.embed_dim=32",
                                   "model.options.depth=1", "model.options.num_heads=2"]),
])
def test_trains_two_steps_on_synthetic_data(tmp_path, model, options) -> None:
    out = tmp_path / "run"
    sets = [arg for option in options + ["data.synthetic_examples=16",
                                         "data.synthetic_classes=5", "eval_every=100",
                                         "precision=fp32", "threads=1"]
            for arg in ("--set", option)]
    if model == "timm:resnet10t":
        sets += ["--set", "data.image_size=32"]
    run_bigbatch(["train", "--dataset", "synthetic", "--model", model, "--batch-size", "8",
                  "--micro-batch", "4", "--epochs", "1", "--warmup-epochs", "0", "--lr", "0.1",
                  *sets, "--out", str(out)])
    result = summary(out)
    assert result["steps"] == 2 and result["model"] == model
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()
              if '"lr"' in line]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)


def test_models_command_says_how_to_name_them() -> None:
    listing = subprocess.run([sys.executable, "-m", "bigbatch", "models"], capture_output=True,
                             text=True, check=True).stdout
    assert "timm:NAME" in listing and "timm.create_model" in listing
    assert "torchvision:NAME" in listing and "torchvision.models.get_model" in listing
