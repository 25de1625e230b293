"""The planner's report: the workload, network and throughput a command asks for, and the text
and JSON it prints."""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, replace

from bigbatch.errors import ConfigError
from bigbatch.tools.plan.network import Network, network_from_allreduce_json, network_from_preset
from bigbatch.tools.plan.paper import PaperPrediction
from bigbatch.tools.plan.presets import (
    PRESETS,
    HardwarePreset,
)
from bigbatch.tools.plan.stats import (
    NO_LOSSES,
    ModelStats,
    Throughput,
    default_image_size,
    device_throughput,
    measure_images_per_second,
    model_statistics,
)
from bigbatch.tools.plan.workload import (
    BACKWARD_SHARE,
    GRADIENT_BYTES,
    StepEstimate,
    TargetAnswer,
    Workload,
    devices_for_target,
    efficiency_crossover,
    estimate_step,
    power_of_two_counts,
    scaling_table,
)


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


def format_batches(values: list[float]) -> str:
    return " -> ".join(f"{value:,.0f}" for value in values)


def published_mark(row: dict) -> str:
    if row.get("calibration"):
        return "calibration"
    if row["in_band"]:
        return "ok"
    return "MISS (cause in the data file)" if row["known_miss"] else "MISS, NO CAUSE RECORDED"


def format_published(result: dict) -> list[str]:
    """The table of ``bigbatch plan --published``: one line per run, then the checks."""
    header = (
        f"{'run':44} {'hardware':16} {'devices':>7} {'global batch':>16} {'per device':>10} "
        f"{'epochs':>6} {'published':>9} {'predicted':>9} {'ratio':>5}  band"
    )
    lines = [header]
    for row in result["rows"]:
        lines.append(
            f"{row['label'][:44]:44} {row['hardware']:16} {row['devices']:>7,} "
            f"{format_batches(row['global_batch']):>16} "
            f"{format_batches(row['per_device_batch']):>10} {row['epochs']:>6.4g} "
            f"{row['published_minutes']:>7.4g} m {row['predicted_minutes']:>7.4g} m "
            f"{row['ratio']:>5.2f}  {row['band'][0]:.2f}-{row['band'][1]:.2f} {published_mark(row)}"
        )
    check, fitted = result["speedup"], result["calibration"]
    lines += [
        "",
        f"speed-up {check['from']} -> {check['to']}: published {check['published']:.1f}x, "
        f"predicted {check['predicted']:.1f}x, ratio {check['ratio']:.2f} "
        f"({'ok' if check['in_band'] else 'MISS'}, band {check['low']:.2f}-{check['high']:.2f})",
        f"fitted constant {fitted['constant']} = {fitted['value']:.3f} (on {fitted['run']} only): "
        f"{fitted['about']}",
    ]
    misses = [row for row in result["rows"] if row["known_miss"]]
    for row in misses:
        lines += ["", f"miss, {row['label']} (ratio {row['ratio']:.2f}): {row['known_miss']}"]
    lines += ["", "inputs (label: value, source):"]
    for where, item in result["inputs"].items():
        record = f"; record {item['record']}" if item.get("record") else ""
        value = item.get("value", item.get("images_per_second", item.get("scaled_from")))
        lines.append(f"  {where} [{item['label']}]: {value}{record}; {item['source']}")
    return lines
