"""Learning-rate schedules as pure functions of the global step, and batch-size LR scaling.

The schedule of Algorithm 1 of the LARS paper (You, Gitman, Ginsburg, "Large Batch Training of
Convolutional Networks", 2017) with warmup: a linear warmup from ``warmup_start_lr`` to the peak
γ0, then polynomial decay γ_t = γ0·(1 − t/T)^2. Being a pure function of the step, the schedule
needs nothing but the step to resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SCHEDULE_KINDS = ("poly", "cosine", "step", "constant")
SCALING_RULES = ("linear", "sqrt", "none")


@dataclass(frozen=True)
class LRSchedule:
    """Global LR at each step: linear warmup, then ``kind`` decay.

    Warmup: ``warmup_start_lr + (base_lr − warmup_start_lr)·step/warmup_steps`` for
    step < warmup_steps, reaching ``base_lr`` at ``warmup_steps``. After it, with
    t = step − warmup_steps and T = total_steps − warmup_steps (t/T clamped to [0, 1]):

    - ``poly``: end_lr + (base_lr − end_lr)·(1 − t/T)^power (the paper: power 2, end_lr 0)
    - ``cosine``: end_lr + (base_lr − end_lr)·(1 + cos(π·t/T))/2
    - ``step``: base_lr·gamma^k, k = number of ``milestones`` (global steps) <= step
    - ``constant``: base_lr

    Steps >= total_steps give end_lr for poly and cosine.
    """

    base_lr: float
    total_steps: int
    warmup_steps: int = 0
    warmup_start_lr: float = 0.0
    kind: str = "poly"
    end_lr: float = 0.0
    power: float = 2.0
    milestones: tuple[int, ...] = ()
    gamma: float = 0.1

    def __post_init__(self) -> None:
        # YAML hands over lists; the dataclass is frozen and hashable, so store a tuple.
        object.__setattr__(self, "milestones", tuple(self.milestones))
        for problem in _schedule_problems(self):
            raise ValueError(problem)

    def lr(self, step: int) -> float:
        """The global LR at global step ``step`` (0-based)."""
        if step < 0:
            raise ValueError(f"LRSchedule.lr: step must be >= 0, got {step}")
        if step < self.warmup_steps:
            return self.warmup_start_lr + (self.base_lr - self.warmup_start_lr) * (
                step / self.warmup_steps)
        if self.kind == "constant":
            return self.base_lr
        if self.kind == "step":
            return self.base_lr * self.gamma ** sum(1 for m in self.milestones if m <= step)
        progress = self._decay_progress(step)
        if self.kind == "poly":
            return self.end_lr + (self.base_lr - self.end_lr) * (1.0 - progress) ** self.power
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.end_lr + (self.base_lr - self.end_lr) * cosine

    def _decay_progress(self, step: int) -> float:
        """t/T in [0, 1]; a schedule that is all warmup is fully decayed at its end."""
        decay_steps = self.total_steps - self.warmup_steps
        if decay_steps <= 0:
            return 1.0
        return min(1.0, (step - self.warmup_steps) / decay_steps)


def _schedule_problems(s: LRSchedule) -> list[str]:
    """One-line messages, each naming the field and what to change; empty when valid."""
    problems = []
    if s.kind not in SCHEDULE_KINDS:
        problems.append(f"schedule kind '{s.kind}' is unknown; choose one of: "
                        + ", ".join(SCHEDULE_KINDS))
    for name in ("base_lr", "warmup_start_lr", "end_lr"):
        value = getattr(s, name)
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            problems.append(f"schedule {name} must be a finite number >= 0, got {value!r}")
    if not (isinstance(s.total_steps, int) and s.total_steps >= 1):
        problems.append(f"schedule total_steps must be an integer >= 1, got {s.total_steps!r}")
    if not (isinstance(s.warmup_steps, int) and s.warmup_steps >= 0):
        problems.append(f"schedule warmup_steps must be an integer >= 0, got {s.warmup_steps!r}")
    elif isinstance(s.total_steps, int) and s.warmup_steps > s.total_steps:
        problems.append(f"schedule warmup_steps ({s.warmup_steps}) exceeds total_steps "
                        f"({s.total_steps}); shorten the warmup or train longer")
    if not s.power > 0:
        problems.append(f"schedule power must be > 0, got {s.power!r}")
    if not s.gamma > 0:
        problems.append(f"schedule gamma must be > 0, got {s.gamma!r}")
    if any(not isinstance(m, int) or m < 0 for m in s.milestones):
        problems.append(f"schedule milestones must be integer steps >= 0, got {s.milestones!r}")
    elif list(s.milestones) != sorted(s.milestones):
        problems.append(f"schedule milestones must be in increasing order, got {s.milestones!r}")
    return problems


def scale_lr(base_lr: float, batch: int, reference_batch: int, rule: str) -> float:
    """LR for ``batch`` given ``base_lr`` tuned at ``reference_batch``.

    ``linear``: base_lr·batch/reference_batch (Goyal et al. 2017); ``sqrt``:
    base_lr·sqrt(batch/reference_batch) (Krizhevsky 2014, the variance-preserving rule);
    ``none``: base_lr unchanged.
    """
    if rule not in SCALING_RULES:
        raise ValueError(f"LR scaling rule '{rule}' is unknown; choose one of: "
                         + ", ".join(SCALING_RULES))
    if batch <= 0 or reference_batch <= 0:
        raise ValueError(f"batch ({batch}) and reference_batch ({reference_batch}) must be > 0")
    if rule == "linear":
        return base_lr * batch / reference_batch
    if rule == "sqrt":
        return base_lr * math.sqrt(batch / reference_batch)
    return base_lr
