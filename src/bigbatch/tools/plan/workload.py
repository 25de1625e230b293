"""The step-time model of the planner: compute, gradient all-reduce and their overlap for a
global batch on p devices; the scaling table and the device count for a target time."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bigbatch.errors import ConfigError
from bigbatch.geometry import steps_per_epoch
from bigbatch.tools.plan.network import Network, allreduce_seconds
from bigbatch.tools.plan.stats import NO_LOSSES, DeviceLosses, ModelStats

IMAGENET_TRAIN_IMAGES = 1_281_167


BACKWARD_SHARE = 2.0 / 3.0  # backward costs about twice the forward pass


DEFAULT_OVERLAP = 0.5


# Bytes per parameter of the all-reduced gradient: exact_reduction sums int64 (train/fixed_point).
GRADIENT_BYTES = {"fp32": 4, "bf16": 2, "exact": 8}


@dataclass(frozen=True)
class Workload:
    """What is trained: model size, data set, epochs, global batch."""

    model: str
    parameters: int
    forward_flops: float
    image_size: int | None = None
    dataset_size: int = IMAGENET_TRAIN_IMAGES
    epochs: float = 90.0
    global_batch: int = 32768
    gradient_bytes_per_parameter: int = 4

    @classmethod
    def of_model(cls, model: str, stats: ModelStats, **fields: Any) -> Workload:
        """The workload of ``model``, its size and FLOPs taken from ``stats``."""
        return cls(model, stats.parameters, stats.forward_flops, stats.image_size, **fields)

    def __post_init__(self) -> None:
        checks = (
            ("parameters", self.parameters),
            ("data set size", self.dataset_size),
            ("global batch", self.global_batch),
            ("epochs", self.epochs),
        )
        for name, value in checks:
            if not value > 0:
                raise ConfigError(f"{name} must be positive, got {value}")

    @property
    def gradient_bytes(self) -> int:
        return self.parameters * self.gradient_bytes_per_parameter

    @property
    def steps_per_epoch(self) -> int:
        """floor(N / B), at least 1: bigbatch's sampler drops the partial last batch."""
        return max(1, steps_per_epoch(self.dataset_size, self.global_batch))

    @property
    def total_steps(self) -> float:
        return self.epochs * self.steps_per_epoch


@dataclass(frozen=True)
class StepEstimate:
    """The planner's answer for one device count (times in seconds)."""

    devices: int
    local_batch: float
    compute: float
    allreduce: float
    overlappable: float
    exposed: float
    step: float
    steps_per_epoch: int
    epoch: float
    total: float
    comm_compute_ratio: float
    efficiency: float
    device_factor: float = 1.0  # share of the published rate kept (DeviceLosses.factor)


def estimate_step(
    workload: Workload,
    images_per_second: float,
    network: Network,
    devices: int,
    overlap: float = DEFAULT_OVERLAP,
    losses: DeviceLosses = NO_LOSSES,
) -> StepEstimate:
    """Per-step and end-to-end times for ``devices`` devices (see the module docstring)."""
    if devices < 1:
        raise ConfigError(f"number of devices must be at least 1, got {devices}")
    if not images_per_second > 0:
        raise ConfigError(f"device throughput must be positive, got {images_per_second} images/s")
    if not 0.0 <= overlap <= 1.0:
        raise ConfigError(f"overlap must be between 0 and 1, got {overlap}")
    local_batch = workload.global_batch / devices
    nodes = math.ceil(devices / network.devices_per_node)
    device_factor = losses.factor(local_batch, nodes)
    compute = local_batch / (images_per_second * device_factor)
    allreduce = allreduce_seconds(workload.gradient_bytes, devices, network)
    overlappable = overlap * BACKWARD_SHARE * compute
    exposed = max(0.0, allreduce - overlappable)
    step = compute + exposed
    epoch = workload.steps_per_epoch * step
    return StepEstimate(
        devices=devices,
        local_batch=local_batch,
        compute=compute,
        allreduce=allreduce,
        overlappable=min(overlappable, allreduce),
        exposed=exposed,
        step=step,
        steps_per_epoch=workload.steps_per_epoch,
        epoch=epoch,
        total=workload.epochs * epoch,
        comm_compute_ratio=allreduce / compute,
        efficiency=device_factor * compute / step,
        device_factor=device_factor,
    )


def power_of_two_counts(largest: int) -> list[int]:
    """1, 2, 4, ... up to ``largest``."""
    counts, p = [], 1
    while p <= largest:
        counts.append(p)
        p *= 2
    return counts


def scaling_table(
    workload: Workload,
    images_per_second: float,
    network: Network,
    counts: list[int],
    overlap: float = DEFAULT_OVERLAP,
    losses: DeviceLosses = NO_LOSSES,
) -> list[StepEstimate]:
    """One estimate per device count, skipping counts with less than one image per device."""
    return [
        estimate_step(workload, images_per_second, network, p, overlap, losses)
        for p in counts
        if p <= workload.global_batch
    ]


def efficiency_crossover(rows: list[StepEstimate], threshold: float = 0.5) -> int | None:
    """The smallest device count in ``rows`` whose scaling efficiency is below ``threshold``."""
    for row in rows:
        if row.efficiency < threshold:
            return row.devices
    return None


@dataclass(frozen=True)
class TargetAnswer:
    target_seconds: float
    met: bool
    estimate: StepEstimate  # the smallest count meeting the target, else the fastest one
    smallest_power_of_two: StepEstimate | None


def devices_for_target(
    workload: Workload,
    images_per_second: float,
    network: Network,
    target_seconds: float,
    overlap: float = DEFAULT_OVERLAP,
    max_devices: int = 65536,
    losses: DeviceLosses = NO_LOSSES,
) -> TargetAnswer:
    """The fewest devices (at most ``max_devices`` and B) that train within ``target_seconds``.

    Every integer count is tried, since time to train is not monotone in p once the all-reduce
    latency term grows. If none meets the target, the answer carries the fastest count.
    """
    if not target_seconds > 0:
        raise ConfigError(f"target time must be positive, got {target_seconds} s")
    largest = min(max_devices, workload.global_batch)
    best: StepEstimate | None = None
    first: StepEstimate | None = None
    for p in range(1, largest + 1):
        row = estimate_step(workload, images_per_second, network, p, overlap, losses)
        if best is None or row.total < best.total:
            best = row
        if row.total <= target_seconds:
            first = row
            break
    power = next(
        (
            row
            for row in (
                estimate_step(workload, images_per_second, network, q, overlap, losses)
                for q in power_of_two_counts(largest)
            )
            if row.total <= target_seconds
        ),
        None,
    )
    assert best is not None
    return TargetAnswer(target_seconds, first is not None, first or best, power)
