"""The `bigbatch` command line.

    bigbatch train                       # the default recipe (Fashion-MNIST, LARS, batch 4096)
    bigbatch train --recipe imagenet-resnet50-32k --data /data/imagenet
    torchrun --nproc-per-node 4 -m bigbatch train --recipe fashion-mnist
    bigbatch eval --weights runs/fashion-mnist/final.pt
    bigbatch recipes

Exit codes: 0 done; 2 bad input (one line on stderr says what to change); 3 stopped on a
non-finite loss; 75 preempted after writing a checkpoint (resume with --resume auto).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable

from bigbatch.errors import UserError

EXIT_USER_ERROR = 2
EXIT_NONFINITE = 3

# Command-line flags that map straight onto config keys.
TRAIN_FLAGS: dict[str, tuple[str, type, str]] = {
    "data": ("data.path", str, "data folder (Fashion-MNIST IDX files or an ImageNet-style tree)"),
    "dataset": (
        "data.name",
        str,
        "data set: fashion-mnist, imagefolder, synthetic, packed, webdataset",
    ),
    "out": ("out", str, "run directory (config, metrics, checkpoints, summary, weights)"),
    "model": ("model.name", str, "model name (see `bigbatch models`)"),
    "optimizer": ("optim.name", str, "lars, lamb or sgd"),
    "batch_size": ("global_batch", int, "global batch B (all processes, all accumulation steps)"),
    "micro_batch": (
        "micro_batch",
        int,
        "micro-batch b: one forward pass on one device; the BN batch",
    ),
    "epochs": ("epochs", float, "training epochs"),
    "lr": ("optim.lr", float, "base learning rate (at optim.reference_batch)"),
    "warmup_epochs": ("schedule.warmup_epochs", float, "linear warmup length in epochs"),
    "seed": ("seed", int, "seed of the whole run (data order, augmentation, init, dropout)"),
    "train_subset": ("data.train_subset", int, "use only the first N training examples"),
    "resume": (
        "checkpoint.resume",
        str,
        "'auto' (latest valid checkpoint in the run dir) or a path",
    ),
    "checkpoint_every": ("checkpoint.every_steps", int, "also checkpoint every N global steps"),
    "backend": ("backend", str, "auto (NCCL on GPUs, else gloo), gloo or nccl"),
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    if not hasattr(args, "handler"):
        parser.print_help()
        return EXIT_USER_ERROR
    try:
        return args.handler(args) or 0
    except UserError as error:
        print(f"bigbatch: error: {error}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("bigbatch: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bigbatch",
        description="Very-large-batch synchronous data-parallel training with LARS.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    add_train_command(commands)
    add_eval_command(commands)
    add_simple_command(commands, "recipes", "list the shipped recipes", run_recipes)
    add_simple_command(commands, "models", "list the registered models", run_models)
    add_data_command(commands)
    add_plugin_commands(commands)
    return parser


def add_data_command(commands) -> None:
    command = commands.add_parser(
        "data", help="prepare data sets", description="Prepare data sets."
    )
    actions = command.add_subparsers(title="actions", metavar="ACTION")
    pack = actions.add_parser(
        "pack",
        help="pre-resize an image folder into memory-mappable shards",
        description="Pre-resize SRC/{train,val}/<class>/<images> into shards under DST, "
        "read with --dataset packed --data DST.",
    )
    pack.add_argument("src", help="image folder with train/ and val/")
    pack.add_argument("dst", help="output folder")
    pack.add_argument("--short-side", type=int, default=256, help="shorter side after resizing")
    pack.add_argument(
        "--encoding",
        choices=("jpeg", "raw"),
        default="jpeg",
        help="jpeg: re-encoded (small files); raw: uint8 pixels (fastest reads)",
    )
    pack.add_argument("--quality", type=int, default=90, help="JPEG quality")
    pack.add_argument(
        "--format",
        choices=("packed", "webdataset"),
        default="packed",
        help="packed: bigbatch shards (--dataset packed); webdataset: DST/{train,val}-NNNN.tar "
        "of reduced-size JPEGs (--dataset webdataset)",
    )
    pack.add_argument("--workers", type=int, default=None, help="decoding processes")
    pack.add_argument("--overwrite", action="store_true", help="replace splits packed before")
    pack.set_defaults(handler=run_data_pack)
    locate = actions.add_parser("locate", help="show where Fashion-MNIST is found (verified)")
    locate.add_argument("--data", help="a folder to try first")
    locate.set_defaults(handler=run_data_locate)


def add_plugin_commands(commands) -> None:
    """Subcommands whose modules own their options: sweep, plot, inspect, plan, bench, data."""
    from bigbatch.allreduce_bench import add_bench_command
    from bigbatch.inspect_ratios import add_inspect_command
    from bigbatch.plan import add_plan_command
    from bigbatch.plot import add_plot_command
    from bigbatch.sweep import add_sweep_command

    for add in (
        add_sweep_command,
        add_plot_command,
        add_inspect_command,
        add_plan_command,
        add_bench_command,
    ):
        add(commands)


def add_simple_command(commands, name: str, help_text: str, handler: Callable) -> None:
    command = commands.add_parser(name, help=help_text, description=help_text)
    command.set_defaults(handler=handler)


def add_config_options(command: argparse.ArgumentParser) -> None:
    source = command.add_mutually_exclusive_group()
    source.add_argument(
        "--recipe", help="a shipped recipe (see `bigbatch recipes`); default fashion-mnist"
    )
    source.add_argument("--config", help="a YAML config file (e.g. a run's config.yaml)")
    command.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config key, e.g. --set optim.trust_coefficient=0.002",
    )


def add_train_command(commands) -> None:
    command = commands.add_parser("train", help="train a model", description="Train a model.")
    add_config_options(command)
    for flag, (_, kind, help_text) in TRAIN_FLAGS.items():
        command.add_argument(f"--{flag.replace('_', '-')}", dest=flag, type=kind, help=help_text)
    command.set_defaults(handler=run_train)


def add_eval_command(commands) -> None:
    command = commands.add_parser(
        "eval",
        help="evaluate saved weights on the validation set",
        description="Evaluate saved weights (final.pt or a checkpoint).",
    )
    command.add_argument("--weights", required=True, help="final.pt or a checkpoint file")
    command.add_argument("--data", help="data folder, if not the one the weights were trained on")
    command.add_argument("--batch-size", type=int, default=None, help="evaluation batch size")
    command.set_defaults(handler=run_eval)


def setup_logging(verbose: bool) -> None:
    rank = os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "0"
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s [rank {rank}] %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    if rank != "0" and not verbose:
        # Rank 0 reports progress; the others speak only about problems.
        logging.getLogger().setLevel(logging.WARNING)


def overrides_from_flags(args: argparse.Namespace) -> list[str]:
    # A recipe's model options belong to its model: --model starts from the new model's defaults
    # (options given with --set still apply, they come after these).
    assignments = ["model.options={}"] if args.model is not None else []
    for flag, (key, _, _) in TRAIN_FLAGS.items():
        value = getattr(args, flag)
        if value is not None:
            assignments.append(f"{key}={value}")
    return assignments


def run_train(args: argparse.Namespace) -> int:
    from bigbatch.preemption import PREEMPTED_EXIT_CODE, catch_early

    catch_early()  # a preemption signal before or after the training loop must not kill the run
    from bigbatch.config import resolve_config
    from bigbatch.distributed import init_distributed, shutdown
    from bigbatch.engine import NonFiniteLoss, Preempted, train

    cfg = resolve_config(args.recipe, args.config, overrides_from_flags(args) + args.overrides)
    ctx = init_distributed(cfg.backend)
    try:
        summary = train(cfg, ctx)
    except NonFiniteLoss as error:
        logging.getLogger("bigbatch").error("%s", error)
        return EXIT_NONFINITE
    except Preempted as error:
        logging.getLogger("bigbatch").warning("%s; resume with --resume auto", error)
        return PREEMPTED_EXIT_CODE
    finally:
        shutdown()
    if ctx.is_main:
        print(json.dumps(summary))
    return 0


def run_eval(args: argparse.Namespace) -> int:
    from bigbatch.inference import evaluate_weights

    result = evaluate_weights(args.weights, data_path=args.data, batch_size=args.batch_size)
    print(json.dumps(result))
    return 0


def run_data_pack(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from bigbatch.data.pack import pack_imagefolder
    from bigbatch.data.webdataset_write import write_webdataset

    common = dict(short_side=args.short_side, quality=args.quality, workers=args.workers,
                  overwrite=args.overwrite)
    if args.format == "webdataset":
        summary = write_webdataset(args.src, args.dst, **common)
    else:
        summary = pack_imagefolder(args.src, args.dst, encoding=args.encoding, **common)
    print(json.dumps(asdict(summary), default=str))
    return 0


def run_data_locate(args: argparse.Namespace) -> int:
    from bigbatch.data.fashion_mnist import locate_fashion_mnist

    print(locate_fashion_mnist(args.data))
    return 0


def run_recipes(args: argparse.Namespace) -> int:
    from bigbatch.config import load_recipe, recipe_names

    for name in recipe_names():
        print(f"{name:30s} {load_recipe(name).get('description', '')}")
    return 0


def run_models(args: argparse.Namespace) -> int:
    from bigbatch.models import model_names, model_spec
    from bigbatch.models.external import HELP

    for name in model_names():
        spec = model_spec(name)
        print(f"{name:16s} {spec.description}")
        if spec.options:
            defaults = ", ".join(f"{key}={_option_text(value)}"
                                 for key, value in spec.options.items())
            print(f"{'':16s} options (--set model.options.NAME=VALUE): {defaults}")
    for name, text in HELP:
        print(f"{name:16s} {text}")
    return 0


def _option_text(default: object) -> str:
    """How a default reads on the command line (YAML spelling; None is 'auto')."""
    if default is None:
        return "auto"
    if isinstance(default, bool):
        return str(default).lower()
    return str(default)


if __name__ == "__main__":
    sys.exit(main())
