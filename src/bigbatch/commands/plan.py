"""`bigbatch plan`: its options, and the call into bigbatch.tools.plan."""

from __future__ import annotations

import argparse
import json

from bigbatch.errors import ConfigError
from bigbatch.tools.plan.network import TOPOLOGIES
from bigbatch.tools.plan.paper import paper_predictions, paper_record
from bigbatch.tools.plan.presets import (
    PRESETS,
)
from bigbatch.tools.plan.report import build_plan, format_paper, format_presets, list_presets
from bigbatch.tools.plan.workload import DEFAULT_OVERLAP, GRADIENT_BYTES, IMAGENET_TRAIN_IMAGES


def add_commands(commands) -> argparse.ArgumentParser:
    """Register ``bigbatch plan`` on argparse sub-parsers."""
    command = commands.add_parser(
        "plan",
        help="predict time per step, per epoch and to train on p devices",
        description="Scaling planner: compute + alpha-beta all-reduce model (see "
        "docs/results/scaling_planner.md).",
    )
    add_workload_options(command)
    add_device_options(command)
    add_network_options(command)
    add_report_options(command)
    command.set_defaults(handler=run_plan)
    return command


def add_workload_options(command: argparse.ArgumentParser) -> None:
    """What is trained: model, data set size, epochs, global batch."""
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


def add_device_options(command: argparse.ArgumentParser) -> None:
    """How fast one device trains: a preset, a figure, or a measurement here."""
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
    command.add_argument(
        "--ideal-device",
        action="store_true",
        help="use the preset's throughput figure as it is, without its "
        "multi-node losses (small per-device batch, cores for MLSL)",
    )


def add_network_options(command: argparse.ArgumentParser) -> None:
    """The network's cost model: alpha-beta by hand, from a preset or from a measurement."""
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
        help="gradient on the wire: fp32, bf16, or exact (int64, as exact_reduction=true sends; "
        "default fp32)",
    )


def add_report_options(command: argparse.ArgumentParser) -> None:
    """What is printed: the scaling table, a target time, the paper's runs, presets, JSON."""
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
        "--paper",
        action="store_true",
        help="the paper's configurations next to their reported times",
    )
    command.add_argument(
        "--published",
        action="store_true",
        help="published runs (MLPerf ResNet-50, large-batch records, the paper's) next to the "
        "planner's prediction of each (src/bigbatch/tools/plan/published.json)",
    )
    command.add_argument(
        "--published-input",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --published: replace one of the data file's inputs (e.g. kernel_floor_s=0)",
    )
    command.add_argument("--list-presets", action="store_true", help="list hardware presets")
    command.add_argument("--json", action="store_true", help="print JSON instead of text")


def run_plan(args: argparse.Namespace) -> int:
    if args.list_presets:
        print(json.dumps(list_presets(), indent=2) if args.json else format_presets())
        return 0
    if args.published:
        return run_published(args)
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


def parse_inputs(items: list[str]) -> dict[str, float]:
    """KEY=VALUE pairs of --published-input, the values numbers."""
    changes = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            changes[key] = float(value)
        except ValueError:
            sep = ""
        if not sep or not key:
            raise ConfigError(f"--published-input wants KEY=NUMBER, got '{item}'")
    return changes


def run_published(args: argparse.Namespace) -> int:
    from bigbatch.tools.plan.published import published_predictions
    from bigbatch.tools.plan.report import format_published

    result = published_predictions(parse_inputs(args.published_input))
    print(json.dumps(result, indent=2) if args.json else "\n".join(format_published(result)))
    return 0
