"""How far will it scale? Time per step, per epoch and to train for p data-parallel devices.

    bigbatch plan --model resnet50 --epochs 90 --batch-size 32768 --devices 2048 --preset knl-opa
    bigbatch plan --model resnet50 --epochs 90 --target-minutes 30 --preset a100-dgx
    bigbatch plan --model resnet18 --device-images-per-second 300 --allreduce-json ar.json
    bigbatch plan --paper

The model (PAPER.md section 4: computation scales with the images, communication with the
parameters) for a global batch B on p devices:

- compute per step         C(p) = (B / p) / (r x f), with r the device's training images/s
  and f its losses in a multi-node run (``DeviceLosses``, 1 unless the preset states them):
    batch curve: b / (b + h) at b = B/p images per device, over the same at the batch the
                 figure was measured at (a fixed per-step cost shared by fewer images);
    core share:  the share of cores left for compute once the job spans several nodes;
- gradient all-reduce      n = parameters x 4 bytes (fp32) or x 2 (bf16), per step, costing
    ring:  T = 2(p-1) alpha + 2(p-1)/p n beta       (reduce-scatter + all-gather)
    tree:  T = 2 log2(p) (alpha + n beta)           (reduce to a root, broadcast back)
  with alpha the latency per message and beta the seconds per byte of one link. With several
  devices per node the all-reduce is hierarchical: a ring inside the node on the intra-node link,
  plus the ring (or tree) above over the nodes, where beta is the node's network injection
  bandwidth (all its NICs);
- overlap: each layer's all-reduce starts when its backward finishes (PAPER.md section 4; DDP does
  the same per bucket), so up to the backward pass, taken as 2/3 of compute, can hide it.
  Assumption: a fraction ``overlap`` (default 0.5) of backward is available, because the first
  gradients arrive only after the last layers' backward, the last ones have nothing left to hide
  under, and communication shares the device with compute (NCCL kernels, MLSL cores).
  exposed = max(0, T - overlap x 2/3 x C);
- step = C + exposed; steps per epoch = floor(N / B) (the partial last batch is dropped, as
  bigbatch's sampler does); time to train = epochs x steps per epoch x step;
- scaling efficiency = single-device time / (p x time on p) = f C / step: the fraction of the
  time the devices compute at their published rate.

Not modelled: data loading, stragglers, contention in the network core, and the achievable
fraction of nominal link rates (the all-reduce uses them as they are).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bigbatch.errors import ConfigError
from bigbatch.plan_presets import (
    PAPER_RUNS,
    PRESETS,
    DevicePreset,
    Figure,
    HardwarePreset,
    PaperRun,
)

log = logging.getLogger(__name__)

IMAGENET_TRAIN_IMAGES = 1_281_167
BACKWARD_SHARE = 2.0 / 3.0  # backward costs about twice the forward pass
DEFAULT_OVERLAP = 0.5
GRADIENT_BYTES = {"fp32": 4, "bf16": 2}
TOPOLOGIES = ("ring", "tree")


# ----------------------------------------------------------------------------- all-reduce cost


def ring_allreduce_seconds(nbytes: float, p: int, alpha: float, beta: float) -> float:
    """Ring all-reduce: 2(p-1) steps of alpha, each link carrying 2(p-1)/p of the message."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta


def tree_allreduce_seconds(nbytes: float, p: int, alpha: float, beta: float) -> float:
    """Binary-tree reduce then broadcast: 2 log2(p) hops, each moving the whole message."""
    if p <= 1:
        return 0.0
    return 2 * math.log2(p) * (alpha + nbytes * beta)


@dataclass(frozen=True)
class Network:
    """alpha (s per message) and beta (s per byte) between nodes, and inside a node."""

    alpha: float
    beta: float
    topology: str = "ring"
    devices_per_node: int = 1
    intra_alpha: float = 0.0
    intra_beta: float = 0.0
    description: str = "custom"

    def __post_init__(self) -> None:
        if self.topology not in TOPOLOGIES:
            raise ConfigError(
                f"topology must be one of {', '.join(TOPOLOGIES)}, got '{self.topology}'"
            )
        for name in ("alpha", "beta", "intra_alpha", "intra_beta"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"network {name} must be a finite number >= 0, got {value}")
        if self.devices_per_node < 1:
            raise ConfigError(f"devices per node must be at least 1, got {self.devices_per_node}")

    @property
    def bandwidth_gbit(self) -> float:
        """1/beta in Gbit/s (inf for a free network)."""
        return math.inf if self.beta == 0 else 8.0 / self.beta / 1e9


def allreduce_seconds(nbytes: float, p: int, network: Network) -> float:
    """Time of one all-reduce of ``nbytes`` over p devices (hierarchical when nodes hold several).

    Inside a node: ring reduce-scatter + all-gather on the device links. Across the N nodes: each
    of the k devices all-reduces its n/k shard, the k streams sharing the node's injection
    bandwidth, which costs the same as one all-reduce of n at the node's beta.
    """
    if p <= 1:
        return 0.0
    per_node = min(network.devices_per_node, p)
    nodes = math.ceil(p / per_node)
    inside = ring_allreduce_seconds(nbytes, per_node, network.intra_alpha, network.intra_beta)
    across = (ring_allreduce_seconds if network.topology == "ring" else tree_allreduce_seconds)(
        nbytes, nodes, network.alpha, network.beta
    )
    return inside + across


def network_from_preset(preset: HardwarePreset) -> Network:
    spec = preset.network
    return Network(
        alpha=spec.alpha_s.value,
        beta=8.0 / (spec.bandwidth_gbit.value * 1e9),
        topology=spec.topology,
        devices_per_node=spec.devices_per_node,
        intra_alpha=spec.intra_alpha_s.value if spec.intra_alpha_s else 0.0,
        intra_beta=(
            8.0 / (spec.intra_bandwidth_gbit.value * 1e9) if spec.intra_bandwidth_gbit else 0.0
        ),
        description=spec.description,
    )


def network_from_allreduce_json(path: str | Path) -> Network:
    """alpha and beta fitted by ``bigbatch bench allreduce`` (a flat ring, one device per node)."""
    try:
        record = json.loads(Path(path).read_text())
        fit = record["fit"]
        alpha, beta = float(fit["alpha_s"]), float(fit["beta_s_per_byte"])
    except FileNotFoundError:
        raise ConfigError(
            f"all-reduce file {path} does not exist; write one with "
            "`bigbatch bench allreduce --out FILE`"
        ) from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise ConfigError(
            f"{path} is not a `bigbatch bench allreduce` result "
            f"(missing or bad fit.alpha_s / fit.beta_s_per_byte: {error})"
        ) from None
    return Network(
        alpha=alpha,
        beta=beta,
        topology="ring",
        description=f"fitted by bigbatch bench allreduce on "
        f"{record.get('world_size', '?')} processes ({path})",
    )


# ----------------------------------------------------------------------------- device losses


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


# ----------------------------------------------------------------------------- the model


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
        return max(1, self.dataset_size // self.global_batch)

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


# ----------------------------------------------------------------------------- inputs


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


# ----------------------------------------------------------------------------- the paper


@dataclass(frozen=True)
class PaperPrediction:
    run: PaperRun
    estimate: StepEstimate
    throughput: Throughput
    network: Network
    stats: ModelStats

    @property
    def predicted_minutes(self) -> float:
        return self.estimate.total / 60.0

    @property
    def ratio(self) -> float:
        """predicted / reported."""
        return self.predicted_minutes / self.run.reported_minutes


def paper_predictions(
    overlap: float = DEFAULT_OVERLAP, ideal_device: bool = False
) -> list[PaperPrediction]:
    """The planner's time for each reported run, using the runs' presets only.

    ``ideal_device`` drops the presets' device losses (the published figures as they are).
    """
    stats_cache: dict[str, ModelStats] = {}

    def stats_of(name: str) -> ModelStats:
        if name not in stats_cache:
            stats_cache[name] = model_statistics(name)
        return stats_cache[name]

    predictions = []
    for run in PAPER_RUNS:
        preset = PRESETS[run.preset]
        stats = stats_of(run.model)
        has_figure = run.model in preset.device.images_per_second
        reference = None if has_figure else stats_of(preset.device.reference_model)
        throughput = device_throughput(preset, run.model, stats, reference)
        if ideal_device:
            throughput = replace(throughput, losses=NO_LOSSES)
        workload = Workload.of_model(
            run.model, stats, epochs=run.epochs, global_batch=run.global_batch
        )
        network = network_from_preset(preset)
        estimate = estimate_step(
            workload, throughput.images_per_second, network, run.devices, overlap, throughput.losses
        )
        predictions.append(PaperPrediction(run, estimate, throughput, network, stats))
    return predictions


# ----------------------------------------------------------------------------- formatting


def format_seconds(seconds: float) -> str:
    if seconds < 1.0:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 120.0:
        return f"{seconds:.2f} s"
    if seconds < 2 * 3600.0:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400.0:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def format_network(network: Network) -> str:
    text = (
        f"{network.description}; {network.topology}, alpha {network.alpha * 1e6:.3g} us, "
        f"beta {network.beta * 1e9:.4g} ns/byte ({network.bandwidth_gbit:.4g} Gbit/s)"
    )
    if network.devices_per_node > 1:
        intra = math.inf if network.intra_beta == 0 else 8.0 / network.intra_beta / 1e9
        text += (
            f"; {network.devices_per_node} devices per node, intra-node ring at "
            f"{intra:.4g} Gbit/s, alpha {network.intra_alpha * 1e6:.3g} us"
        )
    return text


def format_table(rows: list[StepEstimate], threshold: float = 0.5) -> list[str]:
    lines = [
        f"{'devices':>8} {'batch/dev':>10} {'compute':>10} {'all-reduce':>11} "
        f"{'exposed':>10} {'step':>10} {'to train':>10} {'comm/comp':>10} {'efficiency':>10}"
    ]
    for row in rows:
        mark = "  < 50%" if row.efficiency < threshold else ""
        lines.append(
            f"{row.devices:>8} {row.local_batch:>10.4g} {format_seconds(row.compute):>10} "
            f"{format_seconds(row.allreduce):>11} {format_seconds(row.exposed):>10} "
            f"{format_seconds(row.step):>10} {format_seconds(row.total):>10} "
            f"{row.comm_compute_ratio:>10.3g} {row.efficiency:>9.1%}{mark}"
        )
    return lines


def format_estimate(row: StepEstimate, overlap: float) -> list[str]:
    return [
        f"per step on {row.devices} devices ({row.local_batch:.4g} images per device):",
        f"  device rate kept         {row.device_factor:.1%} of its figure",
        f"  compute                  {format_seconds(row.compute)}",
        f"  all-reduce               {format_seconds(row.allreduce)}",
        f"  hidden under backward    {format_seconds(row.overlappable)}  (overlap {overlap:g} of "
        f"backward = {BACKWARD_SHARE:.3g} of compute)",
        f"  exposed communication    {format_seconds(row.exposed)}",
        f"  step                     {format_seconds(row.step)}",
        f"steps per epoch            {row.steps_per_epoch}",
        f"time per epoch             {format_seconds(row.epoch)}",
        f"time to train              {format_seconds(row.total)}",
        f"comm/compute ratio         {row.comm_compute_ratio:.3g}",
        f"scaling efficiency         {row.efficiency:.1%}",
    ]


# ----------------------------------------------------------------------------- command line


def add_plan_command(commands) -> argparse.ArgumentParser:
    """Register ``bigbatch plan`` on argparse sub-parsers."""
    command = commands.add_parser(
        "plan",
        help="predict time per step, per epoch and to train on p devices",
        description="Scaling planner: compute + alpha-beta all-reduce model (see "
        "docs/results/scaling_planner.md).",
    )
    command.add_argument("--model", default="resnet50", help="registered model (default resnet50)")
    command.add_argument("--params", type=int, help="parameter count (instead of the registry's)")
    command.add_argument("--flops", type=float, help="forward FLOPs per image (2 x MACs)")
    command.add_argument("--image-size", type=int, help="image size (default: the model's)")
    command.add_argument(
        "--dataset-size",
        type=int,
        default=IMAGENET_TRAIN_IMAGES,
        help=f"training images (default ImageNet, {IMAGENET_TRAIN_IMAGES:,})",
    )
    command.add_argument("--epochs", type=float, default=90.0, help="epochs (default 90)")
    command.add_argument(
        "--batch-size",
        "--global-batch",
        dest="batch_size",
        type=int,
        default=32768,
        help="global batch B (default 32768)",
    )
    command.add_argument("--devices", type=int, help="device count for the detailed breakdown")
    command.add_argument("--preset", help=f"hardware preset: {', '.join(PRESETS)}")
    command.add_argument(
        "--device-images-per-second",
        type=float,
        help="training images/s of one device (overrides the preset's)",
    )
    command.add_argument(
        "--measure", action="store_true", help="measure images/s of one process on this machine"
    )
    command.add_argument("--measure-batch", type=int, default=32, help="batch for --measure")
    command.add_argument("--alpha", type=float, help="latency per message, seconds")
    command.add_argument("--beta", type=float, help="seconds per byte of one link")
    command.add_argument("--bandwidth-gbit", type=float, help="link bandwidth (sets beta)")
    command.add_argument("--topology", choices=TOPOLOGIES, help="all-reduce algorithm")
    command.add_argument("--devices-per-node", type=int, help="devices sharing a node")
    command.add_argument("--allreduce-json", help="alpha and beta from `bigbatch bench allreduce`")
    command.add_argument(
        "--overlap",
        type=float,
        default=DEFAULT_OVERLAP,
        help=f"fraction of backward that can hide communication (default {DEFAULT_OVERLAP})",
    )
    command.add_argument(
        "--precision",
        choices=tuple(GRADIENT_BYTES),
        default="fp32",
        help="gradient precision on the wire (default fp32)",
    )
    command.add_argument(
        "--table-max",
        type=int,
        default=4096,
        help="largest device count in the table (default 4096)",
    )
    command.add_argument(
        "--target-minutes", type=float, help="find the fewest devices that train within this time"
    )
    command.add_argument(
        "--max-devices",
        type=int,
        default=65536,
        help="search limit for --target-minutes (default 65536)",
    )
    command.add_argument(
        "--ideal-device",
        action="store_true",
        help="use the preset's throughput figure as it is, without its "
        "multi-node losses (small per-device batch, cores for MLSL)",
    )
    command.add_argument(
        "--paper",
        action="store_true",
        help="the paper's configurations next to their reported times",
    )
    command.add_argument("--list-presets", action="store_true", help="list hardware presets")
    command.add_argument("--json", action="store_true", help="print JSON instead of text")
    command.set_defaults(handler=run_plan)
    return command


def run_plan(args: argparse.Namespace) -> int:
    if args.list_presets:
        print(json.dumps(list_presets(), indent=2) if args.json else format_presets())
        return 0
    if args.paper:
        predictions = paper_predictions(args.overlap, args.ideal_device)
        if args.json:
            print(json.dumps([paper_record(p) for p in predictions], indent=2))
        else:
            print("\n".join(format_paper(predictions, args.overlap, args.ideal_device)))
        return 0
    plan = build_plan(args)
    print(json.dumps(plan, indent=2) if args.json else "\n".join(plan["text"]))
    return 0


def preset_named(name: str | None) -> HardwarePreset | None:
    if name is None:
        return None
    if name not in PRESETS:
        raise ConfigError(f"unknown preset '{name}'; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def resolve_network(args: argparse.Namespace, preset: HardwarePreset | None) -> Network:
    """The preset's network, or the fitted one, with command-line overrides applied."""
    if args.allreduce_json:
        network = network_from_allreduce_json(args.allreduce_json)
    elif preset is not None:
        network = network_from_preset(preset)
    elif args.alpha is not None and (args.beta is not None or args.bandwidth_gbit is not None):
        network = Network(alpha=0.0, beta=0.0)
    else:
        raise ConfigError(
            "no network: give --preset, --allreduce-json, or --alpha with --beta "
            "(or --bandwidth-gbit)"
        )
    changes: dict = {}
    if args.alpha is not None:
        changes["alpha"] = args.alpha
    if args.bandwidth_gbit is not None:
        if not args.bandwidth_gbit > 0:
            raise ConfigError(f"--bandwidth-gbit must be positive, got {args.bandwidth_gbit}")
        changes["beta"] = 8.0 / (args.bandwidth_gbit * 1e9)
    if args.beta is not None:
        changes["beta"] = args.beta
    if args.topology is not None:
        changes["topology"] = args.topology
    if args.devices_per_node is not None:
        changes["devices_per_node"] = args.devices_per_node
    if changes:
        changes["description"] = network.description + " (with command-line changes)"
    return replace(network, **changes)


def resolve_throughput(
    args: argparse.Namespace, preset: HardwarePreset | None, stats: ModelStats
) -> Throughput:
    if args.device_images_per_second is not None:
        if not args.device_images_per_second > 0:
            raise ConfigError(
                f"--device-images-per-second must be positive, got {args.device_images_per_second}"
            )
        return Throughput(args.device_images_per_second, "given on the command line", False)
    if args.measure:
        value = measure_images_per_second(args.model, args.measure_batch, stats.image_size)
        return Throughput(
            value,
            f"measured on this machine: one process, batch "
            f"{args.measure_batch}, {stats.image_size} px",
            False,
        )
    if preset is None:
        raise ConfigError(
            "no device throughput: give --preset, --device-images-per-second or --measure"
        )
    figure = preset.device.images_per_second.get(args.model)
    at_default_size = args.params is not None or stats.image_size == default_image_size(args.model)
    if figure is not None and at_default_size:
        throughput = device_throughput(preset, args.model, stats, None)
    else:
        base_model = args.model if figure is not None else preset.device.reference_model
        throughput = device_throughput(preset, args.model, stats, model_statistics(base_model))
    return replace(throughput, losses=NO_LOSSES) if args.ideal_device else throughput


def build_plan(args: argparse.Namespace) -> dict:
    preset = preset_named(args.preset)
    for name in ("devices", "table_max", "max_devices", "measure_batch"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if args.params is not None or args.flops is not None:
        if args.params is None or args.flops is None:
            raise ConfigError("--params and --flops go together")
        stats = ModelStats(args.params, args.flops, args.image_size or 0)
    else:
        stats = model_statistics(args.model, args.image_size)
    workload = Workload.of_model(
        args.model,
        stats,
        dataset_size=args.dataset_size,
        epochs=args.epochs,
        global_batch=args.batch_size,
        gradient_bytes_per_parameter=GRADIENT_BYTES[args.precision],
    )
    network = resolve_network(args, preset)
    throughput = resolve_throughput(args, preset, stats)
    rate, losses = throughput.images_per_second, throughput.losses
    rows = scaling_table(
        workload, rate, network, power_of_two_counts(args.table_max), args.overlap, losses
    )
    crossover = efficiency_crossover(rows)
    detail = (
        estimate_step(workload, rate, network, args.devices, args.overlap, losses)
        if args.devices
        else None
    )
    target = None
    if args.target_minutes is not None:
        target = devices_for_target(
            workload,
            rate,
            network,
            args.target_minutes * 60.0,
            args.overlap,
            args.max_devices,
            losses,
        )
    text = format_plan(workload, throughput, network, args, rows, crossover, detail, target)
    return {
        "workload": asdict(workload),
        "throughput": asdict(throughput),
        "network": asdict(network),
        "overlap": args.overlap,
        "detail": asdict(detail) if detail else None,
        "table": [asdict(row) for row in rows],
        "efficiency_below_50_percent_at": crossover,
        "target": asdict(target) if target else None,
        "text": text,
    }


def format_plan(
    workload: Workload,
    throughput: Throughput,
    network: Network,
    args: argparse.Namespace,
    rows: list[StepEstimate],
    crossover: int | None,
    detail: StepEstimate | None,
    target: TargetAnswer | None,
) -> list[str]:
    flag = "  [ESTIMATE]" if throughput.estimate else ""
    lines = [
        f"model        {workload.model}: {workload.parameters:,} parameters, "
        f"{workload.gradient_bytes / 1e6:.1f} MB of {args.precision} gradients per step, "
        f"{workload.forward_flops / 1e9:.3g} GFLOP forward per image"
        + (f" at {workload.image_size} px" if workload.image_size else ""),
        f"training     {workload.epochs:g} epochs of {workload.dataset_size:,} images, global "
        f"batch {workload.global_batch:,} ({workload.steps_per_epoch} steps per epoch)",
        f"device       {throughput.images_per_second:.4g} images/s{flag}",
        f"             source: {throughput.source}",
        f"losses       {throughput.losses.description}",
        f"network      {format_network(network)}",
        f"assumptions  backward = {BACKWARD_SHARE:.3g} of compute; overlap {args.overlap:g} of it "
        "can hide the all-reduce; nominal link rates; no data-loading or straggler losses",
        "",
    ]
    if detail is not None:
        lines += format_estimate(detail, args.overlap) + [""]
    lines += format_table(rows)
    if crossover is None:
        lines.append(f"scaling efficiency stays at or above 50% up to {rows[-1].devices} devices")
    else:
        lines.append(f"scaling efficiency drops below 50% at {crossover} devices")
    if target is not None:
        lines.append("")
        minutes = target.target_seconds / 60.0
        best = target.estimate
        if target.met:
            lines.append(
                f"{best.devices} devices train in {format_seconds(best.total)} "
                f"(target {minutes:g} min) at {best.efficiency:.1%} efficiency, "
                f"{best.local_batch:.4g} images per device"
            )
            if target.smallest_power_of_two is not None:
                power = target.smallest_power_of_two
                lines.append(
                    f"smallest power of two: {power.devices} devices, {format_seconds(power.total)}"
                )
        else:
            lines.append(
                f"no device count up to {min(args.max_devices, workload.global_batch)} "
                f"trains within {minutes:g} min; fastest: {best.devices} devices, "
                f"{format_seconds(best.total)}"
            )
    return lines


def format_paper(
    predictions: list[PaperPrediction], overlap: float, ideal_device: bool = False
) -> list[str]:
    lines = [f"{'configuration':58} {'planner':>9} {'reported':>9} {'ratio':>6}"]
    for item in predictions:
        lines.append(
            f"{item.run.label:58} {item.predicted_minutes:>7.1f} m "
            f"{item.run.reported_minutes:>7.1f} m {item.ratio:>6.2f}"
        )
    device = (
        "published figures as they are (--ideal-device)"
        if ideal_device
        else "published figures with the presets' multi-node losses"
    )
    lines += [
        "",
        f"Assumptions: overlap {overlap:g} of backward (= {BACKWARD_SHARE:.3g} of "
        f"compute); steps per epoch floor(N/B); nominal link rates; no data loading; "
        f"device: {device}.",
    ]
    for item in predictions:
        row = item.estimate
        flag = " [ESTIMATE]" if item.throughput.estimate else ""
        lines += [
            "",
            f"{item.run.label} (reported: {item.run.source})",
            f"  model: {item.stats.parameters:,} parameters, "
            f"{item.stats.forward_flops / 1e9:.3g} GFLOP forward at {item.stats.image_size} px",
            f"  device: {item.throughput.images_per_second:.4g} images/s{flag}: "
            f"{item.throughput.source}",
            f"  losses: {item.throughput.losses.description}",
            f"  network: {format_network(item.network)}",
            f"  per step ({row.local_batch:.4g} images per device, {row.device_factor:.1%} of the "
            f"figure's rate): compute {format_seconds(row.compute)}, all-reduce "
            f"{format_seconds(row.allreduce)}, exposed {format_seconds(row.exposed)}, step "
            f"{format_seconds(row.step)} x {row.steps_per_epoch} steps/epoch; efficiency "
            f"{row.efficiency:.1%}",
        ]
    return lines


def paper_record(item: PaperPrediction) -> dict:
    return {
        "label": item.run.label,
        "model": item.run.model,
        "devices": item.run.devices,
        "global_batch": item.run.global_batch,
        "epochs": item.run.epochs,
        "preset": item.run.preset,
        "reported_minutes": item.run.reported_minutes,
        "predicted_minutes": item.predicted_minutes,
        "ratio": item.ratio,
        "reported_source": item.run.source,
        "throughput": asdict(item.throughput),
        "network": asdict(item.network),
        "estimate": asdict(item.estimate),
        "parameters": item.stats.parameters,
        "forward_flops": item.stats.forward_flops,
    }


def list_presets() -> list[dict]:
    return [asdict(preset) for preset in PRESETS.values()]


def format_presets() -> str:
    lines = []
    for preset in PRESETS.values():
        lines.append(f"{preset.name}: {preset.description}")
        lines.append(f"  device: {preset.device.description}")
        for model, figure in preset.device.images_per_second.items():
            flag = " [ESTIMATE]" if figure.estimate else ""
            lines.append(f"    {model}: {figure.value:g} images/s{flag} ({figure.source})")
        lines.append(f"  network: {format_network(network_from_preset(preset))}")
    return "\n".join(lines)
