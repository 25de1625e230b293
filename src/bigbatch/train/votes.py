"""What one global step's reduction over ranks gives every rank: the same numbers, so that every
rank takes the same decisions after the same step (both reductions, train/reduction.py and
train/fixed_point.py, return it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepVotes:
    """The step's reduction over ranks."""

    mean_loss: float
    examples: float
    nonfinite: bool
    stop_votes: float
    clock_votes: float
