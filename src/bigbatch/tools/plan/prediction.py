"""How long a published run takes, by the planner: the device's step curve, synchronised
BatchNorm, the all-reduce and its overlap, evaluation, and the one fitted constant.

For a run on p devices with global batch B (b = B / p per device), per phase of its schedule:

- device step (``curve.StepCurve``): t(b) = t0 + b c. t0 is the per-step fixed cost: on a GPU
  one kernel floor per kernel of the step (``layers``) plus the optimizer's memory traffic at
  the device's bandwidth. c, the seconds per image, comes from the device's throughput figure
  (measured or published) at its batch, less t0 there; a device without a figure takes another
  one's c scaled by the two chips' per-image roofline times (FLOPs at peak, memory-bound bytes at
  HBM bandwidth). MLPerf's implementation is ``mlperf_stack_speedup`` times faster per image than
  bigbatch's measured step: the one fitted constant, fitted on the calibration run alone;
- synchronised BatchNorm over g > 1 devices adds two exchanges per BN layer on the node's links;
- the all-reduce of the gradient (``network.allreduce_seconds``, hierarchical), of which a share
  ``overlap`` of backward (2/3 of compute) hides: exposed = max(0, T - overlap 2/3 compute);
- steps = epochs x N / B (every image of every epoch); evaluation: per pass, ceil(50,000 / (p b))
  forward steps of t0's forward kernels plus b c / 3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from bigbatch.errors import ConfigError
from bigbatch.tools.plan.curve import StepCurve
from bigbatch.tools.plan.layers import LayerCounts, layer_counts
from bigbatch.tools.plan.network import Network, allreduce_seconds, network_from_preset
from bigbatch.tools.plan.presets import PRESETS
from bigbatch.tools.plan.stats import model_statistics
from bigbatch.tools.plan.workload import BACKWARD_SHARE

FITTED_STACK, FIGURE_STACK = "mlperf-mxnet", "bigbatch"


@dataclass(frozen=True)
class Context:
    """What every prediction shares: the model's size and layers, and the data file."""

    data: dict[str, Any]
    parameters: int
    forward_flops: float
    counts: LayerCounts

    def value(self, key: str) -> Any:
        return self.data["inputs"][key]["value"]


def make_context(data: dict[str, Any]) -> Context:
    stats = model_statistics(data["model"])
    return Context(data, stats.parameters, stats.forward_flops, layer_counts(data["model"]))


def network_for(run: dict[str, Any], ctx: Context) -> Network:
    spec = ctx.data["networks"][run["network"]]
    if "preset" in spec:
        network = network_from_preset(PRESETS[spec["preset"]])
    else:
        network = Network(
            alpha=spec["alpha_s"]["value"],
            beta=8.0 / (spec["bandwidth_gbit"]["value"] * 1e9),
            devices_per_node=spec["devices_per_node"],
            intra_alpha=spec["intra_alpha_s"]["value"],
            intra_beta=8.0 / (spec["intra_bandwidth_gbit"]["value"] * 1e9),
            description=spec["description"],
        )
    if "topology" in run:
        network = replace(network, topology=run["topology"])
    return network


def roofline_seconds(device: dict[str, Any], ctx: Context) -> float:
    """Per training image: 3 x forward FLOPs at peak plus the memory-bound bytes at bandwidth."""
    compute = 3 * ctx.forward_flops / device["peak_flops"]["value"]
    memory = ctx.counts.activation_bytes(device["bytes_per_element"])
    return compute + memory / device["memory_bandwidth"]["value"]


def fixed_seconds(device: dict[str, Any], ctx: Context, kernels: int) -> float:
    """t0: a kernel floor per kernel (GPUs) plus the optimizer's bytes at memory bandwidth."""
    launches = kernels * ctx.value("kernel_floor_s") if device["kernel_launches"] else 0.0
    update = ctx.value("optimizer_bytes_per_parameter") * ctx.parameters
    return launches + update / device["memory_bandwidth"]["value"]


def per_image_seconds(name: str, ctx: Context) -> tuple[float, str]:
    """c of device ``name`` and the software stack its figure was measured with."""
    device = ctx.data["devices"][name]
    figure = device["throughput"]
    if "scaled_from" in figure:
        base, stack = per_image_seconds(figure["scaled_from"], ctx)
        source = ctx.data["devices"][figure["scaled_from"]]
        return base * roofline_seconds(device, ctx) / roofline_seconds(source, ctx), stack
    step = figure["batch"] / figure["images_per_second"]
    t0 = fixed_seconds(device, ctx, ctx.counts.training_kernels)
    return (step - t0) / figure["batch"], figure["stack"]


@dataclass(frozen=True)
class DeviceCurve:
    training: StepCurve
    forward_fixed_s: float

    def eval_step(self, batch: float) -> float:
        return self.forward_fixed_s + batch * self.training.per_image_s * (1 - BACKWARD_SHARE)


def device_curve(name: str, stack: str, speedup: float, ctx: Context) -> DeviceCurve:
    device = ctx.data["devices"][name]
    per_image, figure_stack = per_image_seconds(name, ctx)
    if stack == FITTED_STACK and figure_stack == FIGURE_STACK:
        per_image /= speedup
    fixed = fixed_seconds(device, ctx, ctx.counts.training_kernels)
    floor = ctx.value("kernel_floor_s") if device["kernel_launches"] else 0.0
    return DeviceCurve(StepCurve(fixed, per_image), ctx.counts.forward_kernels * floor)


@dataclass(frozen=True)
class PhaseEstimate:
    epochs: float
    global_batch: int
    local_batch: float
    compute: float
    allreduce: float
    exposed: float
    step: float
    steps: float


@dataclass(frozen=True)
class RunPrediction:
    run: dict[str, Any]
    phases: list[PhaseEstimate]
    evaluation_s: float
    curve: DeviceCurve
    network: Network
    overlap: float
    total_s: float = field(init=False)

    def __post_init__(self) -> None:
        train = sum(phase.steps * phase.step for phase in self.phases)
        object.__setattr__(self, "total_s", train + self.evaluation_s)

    @property
    def predicted_minutes(self) -> float:
        return self.total_s / 60.0

    @property
    def ratio(self) -> float:
        return self.predicted_minutes / self.run["published_minutes"]


def predict_run(run: dict[str, Any], speedup: float, ctx: Context) -> RunPrediction:
    network = network_for(run, ctx)
    curve = device_curve(run["device"], run["stack"], speedup, ctx)
    fitted = run["stack"] == FITTED_STACK
    overlap = ctx.value("mlperf_overlap" if fitted else "default_overlap")
    gradient = run.get("gradient_bytes", ctx.value("mlperf_gradient_bytes")) * ctx.parameters
    sync_bn = 0.0
    if run.get("bn_group", 1) > 1:
        sync_bn = 2 * ctx.counts.norms * (network.intra_alpha + ctx.value("kernel_floor_s"))
    images, p = ctx.data["dataset_images"]["value"], run["devices"]
    phases = []
    for phase in run["phases"]:
        batch = phase["global_batch"] / p
        compute = curve.training.step_seconds(batch) + sync_bn
        allreduce = allreduce_seconds(gradient, p, network)
        exposed = max(0.0, allreduce - overlap * BACKWARD_SHARE * compute)
        steps = phase["epochs"] * images / phase["global_batch"]
        phases.append(
            PhaseEstimate(
                phase["epochs"],
                phase["global_batch"],
                batch,
                compute,
                allreduce,
                exposed,
                compute + exposed,
                steps,
            )
        )
    last = phases[-1].local_batch
    passes = math.ceil(ctx.data["eval_images"]["value"] / (p * last))
    evaluation = run["evaluations"] * passes * curve.eval_step(last)
    return RunPrediction(run, phases, evaluation, curve, network, overlap)


def calibrate(ctx: Context) -> float:
    """The one fitted constant: the speed-up that makes the calibration run's time come out."""
    name = ctx.data["calibration"]["run"]
    run = next((r for r in ctx.data["runs"] if r["id"] == name), None)
    if run is None:
        raise ConfigError(f"the calibration run {name!r} is not among the runs")
    low, high = math.log(0.01), math.log(100.0)
    for _ in range(200):  # predicted time falls as the speed-up grows
        middle = (low + high) / 2
        if predict_run(run, math.exp(middle), ctx).ratio > 1.0:
            low = middle
        else:
            high = middle
    return math.exp((low + high) / 2)
