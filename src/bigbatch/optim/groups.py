"""Parameter groups: which tensors LARS adapts and decays.

MLPerf and most work after the paper exclude normalisation and bias tensors from both the
trust-ratio adaptation and weight decay (PaddlePaddle measured ResNet-50 at batch 8K going from
74.28% to 76.14% top-1 with the exclusion). Intel Caffe, the authors' release, applies LARS and
decay to every blob: ``exclude_bn_and_bias=False`` reproduces that.

The exclusion rule, for a trainable parameter with dotted name ``name`` owned directly by
module ``owner``; it is excluded when any of these holds:

1. it has at most one dimension: every bias, the scale and shift of every normalisation layer,
   per-channel scales such as timm's LayerScale ``gamma``;
2. ``owner`` is a normalisation layer: an instance of torch's BatchNorm (1d/2d/3d, lazy, Sync),
   InstanceNorm, LayerNorm, GroupNorm or RMSNorm, or of any class whose name ends in "Norm"
   (optionally followed by "1d"/"2d"/"3d"), such as timm's RmsNorm and LayerNorm2d;
3. its leaf name is "bias";
4. the model declares it exempt: a module that defines ``no_weight_decay()`` (timm's
   convention; a ViT returns {"pos_embed", "cls_token", ...}) exempts each returned name,
   relative to that module, and every parameter under a returned module name, or whose name
   ends in "." + a returned name.
"""

from __future__ import annotations

import re
from typing import Any

from torch import nn

NORM_LAYERS = (
    nn.modules.batchnorm._NormBase,  # BatchNorm*, SyncBatchNorm, InstanceNorm*, lazy variants
    nn.LayerNorm,
    nn.GroupNorm,
)
_NORM_CLASS_NAME = re.compile(r"norm(\dd)?$", re.IGNORECASE)


def is_norm_layer(module: nn.Module) -> bool:
    """Whether ``module`` is a normalisation layer (rule 2 of the module doc)."""
    return isinstance(module, NORM_LAYERS) or bool(
        _NORM_CLASS_NAME.search(type(module).__name__))


def declared_exempt(model: nn.Module) -> set[str]:
    """The names the model's modules return from ``no_weight_decay()``, as full dotted names
    (rule 4 of the module doc)."""
    names: set[str] = set()
    for path, module in model.named_modules():
        declare = getattr(module, "no_weight_decay", None)
        if callable(declare):
            names.update(f"{path}.{name}" if path else name for name in declare())
    return names


def _declared(name: str, exempt: set[str]) -> bool:
    return name in exempt or any(name.startswith(f"{entry}.") or name.endswith(f".{entry}")
                                 for entry in exempt)


def excluded_parameters(model: nn.Module) -> set[str]:
    """Dotted names of the parameters the exclusion rule (module doc) takes out of LARS
    adaptation and weight decay."""
    exempt = declared_exempt(model)
    excluded: set[str] = set()
    for path, owner in model.named_modules():
        norm = is_norm_layer(owner)
        for leaf, param in owner.named_parameters(recurse=False):
            name = f"{path}.{leaf}" if path else leaf
            if param.ndim <= 1 or norm or leaf == "bias" or _declared(name, exempt):
                excluded.add(name)
    return excluded


def parameter_groups(model: nn.Module, weight_decay: float,
                     exclude_bn_and_bias: bool = True) -> list[dict[str, Any]]:
    """Optimizer groups for ``model``'s trainable parameters, each with a ``"names"`` list.

    With exclusion, the tensors the exclusion rule (module doc) selects form a group
    ``{"lars": False, "weight_decay": 0.0}`` and the rest ``{"lars": True, "weight_decay": wd}``;
    without, one ``lars=True`` group with decay. Frozen parameters (requires_grad False) are left
    out; empty groups are dropped.
    """
    adapted: dict[str, Any] = {"params": [], "names": [], "lars": True,
                               "weight_decay": weight_decay}
    excluded: dict[str, Any] = {"params": [], "names": [], "lars": False, "weight_decay": 0.0}
    skip = excluded_parameters(model) if exclude_bn_and_bias else set()
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        group = excluded if name in skip else adapted
        group["params"].append(param)
        group["names"].append(name)
    return [group for group in (adapted, excluded) if group["params"]]
