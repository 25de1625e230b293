"""Optimizers and LR schedules: LARS (Algorithm 1 of the LARS paper), LAMB (Algorithm 2 of the LAMB
paper), groups, schedules."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from bigbatch.optim.base import keyword_defaults
from bigbatch.optim.groups import parameter_groups
from bigbatch.optim.lamb import LAMB
from bigbatch.optim.lars import LARS, trust_ratio
from bigbatch.optim.schedule import LRSchedule, scale_lr

OPTIMIZERS = ("lars", "lamb", "sgd")

__all__ = ["LAMB", "LARS", "LRSchedule", "OPTIMIZERS", "build_optimizer", "parameter_groups",
           "scale_lr", "trust_ratio"]


def build_optimizer(model: nn.Module, name: str, lr: float, *, exclude_bn_and_bias: bool = True,
                    **options: Any) -> torch.optim.Optimizer:
    """The optimizer ``name`` ("lars", "lamb" or "sgd") over :func:`parameter_groups` of ``model``.

    ``options`` are LARS's keyword arguments (momentum, weight_decay, trust_coefficient, eps,
    clip, nesterov, fused_compile, bucket_bytes); those not given take LARS's defaults, whichever
    the optimizer. Both get the same groups, so with ``exclude_bn_and_bias`` the BN/bias group
    has no weight decay under SGD too. "sgd" is ``torch.optim.SGD(foreach=True)`` (LR outside
    the momentum buffer, PyTorch style; trust_coefficient, eps and clip do not apply). ``lr`` is
    the initial LR: the training loop sets ``group["lr"]`` from the schedule every step.
    ``fused_compile`` runs the LARS or LAMB update through torch.compile (faster per step on a
    GPU, a one-off compile first). "lamb" is :class:`LAMB` with β₁ = ``momentum``, LAMB's β₂, and
    ε = ``eps`` (0, LARS's default, means LAMB's); trust_coefficient, clip and nesterov do not
    apply.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer '{name}'; choose one of: " + ", ".join(OPTIMIZERS))
    o = keyword_defaults(LARS)
    unknown = sorted(set(options) - set(o))
    if unknown:
        raise TypeError("build_optimizer got options LARS does not take: " + ", ".join(unknown))
    o.update(options, lr=lr)
    groups = parameter_groups(model, o["weight_decay"], exclude_bn_and_bias)
    if name == "lars":
        return LARS(groups, **o)
    if name == "lamb":
        lamb = keyword_defaults(LAMB)
        return LAMB(groups, lr, betas=(o["momentum"], lamb["betas"][1]),
                    eps=o["eps"] or lamb["eps"], weight_decay=o["weight_decay"],
                    fused_compile=o["fused_compile"])
    return torch.optim.SGD(groups, lr=lr, momentum=o["momentum"], weight_decay=o["weight_decay"],
                           nesterov=o["nesterov"], foreach=True)
