"""The sweep's learning-rate search: grids around a scaling rule, the best point, and when to
extend a grid at its edge."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from bigbatch.errors import ConfigError
from bigbatch.tools.sweep.series import SERIES, LRRule

# A run within this many points of chance top-1 failed to learn (collapsed), which for the grid
# decisions counts like divergence. Two points is far above the noise of a 10,000-image test set
# at chance (0.3 points) and far below anything that learned.
FAILED_MARGIN_POINTS = 2.0


# Every series' default rule (series.py).
DEFAULT_RULES = {name: series.rule for name, series in SERIES.items()}


def grid_lr(centre: float, factor: float, exponent: float) -> float:
    """The LR ``exponent`` grid steps from the centre; exponents are integers or half-integers."""
    return centre * factor**exponent


def initial_exponents(count: int) -> list[float]:
    """``count`` grid positions centred on 0, one factor apart: 3 -> [-1, 0, 1]; 2 -> [-.5, .5]."""
    return [k - (count - 1) / 2 for k in range(count)]


def best_exponent(results: dict[float, float | None]) -> float | None:
    """The grid position with the highest top-1; diverged runs (None/NaN) never win.

    Ties go to the smaller LR, the safer choice.
    """
    finite = {e: t for e, t in results.items() if t is not None and not math.isnan(t)}
    if not finite:
        return None
    return max(sorted(finite), key=lambda e: (finite[e], -e))


def edge_extension(results: dict[float, float | None], failed_below: float = -math.inf
                   ) -> float | None:
    """The grid position that would continue the grid past the edge holding the best LR, or None
    when the best is inside the grid.

    Best at the lowest LR: one factor below it; at the highest: one factor above. A run whose
    top-1 is below ``failed_below`` (chance level plus a margin) failed to learn, like a diverged
    one: a grid of nothing but failures says nothing about where the optimum is except that its
    LRs are too large (collapse at a large LR is the usual failure), so it grows downwards. A grid
    of one LR is its own edge on both sides; it grows upwards.
    """
    if not results:
        return None
    low, high = min(results), max(results)
    learned = {e: (t if t is not None and t >= failed_below else None)
               for e, t in results.items()}
    best = best_exponent(learned)
    if best is None:
        return low - 1
    if best == high:
        return high + 1
    if best == low:
        return low - 1
    return None


def next_extension(results: dict[float, float | None], extensions_done: int,
                   max_extensions: int, failed_below: float = -math.inf) -> float | None:
    """The grid position to run next (see :func:`edge_extension`), None when the best LR is
    inside the grid or the extension budget is spent."""
    if extensions_done >= max_extensions:
        return None
    return edge_extension(results, failed_below)




class AnchorPoint(Protocol):
    """What anchoring needs of a measured point (records.PointResult has it)."""

    batch: int
    best_lr: float | None


def anchored_rule(rule: LRRule, point: AnchorPoint) -> LRRule:
    """The rule re-centred on the best LR measured at the smallest batch.

    This is how the scaling rules are meant to be used (Goyal et al.: tune at the small batch,
    then scale): every larger batch's grid is centred on best_lr(B0) * scale(B / B0), with the
    optimizer's own scaling. If every LR of the anchor point diverged, the rule is kept.
    """
    if point.best_lr is None:
        return rule
    return LRRule(lr=point.best_lr, reference_batch=point.batch, scaling=rule.scaling)


SWEEP_OPTIMIZERS = tuple(SERIES)


@dataclass(frozen=True)
class SweepSettings:
    """Everything that defines a sweep; recorded in sweep.json."""

    batch_sizes: tuple[int, ...]
    optimizers: tuple[str, ...]
    epochs: float
    lrs_per_point: int = 3
    lr_grid_factor: float = 2.0
    max_extensions: int = 2
    warmup_epochs: float | None = None  # None: the recipe's
    micro_batch: int = 128  # capped at the global batch; also the BatchNorm batch
    recipe: str | None = None
    config_file: str | None = None
    overrides: tuple[str, ...] = ()
    rules: dict[str, LRRule] = field(default_factory=lambda: dict(DEFAULT_RULES))
    torchrun: int | None = None
    anchor: bool = True  # centre larger batches on the smallest batch's best LR, scaled by rule
    # Seeds: each point of seed_batches (every batch when empty) reruns its best LR with these
    # seeds; the grid itself runs on the config's seed.
    seeds: tuple[int, ...] = ()
    seed_batches: tuple[int, ...] = ()

    def check(self) -> SweepSettings:
        if not self.batch_sizes:
            raise ConfigError("--batch-sizes is empty; give a list such as 128,1024,8192")
        if any(b < 1 for b in self.batch_sizes):
            raise ConfigError(f"batch sizes must be positive, got {list(self.batch_sizes)}")
        if len(set(self.batch_sizes)) != len(self.batch_sizes):
            raise ConfigError(f"--batch-sizes repeats a value: {list(self.batch_sizes)}")
        if not self.optimizers:
            raise ConfigError("--optimizers is empty; choose from "
                              f"{', '.join(SWEEP_OPTIMIZERS)}")
        for name in self.optimizers:
            if name not in SWEEP_OPTIMIZERS:
                raise ConfigError(f"unknown optimizer '{name}' in --optimizers; choose from "
                                  f"{', '.join(SWEEP_OPTIMIZERS)}")
        if not (self.epochs > 0 and math.isfinite(self.epochs)):
            raise ConfigError(f"--epochs must be a positive number, got {self.epochs}")
        if self.lrs_per_point < 1:
            raise ConfigError(f"--lrs-per-point must be at least 1, got {self.lrs_per_point}")
        if not self.lr_grid_factor > 1:
            raise ConfigError(f"--lr-grid-factor must be above 1, got {self.lr_grid_factor}")
        if self.max_extensions < 0:
            raise ConfigError(f"--max-extensions must be 0 or more, got {self.max_extensions}")
        if self.micro_batch < 1:
            raise ConfigError(f"--micro-batch must be positive, got {self.micro_batch}")
        self._check_seeds()
        if self.torchrun is not None and self.torchrun < 1:
            raise ConfigError(f"--torchrun needs a positive number of processes, "
                              f"got {self.torchrun}")
        return self

    def _check_seeds(self) -> None:
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"--seeds repeats a value: {list(self.seeds)}")
        if self.seed_batches and not self.seeds:
            raise ConfigError("--seed-batches needs --seeds")
        unknown = [b for b in self.seed_batches if b not in self.batch_sizes]
        if unknown:
            raise ConfigError(f"--seed-batches {unknown} not in --batch-sizes "
                              f"{list(self.batch_sizes)}")

    def seeded(self, batch: int) -> bool:
        """Whether the point at ``batch`` reruns its best LR with --seeds."""
        return bool(self.seeds) and (not self.seed_batches or batch in self.seed_batches)

    def as_record(self) -> dict[str, Any]:
        record = asdict(self)
        record["rules"] = {name: asdict(rule) for name, rule in self.rules.items()}
        return record
