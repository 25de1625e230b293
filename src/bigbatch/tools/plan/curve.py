"""A device's step time as a function of its batch: t(b) = t0 + b / r_max.

t0 is what a step costs whatever its batch (the optimizer update, launching each layer,
synchronisation), 1 / r_max what each image adds. The throughput b / t(b) reaches half of r_max
at the half-throughput batch h = t0 r_max, which is the curve b / (b + h) of ``stats``. Fitted to
measured (batch, seconds) points by least squares on relative errors, so small batches, whose
steps are short, count as much as large ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from bigbatch.errors import ConfigError


@dataclass(frozen=True)
class StepCurve:
    fixed_s: float  # t0, seconds per step whatever the batch
    per_image_s: float  # 1 / r_max

    def step_seconds(self, batch: float) -> float:
        return self.fixed_s + batch * self.per_image_s

    def images_per_second(self, batch: float) -> float:
        return batch / self.step_seconds(batch)

    @property
    def half_batch(self) -> float:
        """h: the batch at which the device runs at half of its large-batch rate."""
        return self.fixed_s / self.per_image_s

    def as_dict(self) -> dict:
        return {
            "fixed_s": self.fixed_s,
            "per_image_s": self.per_image_s,
            "max_images_per_second": 1.0 / self.per_image_s,
            "half_batch": self.half_batch,
        }


def fit_step_time(points: Sequence[tuple[float, float]]) -> StepCurve:
    """t0 and 1/r_max minimising sum(((t0 + b c) - t) / t)^2 over (b, t) points, t0 >= 0."""
    if len({batch for batch, _ in points}) < 2:
        raise ConfigError("fitting a step-time curve needs at least two different batches")
    if any(not (batch > 0 and seconds > 0) for batch, seconds in points):
        raise ConfigError(f"batches and step times must be positive, got {list(points)}")
    # Weighted least squares of t = t0 + c b with weights 1 / t^2: the 2 x 2 normal equations.
    s1 = sum(1 / t**2 for _, t in points)
    sb = sum(b / t**2 for b, t in points)
    sbb = sum(b * b / t**2 for b, t in points)
    st = sum(1 / t for _, t in points)
    sbt = sum(b / t for b, t in points)
    determinant = s1 * sbb - sb * sb
    fixed = (sbb * st - sb * sbt) / determinant
    per_image = (s1 * sbt - sb * st) / determinant
    if fixed < 0:  # no fixed cost: the best line through the origin
        fixed, per_image = 0.0, sbt / sbb
    if not (per_image > 0 and math.isfinite(per_image)):
        raise ConfigError(f"step times do not grow with the batch: {list(points)}")
    return StepCurve(fixed, per_image)
