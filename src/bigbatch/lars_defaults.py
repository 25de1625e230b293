"""LARS's hyperparameter defaults, written once.

Both :class:`bigbatch.optim.LARS`'s signature and the run config (``bigbatch.config.OptimConfig``)
take their defaults from here; this module imports no torch, so reading a config stays light.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LarsDefaults:
    lr: float = 1.0
    momentum: float = 0.9
    weight_decay: float = 5e-4
    trust_coefficient: float = 0.001  # η, fixed for every batch size as in the LARS paper
    eps: float = 0.0
    clip: bool = False
    nesterov: bool = False
    fused_compile: bool = False


LARS_DEFAULTS = LarsDefaults()
