"""Models built by timm's or torchvision's own factory: ``timm:NAME`` and ``torchvision:NAME``.

``timm:resnet50d`` is ``timm.create_model("resnet50d", num_classes=..., in_chans=...,
**options)``; ``torchvision:resnet101`` is ``torchvision.models.get_model("resnet101",
num_classes=..., **options)``, whose first 3-channel convolution is replaced by one with the
data set's channel count when that is not 3 (torchvision has no such argument). Options come
from ``--set model.options.KEY=VALUE`` and go to the factory unchanged; no pretrained weights
are loaded unless an option asks for them. timm is optional (``pip install timm``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import nn

LIBRARIES = ("timm", "torchvision")
DEFAULT_IMAGE_SIZE = 224
HELP = (
    ("timm:NAME", "any timm model, built by timm.create_model (pip install timm), e.g. "
     "timm:resnet50d, timm:vit_small_patch16_224; --set model.options.KEY=VALUE goes to it"),
    ("torchvision:NAME", "any torchvision classification model, built by "
     "torchvision.models.get_model, e.g. torchvision:resnet101; options go to it"),
)


def split_name(name: str) -> tuple[str, str] | None:
    """(library, model) of ``library:model`` for a supported library, else None."""
    library, colon, model = name.partition(":")
    if not colon or library not in LIBRARIES:
        return None
    return library, model


def _timm():
    try:
        import timm
    except ImportError:
        raise ValueError("timm models need timm: pip install timm") from None
    return timm


def check_name(name: str) -> None:
    """ValueError with one line saying what to change if ``name`` names no model."""
    library, model = split_name(name) or (None, None)
    if library == "timm":
        if not _timm().is_model(model):
            raise ValueError(f"unknown timm model {model!r}; list them with "
                             f"python -c \"import timm; print(timm.list_models('*{model[:8]}*'))\"")
    elif library == "torchvision":
        from torchvision import models

        if model not in models.list_models(module=models):
            raise ValueError(f"unknown torchvision classification model {model!r}; list them "
                             "with python -c \"import torchvision; "
                             "print(torchvision.models.list_models())\"")


def default_image_size(name: str, options: dict[str, Any] | None = None) -> int:
    """The input side the model expects: an ``img_size`` option, else timm's pretrained
    config or torchvision's default weights' crop size, else 224."""
    options = options or {}
    if isinstance(options.get("img_size"), int):
        return options["img_size"]
    library, model = split_name(name) or (None, None)
    try:
        if library == "timm":
            return int(_timm().get_pretrained_cfg(model).input_size[-1])
        if library == "torchvision":
            from torchvision import models

            return int(models.get_model_weights(model).DEFAULT.transforms().crop_size[0])
    except (AttributeError, ValueError, KeyError, TypeError, IndexError):
        pass
    return DEFAULT_IMAGE_SIZE


def create(name: str, num_classes: int, in_channels: int = 3, image_size: int | None = None,
           **options: Any) -> nn.Module:
    """Build ``library:model`` with its library's factory (see the module doc).

    ``image_size``: the side of the images the model will see. A factory that takes the input
    size (timm's ``img_size``, torchvision's ``image_size``: its ViTs) gets it unless an option
    sets it; a model whose patches do not tile it, or that is built for another size, is
    refused with one line saying what to set.
    """
    check_name(name)
    library, model = split_name(name)
    try:
        if (image_size is not None and SIZE_OPTIONS[library] not in options
                and image_size != default_image_size(name, options)):
            built = _build_for_size(library, model, num_classes, in_channels, image_size,
                                    options)
        else:
            built = _build(library, model, num_classes, in_channels, options)
    except TypeError as error:
        raise ValueError(f"{name} does not accept the options {sorted(options)}: {error}") from None
    if image_size is not None:
        check_input_size(name, built, image_size)
    return built


# The factories' keyword for the input side, where a model has one (vision transformers).
SIZE_OPTIONS = {"timm": "img_size", "torchvision": "image_size"}


def _build(library: str, model: str, num_classes: int, in_channels: int,
           options: dict[str, Any]) -> nn.Module:
    if library == "timm":
        return _timm().create_model(model, num_classes=num_classes, in_chans=in_channels,
                                    **options)
    from torchvision import models

    return with_input_channels(models.get_model(model, num_classes=num_classes, **options),
                               in_channels)


def _build_for_size(library: str, model: str, num_classes: int, in_channels: int,
                    image_size: int, options: dict[str, Any]) -> nn.Module:
    """The model with its library's size option set to ``image_size``, or without it where the
    factory does not take one (a convolutional network takes any size)."""
    key = SIZE_OPTIONS[library]
    try:
        return _build(library, model, num_classes, in_channels, {**options, key: image_size})
    except TypeError as error:
        if f"'{key}'" not in str(error):
            raise
    return _build(library, model, num_classes, in_channels, options)


def check_input_size(name: str, model: nn.Module, image_size: int) -> None:
    """ValueError (one line) if ``model`` cuts its input into patches that do not tile
    ``image_size`` (a strided patch embedding would drop the remainder unseen), or only takes
    inputs of another size."""
    patch, built = _patch_and_input_size(model)
    if patch and image_size % patch:
        divisors = [d for d in range(2, image_size // 2 + 1) if image_size % d == 0][-4:]
        raise ValueError(
            f"{name} cuts images into {patch}-pixel patches, which do not tile the data's "
            f"{image_size}-pixel images: set model.options.patch_size to a divisor of "
            f"{image_size} ({', '.join(map(str, divisors)) or 'none'}) or resize the images "
            f"(data.image_size, where the data set allows it) to a multiple of {patch}")
    if built and built != image_size:
        raise ValueError(f"{name} is built for {built}-pixel images but the data's are "
                         f"{image_size} pixels: leave model.options.img_size (image_size) "
                         f"unset or set it to {image_size}")


def _patch_and_input_size(model: nn.Module) -> tuple[int | None, int | None]:
    """(patch side, the one input side it takes) of a timm or torchvision ViT-like model;
    None for what it does not have (a CNN: neither)."""
    embed = getattr(model, "patch_embed", None)
    if embed is not None and getattr(embed, "patch_size", None):  # timm
        strict = getattr(embed, "strict_img_size", False)
        size = getattr(embed, "img_size", None) if strict else None
        return embed.patch_size[0], size[0] if size else None
    if isinstance(getattr(model, "patch_size", None), int):  # torchvision's VisionTransformer
        return model.patch_size, getattr(model, "image_size", None)
    return None, None


def with_input_channels(model: nn.Module, in_channels: int) -> nn.Module:
    """``model`` with its first 3-channel Conv2d rebuilt for ``in_channels`` inputs."""
    if in_channels == 3:
        return model
    for path, module in model.named_modules():
        if isinstance(module, nn.Conv2d) and module.in_channels == 3 and module.groups == 1:
            owner_path, _, attribute = path.rpartition(".")
            setattr(model.get_submodule(owner_path), attribute, _conv_like(module, in_channels))
            return model
    raise ValueError(f"{type(model).__name__} has no 3-channel first convolution to adapt to "
                     f"{in_channels} input channels")


def _conv_like(conv: nn.Conv2d, in_channels: int) -> nn.Conv2d:
    return nn.Conv2d(in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                     conv.padding, conv.dilation, 1, conv.bias is not None, conv.padding_mode)


def builder(name: str):
    """A registry builder ``(num_classes, in_channels, **options)`` for ``name``."""
    return partial(create, name)
