"""Model registry: every model is data (a name, a builder, a default image size, a one-line
description) so that recipes, the CLI and the tests can enumerate and build them by name.

A builder has the signature ``builder(num_classes, in_channels, *, option=default, ...)``:
its keyword-only parameters *are* the model's options, and their defaults live only there.
``create_model`` always passes ``in_channels`` (default 3; pass 1 for Fashion-MNIST).

Names ``timm:NAME`` and ``torchvision:NAME`` are built by those libraries' factories
(models/external.py); their options are not declared here and go to the factory unchanged.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from torch import nn

from bigbatch.models import external
from bigbatch.models.alexnet import alexnet, alexnet_bn
from bigbatch.models.resnet import resnet18, resnet50
from bigbatch.models.small import small_cnn, small_resnet


def _keyword_only_defaults(builder: Callable[..., nn.Module]) -> Mapping[str, Any]:
    parameters = inspect.signature(builder).parameters.values()
    return MappingProxyType(
        {p.name: p.default for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}
    )


@dataclass(frozen=True)
class ModelSpec:
    """One registered model. ``options`` (derived from the builder's keyword-only parameters)
    maps each accepted option to its default."""

    name: str
    builder: Callable[..., nn.Module]
    default_image_size: int
    description: str
    options: Mapping[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", _keyword_only_defaults(self.builder))


_SPECS = (
    ModelSpec(
        "alexnet",
        alexnet,
        227,
        "AlexNet with LRN, Caffe bvlc_alexnet layout (grouped conv2/4/5), 61M parameters",
    ),
    ModelSpec(
        "alexnet_bn",
        alexnet_bn,
        227,
        "AlexNet-BN of the paper: LRN removed, BatchNorm (no affine) before conv2..conv5",
    ),
    ModelSpec("resnet18", resnet18, 224, "torchvision ResNet-18, 11.7M parameters"),
    ModelSpec("resnet50", resnet50, 224, "torchvision ResNet-50 (v1.5), 25.6M parameters"),
    ModelSpec(
        "small_cnn",
        small_cnn,
        28,
        "plain three-conv CNN for 28x28 images (Fashion-MNIST), about 2 M multiply-adds",
    ),
    ModelSpec(
        "small_resnet",
        small_resnet,
        28,
        "small ResNet (3 residual stages, widths w/2w/4w) for 28x28 images, ~10 M multiply-adds",
    ),
)

_REGISTRY: Mapping[str, ModelSpec] = MappingProxyType({spec.name: spec for spec in _SPECS})


def model_names() -> list[str]:
    """Names of all registered models, sorted."""
    return sorted(_REGISTRY)


def model_spec(name: str) -> ModelSpec:
    """The spec of ``name`` (registered, or timm:/torchvision:); ValueError saying what to
    change if there is none."""
    if external.split_name(name):
        external.check_name(name)
        return ModelSpec(name, external.builder(name), external.default_image_size(name),
                         f"built by {name.split(':')[0]}'s own factory")
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}; choose one of: {', '.join(model_names())}, or "
            "timm:NAME / torchvision:NAME"
        ) from None


def default_image_size(name: str, options: Mapping[str, Any] | None = None) -> int:
    """The input side of model ``name`` built with ``options`` (an img_size option of a
    timm model counts)."""
    if external.split_name(name):
        return external.default_image_size(name, dict(options or {}))
    return model_spec(name).default_image_size


def _option_type_error(model: str, option: str, value: Any, default: Any) -> str | None:
    """Why ``value`` cannot stand in for ``default`` (None when it can). Options arrive from
    YAML and ``--set``, so a wrong type should be named here, not deep inside a constructor."""
    expected = type(default)
    if expected is bool:
        ok = isinstance(value, bool)
    elif expected is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif expected is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif default is None:
        ok = True
    else:
        ok = isinstance(value, expected)
    if ok:
        return None
    return (
        f"option {option!r} of model {model!r} must be {expected.__name__}, "
        f"got {type(value).__name__} {value!r}"
    )


def _validated_options(spec: ModelSpec, options: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        valid = ", ".join(spec.options) or "none"
        raise ValueError(
            f"unknown option {unknown[0]!r} for model {spec.name!r}; valid options: {valid}"
        )
    for option, value in options.items():
        problem = _option_type_error(spec.name, option, value, spec.options[option])
        if problem:
            raise ValueError(problem)
    return {
        option: float(value) if isinstance(spec.options[option], float) else value
        for option, value in options.items()
    }


def create_model(name: str, num_classes: int, in_channels: int = 3, *,
                 image_size: int | None = None, **options: Any) -> nn.Module:
    """Build the registered model ``name`` for ``num_classes`` outputs and ``in_channels``
    input channels. ``options`` are the model's keyword options (see ``model_spec(name).options``);
    an unknown option or one of the wrong type raises ValueError naming it and the model.
    ``image_size``, the side of the images it will see, sizes a timm:/torchvision: vision
    transformer (bigbatch.models.external.create); the registered models take any size."""
    spec = model_spec(name)
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    if in_channels < 1:
        raise ValueError(f"in_channels must be >= 1, got {in_channels}")
    if external.split_name(name):
        return spec.builder(num_classes, in_channels, image_size, **options)
    return spec.builder(num_classes, in_channels, **_validated_options(spec, options))
