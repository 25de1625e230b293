"""What the planner needs of a model: its parameter count and FLOPs, and the training images/s
of one device (from a preset's published figure or measured here)."""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import dataclass

from bigbatch.errors import ConfigError
from bigbatch.tools.plan.presets import (
    DevicePreset,
    Figure,
    HardwarePreset,
)

log = logging.getLogger(__name__)


def batch_efficiency(batch: float, half_batch: float) -> float:
    """b / (b + h): throughput at batch b over the large-batch rate, for a fixed per-step cost."""
    return batch / (batch + half_batch)


@dataclass(frozen=True)
class DeviceLosses:
    """How much of its published throughput a device keeps in a multi-node run.

    ``half_batch`` (h) and ``figure_batch`` give the batch curve b / (b + h), taken relative to
    the batch the figure was measured at and never above 1; ``multinode_share`` is the share of
    the device left for compute once the job spans several nodes.
    """

    half_batch: float | None = None
    figure_batch: float | None = None
    multinode_share: float = 1.0
    description: str = "none"

    def __post_init__(self) -> None:
        if self.half_batch is not None and not self.half_batch >= 0:
            raise ConfigError(f"half-efficiency batch must be >= 0, got {self.half_batch}")
        if self.figure_batch is not None and not 0 < self.figure_batch < math.inf:
            raise ConfigError(f"figure batch must be positive, got {self.figure_batch}")
        if not 0.0 < self.multinode_share <= 1.0:
            raise ConfigError(f"compute share must be in (0, 1], got {self.multinode_share}")

    def batch_factor(self, local_batch: float) -> float:
        if self.half_batch is None or self.figure_batch is None:
            return 1.0
        relative = batch_efficiency(local_batch, self.half_batch) / batch_efficiency(
            self.figure_batch, self.half_batch
        )
        return min(1.0, relative)

    def factor(self, local_batch: float, nodes: int) -> float:
        """The share of the published rate kept at ``local_batch`` images on ``nodes`` nodes."""
        share = self.multinode_share if nodes > 1 else 1.0
        return self.batch_factor(local_batch) * share


NO_LOSSES = DeviceLosses()


@dataclass(frozen=True)
class ModelStats:
    parameters: int
    forward_flops: float
    image_size: int


def model_statistics(
    name: str, image_size: int | None = None, num_classes: int = 1000, in_channels: int = 3
) -> ModelStats:
    """Parameter count and forward FLOPs (2 x MACs) of a registered model at an image size."""
    try:
        from bigbatch.models import create_model, model_spec
        from bigbatch.models.flops import count_parameters, forward_flops
    except ImportError as error:
        raise ConfigError(
            f"the model registry is not available ({error}); give --params and --flops instead"
        ) from None
    try:
        size = image_size or model_spec(name).default_image_size
        model = create_model(name, num_classes, in_channels=in_channels)
    except (KeyError, ValueError) as error:
        raise ConfigError(f"unknown model '{name}': {error}") from None
    flops = forward_flops(model, (in_channels, size, size))
    return ModelStats(count_parameters(model, trainable_only=True), float(flops), size)


def default_image_size(name: str) -> int:
    from bigbatch.models import model_spec

    try:
        return model_spec(name).default_image_size
    except (KeyError, ValueError) as error:
        raise ConfigError(f"unknown model '{name}': {error}") from None


@dataclass(frozen=True)
class Throughput:
    images_per_second: float
    source: str
    estimate: bool
    losses: DeviceLosses = NO_LOSSES


def device_losses(device: DevicePreset, figure: Figure) -> DeviceLosses:
    """The preset's multi-node losses for a throughput figure measured at ``figure.batch``."""
    half, share = device.half_efficiency_batch, device.multinode_compute_share
    if half is None and share is None:
        return NO_LOSSES
    parts = []
    if half is not None and figure.batch is not None:
        parts.append(
            f"batch curve b/(b+{half.value:.3g}) relative to the figure's batch "
            f"{figure.batch} ({half.source})"
        )
    if share is not None:
        parts.append(f"compute share {share.value:.3g} on more than one node ({share.source})")
    return DeviceLosses(
        half_batch=half.value if half is not None and figure.batch is not None else None,
        figure_batch=figure.batch,
        multinode_share=share.value if share is not None else 1.0,
        description="; ".join(parts),
    )


def device_throughput(
    preset: HardwarePreset, model: str, stats: ModelStats, reference_stats: ModelStats | None
) -> Throughput:
    """The preset's figure for ``model`` at its default size, else a FLOP-scaled estimate.

    A model (or image size) without a published figure gets the reference model's images/s
    times reference FLOPs / model FLOPs: compute-bound scaling, flagged as an estimate.
    """
    figures = preset.device.images_per_second
    figure: Figure | None = figures.get(model)
    if figure is not None and reference_stats is None:
        return Throughput(
            figure.value, figure.source, figure.estimate, device_losses(preset.device, figure)
        )
    base_name = model if figure is not None else preset.device.reference_model
    base = figures.get(base_name)
    if base is None or reference_stats is None:
        raise ConfigError(
            f"preset '{preset.name}' has no throughput figure for '{model}' or "
            f"'{preset.device.reference_model}'; give --device-images-per-second"
        )
    value = base.value * reference_stats.forward_flops / stats.forward_flops
    source = (
        f"estimate: {base.value:g} images/s for {base_name} at "
        f"{reference_stats.image_size} px scaled by forward FLOPs "
        f"{reference_stats.forward_flops / 1e9:.3g} / {stats.forward_flops / 1e9:.3g} "
        f"GFLOP ({base.source})"
    )
    return Throughput(value, source, True, device_losses(preset.device, base))


def measure_images_per_second(
    model_name: str,
    batch_size: int = 32,
    image_size: int | None = None,
    steps: int = 5,
    warmup: int = 2,
    num_classes: int = 1000,
    in_channels: int = 3,
) -> float:
    """Training images/s of one process on this machine: median of timed SGD steps on noise."""
    import torch

    from bigbatch.models import create_model, model_spec

    size = image_size or model_spec(model_name).default_image_size
    model = create_model(model_name, num_classes, in_channels=in_channels)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(batch_size, in_channels, size, size, generator=generator)
    labels = torch.randint(0, num_classes, (batch_size,), generator=generator)
    loss_fn = torch.nn.CrossEntropyLoss()
    durations = []
    for index in range(warmup + steps):
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(images), labels).backward()
        optimizer.step()
        if index >= warmup:
            durations.append(time.perf_counter() - started)
    return batch_size / statistics.median(durations)
