"""`bigbatch plot`: its options, and the call into bigbatch.tools.plot."""

from __future__ import annotations

import argparse

from bigbatch.tools.plot import plot_target


def add_commands(commands) -> argparse.ArgumentParser:
    command = commands.add_parser(
        "plot", help="PNG figure of a run or a sweep",
        description="Plot a sweep (top-1 against batch size) or a run (loss, top-1, LR and LARS "
                    "trust ratios against step).")
    command.add_argument("target", metavar="RUN_OR_SWEEP_DIR")
    command.add_argument("--out", default=None, help="PNG file (default: in the folder)")
    command.set_defaults(handler=run_plot_command)
    return command


def run_plot_command(args: argparse.Namespace) -> int:
    path = plot_target(args.target, args.out)
    print(f"wrote {path}")
    return 0
