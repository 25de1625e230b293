"""The planner against the paper: the predicted time of each published run (You et al.,
"ImageNet Training in Minutes", ICPP 2018) beside the reported one."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from bigbatch.tools.plan.network import Network, network_from_preset
from bigbatch.tools.plan.presets import (
    PAPER_RUNS,
    PRESETS,
    PaperRun,
)
from bigbatch.tools.plan.stats import (
    NO_LOSSES,
    ModelStats,
    Throughput,
    device_throughput,
    model_statistics,
)
from bigbatch.tools.plan.workload import DEFAULT_OVERLAP, StepEstimate, Workload, estimate_step


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
