"""`bigbatch sweep`: its options, and the call into bigbatch.tools.sweep."""

from __future__ import annotations

import argparse
from pathlib import Path

from bigbatch.errors import ConfigError
from bigbatch.tools.sweep.records import markdown_table
from bigbatch.tools.sweep.runner import run_sweep
from bigbatch.tools.sweep.search import DEFAULT_RULES, LRRule, SweepSettings
from bigbatch.tools.sweep.series import SERIES


def parse_int_list(text: str, option: str) -> tuple[int, ...]:
    """'128,256, 512' -> (128, 256, 512); ConfigError naming the option on anything else."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise ConfigError(f"{option} is empty; give comma-separated integers such as 128,1024")
    values = []
    for item in items:
        try:
            values.append(int(item))
        except ValueError:
            raise ConfigError(f"{option}: '{item}' is not an integer") from None
    return tuple(values)


def parse_name_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip().lower() for item in text.split(",") if item.strip())


def add_commands(commands) -> argparse.ArgumentParser:
    command = commands.add_parser(
        "sweep", help="batch-size scaling study: best top-1 per batch size and optimizer",
        description="Train an LR grid for every (batch size, optimizer) point at a fixed epoch "
                    "budget and report the best top-1 per point (resumable).")
    source = command.add_mutually_exclusive_group()
    source.add_argument("--recipe",
                        help="base recipe (see `bigbatch recipes`); default fashion-mnist")
    source.add_argument("--config", help="base YAML config file")
    command.add_argument("--batch-sizes", required=True, help="comma-separated global batches")
    command.add_argument("--optimizers", default="sgd,lars",
                         help="comma-separated series: " + ", ".join(
                             f"{name} ({series.label})" for name, series in SERIES.items()))
    command.add_argument("--epochs", type=float, required=True, help="epoch budget of every run")
    command.add_argument("--lrs-per-point", type=int, default=3, help="initial LR grid size")
    command.add_argument("--lr-grid-factor", type=float, default=2.0, help="ratio of neighbour LRs")
    command.add_argument("--max-extensions", type=int, default=2,
                         help="LRs added per point when the best is at the grid's edge")
    command.add_argument("--no-anchor", dest="anchor", action="store_false",
                         help="centre every batch on the rule as given instead of on the best "
                              "LR of the smallest batch scaled by the rule")
    command.add_argument("--warmup-epochs", type=float, default=None,
                         help="warmup of every run, both optimizers (default: the recipe's)")
    command.add_argument("--micro-batch", type=int, default=128,
                         help="micro-batch = BatchNorm batch of every run (capped at the batch)")
    for name, rule in DEFAULT_RULES.items():
        command.add_argument(f"--{name}-lr", type=float, default=rule.lr,
                             help=f"{name} grid centre at its reference batch "
                                  f"(default {rule.lr:g})")
        command.add_argument(f"--{name}-reference-batch", type=int, default=rule.reference_batch,
                             help=f"reference batch of the {name} rule ({rule.scaling} scaling)")
    command.add_argument("--seeds", default=None,
                         help="comma-separated seeds: rerun each point's best LR with each")
    command.add_argument("--seed-batches", default=None,
                         help="comma-separated batches whose points get --seeds (default all)")
    command.add_argument("--train-subset", type=int, default=None,
                         help="use the first N training examples (quick runs)")
    command.add_argument("--set", dest="overrides", action="append", default=[],
                         metavar="KEY=VALUE", help="override a config key of every run")
    command.add_argument("--torchrun", type=int, default=None, metavar="N",
                         help="run each training under torchrun with N local processes")
    command.add_argument("--threads", type=int, default=None,
                         help="torch intra-op threads for in-process runs")
    command.add_argument("--out", required=True, help="sweep folder")
    command.set_defaults(handler=run_sweep_command)
    return command


def settings_from_args(args: argparse.Namespace) -> SweepSettings:
    overrides = list(args.overrides)
    if args.train_subset is not None:
        overrides.append(f"data.train_subset={args.train_subset}")
    rules = {
        name: LRRule(getattr(args, f"{_dest(name)}_lr"),
                     getattr(args, f"{_dest(name)}_reference_batch"), rule.scaling)
        for name, rule in DEFAULT_RULES.items()
    }
    for name, rule in rules.items():
        if not (rule.lr > 0 and rule.reference_batch > 0):
            raise ConfigError(f"--{name}-lr and --{name}-reference-batch must be positive")
    return SweepSettings(
        batch_sizes=parse_int_list(args.batch_sizes, "--batch-sizes"),
        optimizers=parse_name_list(args.optimizers),
        epochs=args.epochs,
        lrs_per_point=args.lrs_per_point,
        lr_grid_factor=args.lr_grid_factor,
        max_extensions=args.max_extensions,
        warmup_epochs=args.warmup_epochs,
        micro_batch=args.micro_batch,
        recipe=args.recipe,
        config_file=args.config,
        overrides=tuple(overrides),
        rules=rules,
        torchrun=args.torchrun,
        anchor=args.anchor,
        seeds=parse_int_list(args.seeds, "--seeds") if args.seeds is not None else (),
        seed_batches=(parse_int_list(args.seed_batches, "--seed-batches")
                      if args.seed_batches is not None else ()),
    ).check()


def _dest(name: str) -> str:
    """argparse's attribute name of a series' options: lars-paper -> lars_paper."""
    return name.replace("-", "_")


def run_sweep_command(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    if args.threads is not None:
        if args.threads < 1:
            raise ConfigError(f"--threads must be positive, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    points = run_sweep(settings, args.out)
    print(markdown_table(points, settings.optimizers), end="")
    print(f"wrote {Path(args.out) / 'sweep.csv'}, sweep.json and sweep.md")
    return 0
