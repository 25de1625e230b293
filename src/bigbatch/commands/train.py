"""`bigbatch train` and `bigbatch eval`: their options, and the calls into the library."""

from __future__ import annotations

import argparse
import json
import logging
from typing import TYPE_CHECKING, Any

from bigbatch.errors import EXIT_NONFINITE, EXIT_PEER_LOST, EXIT_PREEMPTED, UserError

if TYPE_CHECKING:
    from bigbatch.config import RunConfig

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
    "val_subset": ("data.val_subset", int, "evaluate on N validation examples only (Fashion-MNIST: "
                   "the first N; folders and shards: spread evenly over them)"),
    "resume": (
        "checkpoint.resume",
        str,
        "'auto' (latest valid checkpoint in the run dir) or a path",
    ),
    "checkpoint_every": ("checkpoint.every_steps", int, "also checkpoint every N global steps"),
    "backend": ("backend", str, "auto (NCCL on GPUs, else gloo), gloo or nccl"),
    "local_processes": ("local_processes", str, "training processes this command starts on "
                        "this machine: N, or auto (one per core where no GPU is visible); "
                        "ignored under torchrun and SLURM"),
}


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
    command.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="eval.* keys and data.val_subset only, e.g. --set eval.bn_recompute=200 (BatchNorm "
             "statistics recomputed from 200 training micro-batches), --set data.val_subset=null "
             "(the whole validation set, for weights of a run evaluated on a subset)")
    command.set_defaults(handler=run_eval)


def add_commands(commands) -> None:
    add_train_command(commands)
    add_eval_command(commands)


def values_from_flags(args: argparse.Namespace) -> dict[str, Any]:
    """{dotted config key: value} of the flags given, already of the key's type (argparse
    converted them); `--set` assignments are applied after these."""
    # A recipe's model options belong to its model: --model starts from the new model's defaults
    # (options given with --set still apply, they come after these).
    values: dict[str, Any] = {"model.options": {}} if args.model is not None else {}
    for flag, (key, _, _) in TRAIN_FLAGS.items():
        value = getattr(args, flag)
        if value is not None:
            values[key] = value
    return values


def run_train(args: argparse.Namespace) -> int:
    from bigbatch.train.preemption import catch_early, ignore_from_now

    catch_early()  # a preemption signal before or after the training loop must not kill the run
    try:
        return train_with_ranks(args)
    finally:
        ignore_from_now()  # nor one that comes while the process exits


def train_with_ranks(args: argparse.Namespace) -> int:
    """This process's rank and, where the config asks for several on this machine, the others
    as its children; the run's exit code."""
    from bigbatch.config import resolve_config

    cfg = resolve_config(args.recipe, args.config, args.overrides, values_from_flags(args))
    from bigbatch.local_launch import finish_local_ranks, local_processes, start_local_ranks

    processes = local_processes(cfg)
    if processes == 1:
        return train_here(cfg)
    ranks = start_local_ranks(args.argv, processes, cfg)
    try:
        code = train_here(cfg)
    except (UserError, KeyboardInterrupt):  # one line, or "interrupted", once the ranks ended
        finish_local_ranks(ranks, code=1)  # the exit code is the exception's, not this one
        raise
    except Exception:  # this rank failed; the job's exit code may be the rank that caused it
        logging.getLogger("bigbatch").exception("rank 0 failed")
        code = 1
    return finish_local_ranks(ranks, code)


def train_here(cfg: RunConfig) -> int:
    """Train as this process's rank; the exit code."""
    from bigbatch.distributed import init_distributed, shutdown  # torch: once the config is valid
    from bigbatch.peers import PeerLost
    from bigbatch.train import NonFiniteLoss, Preempted, train

    ctx = init_distributed(cfg.backend, cfg.collective_timeout)
    try:
        summary = train(cfg, ctx)
    except NonFiniteLoss as error:
        logging.getLogger("bigbatch").error("%s", error)
        return EXIT_NONFINITE
    except Preempted as error:
        logging.getLogger("bigbatch").warning("%s; resume with --resume auto", error)
        return EXIT_PREEMPTED
    except PeerLost as error:
        logging.getLogger("bigbatch").error("%s", error)
        return EXIT_PEER_LOST
    finally:
        shutdown()
    if ctx.is_main:
        print(json.dumps(summary))
    return 0


def run_eval(args: argparse.Namespace) -> int:
    from bigbatch.inference import evaluate_weights

    result = evaluate_weights(args.weights, data_path=args.data, batch_size=args.batch_size,
                              overrides=args.overrides)
    print(json.dumps(result))
    return 0
