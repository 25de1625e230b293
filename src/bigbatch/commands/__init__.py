"""The `bigbatch` command line: all argument parsing, each command a thin call into the library.

    bigbatch train                       # the default recipe (Fashion-MNIST, LARS, batch 4096)
    bigbatch train --recipe imagenet-resnet50-32k --data /data/imagenet
    torchrun --nproc-per-node 4 -m bigbatch train --recipe fashion-mnist
    bigbatch eval --weights runs/fashion-mnist/final.pt
    bigbatch recipes

Exit codes: 0 done; 2 bad input (one line on stderr says what to change); 3 stopped on a
non-finite loss; 75 preempted after writing a checkpoint (resume with --resume auto).

Building the parser imports no part of the library that needs torch: each command imports what
it runs when it runs, so `bigbatch --help`, `bigbatch recipes` and a misspelt recipe answer at
once.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from bigbatch.commands import bench, catalog, data, inspect, plan, plot, sweep, train
from bigbatch.errors import EXIT_USER_ERROR, UserError

COMMANDS = (train, catalog, data, sweep, plot, inspect, plan, bench)


def main(argv: list[str] | None = None) -> int:
    code = run_command(argv)
    if "bigbatch.distributed" in sys.modules:  # imported by the commands that join a group
        sys.modules["bigbatch.distributed"].exit_if_joined(code)
    return code


def run_command(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for ranks started by train
    setup_logging(args.verbose)
    if not hasattr(args, "handler"):
        parser.print_help()
        return EXIT_USER_ERROR
    try:
        code = args.handler(args) or 0
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except UserError as error:
        print(f"bigbatch: error: {error}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("bigbatch: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`bigbatch recipes | head -1`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit's flush
        return 141  # what a shell reports for a process killed by SIGPIPE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bigbatch",
        description="Very-large-batch synchronous data-parallel training with LARS.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    for module in COMMANDS:
        module.add_commands(commands)
    return parser


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
