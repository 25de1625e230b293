"""Training: the loop (trainer), resume policy, non-finite handling, the run's record, and the
per-step pieces the loop calls (reduction, BatchNorm statistics, timing, preemption, and the
fault hook that BIGBATCH_FAULT arms, faults.py).

``train``, ``Trainer``, ``Preempted`` and ``NonFiniteLoss`` are imported on first use, so that
the light modules here (preemption) can be used without importing torch.
"""

from __future__ import annotations

from importlib import import_module

_LAZY = {"train": "trainer", "Trainer": "trainer", "Preempted": "trainer",
         "NonFiniteLoss": "nonfinite"}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'bigbatch.train' has no attribute {name!r}")
    return getattr(import_module(f"bigbatch.train.{_LAZY[name]}"), name)
