"""Optimizers and LR schedules: LARS (Algorithm 1 of the LARS paper), LAMB (Algorithm 2 of the LAMB
paper), groups, schedules."""

from __future__ import annotations

import torch
from torch import nn

from bigbatch.optim.groups import parameter_groups
from bigbatch.optim.lamb import LAMB
from bigbatch.optim.lars import LARS, trust_ratio
from bigbatch.optim.schedule import LRSchedule, scale_lr

OPTIMIZERS = ("lars", "lamb", "sgd")

__all__ = ["LAMB", "LARS", "LRSchedule", "OPTIMIZERS", "build_optimizer", "parameter_groups",
           "scale_lr", "trust_ratio"]


def build_optimizer(
    model: nn.Module,
    name: str,
    lr: float,
    *,
    momentum: float = 0.9,
    weight_decay: float = 5e-4,
    trust_coefficient: float = 0.001,
    eps: float = 0.0,
    clip: bool = False,
    nesterov: bool = False,
    exclude_bn_and_bias: bool = True,
    fused_compile: bool = False,
) -> torch.optim.Optimizer:
    """The optimizer ``name`` ("lars", "lamb" or "sgd") over :func:`parameter_groups` of ``model``.

    Both get the same groups, so with ``exclude_bn_and_bias`` the BN/bias group has no weight
    decay under SGD too. "sgd" is ``torch.optim.SGD(foreach=True)`` (LR outside the momentum
    buffer, PyTorch style; trust_coefficient, eps and clip do not apply). ``lr`` is the initial
    LR: the training loop sets ``group["lr"]`` from the schedule every step. ``fused_compile``
    runs the LARS update through torch.compile (faster per step, a one-off compile first).
    "lamb" is :class:`LAMB` with β₁ = ``momentum`` and ε = ``eps`` (0, LARS's default, means
    LAMB's 1e-6); trust_coefficient, clip, nesterov and fused_compile do not apply.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer '{name}'; choose one of: " + ", ".join(OPTIMIZERS))
    groups = parameter_groups(model, weight_decay, exclude_bn_and_bias)
    if name == "lars":
        return LARS(groups, lr, momentum=momentum, weight_decay=weight_decay,
                    trust_coefficient=trust_coefficient, eps=eps, clip=clip, nesterov=nesterov,
                    fused_compile=fused_compile)
    if name == "lamb":
        return LAMB(groups, lr, betas=(momentum, 0.999), eps=eps or 1e-6,
                    weight_decay=weight_decay)
    return torch.optim.SGD(groups, lr=lr, momentum=momentum, weight_decay=weight_decay,
                           nesterov=nesterov, foreach=True)
