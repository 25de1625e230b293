"""`bigbatch bench allreduce` (also `python -m bigbatch.commands.bench` under torchrun): its
options, and the call into bigbatch.tools.allreduce_bench."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from bigbatch.errors import ConfigError, UserError
from bigbatch.tools.allreduce_bench import message_sizes, parse_size, run_benchmark


def add_allreduce_options(command: argparse.ArgumentParser) -> None:
    # torchrun reads an argument it can take for one of its own options (--max for --max-restarts)
    # even after the module name, so the unambiguous spellings come first.
    command.add_argument("--min-bytes", "--min", dest="min", default="1K",
                         help="smallest message (default 1K)")
    command.add_argument("--max-bytes", "--max", dest="max", default="256M",
                         help="largest message (default 256M; under torchrun write --max-bytes)")
    command.add_argument("--factor", type=int, default=4, help="size step, 2 or 4 (default 4)")
    command.add_argument("--repeats", type=int, default=10, help="timed repeats (default 10)")
    command.add_argument("--warmup", type=int, default=2, help="untimed repeats (default 2)")
    command.add_argument("--backend", default="auto", help="auto (NCCL on GPUs, else gloo), "
                                                           "gloo or nccl")
    command.add_argument("--out", help="also write the JSON result to this file (rank 0)")


def add_commands(commands) -> argparse.ArgumentParser:
    """Register ``bigbatch bench allreduce`` on argparse sub-parsers."""
    bench = commands.add_parser("bench", help="micro-benchmarks (allreduce)",
                                description="Micro-benchmarks.")
    kinds = bench.add_subparsers(title="benchmarks", metavar="BENCHMARK")
    allreduce = kinds.add_parser(
        "allreduce", help="all-reduce time against message size, with its alpha-beta fit",
        description="All-reduce time against message size for the current world (launch "
                    "with torchrun), fitted by t(n) = a + b n.")
    add_allreduce_options(allreduce)
    allreduce.set_defaults(handler=run_allreduce_bench)
    return allreduce


def run_allreduce_bench(args: argparse.Namespace) -> int:
    sizes = message_sizes(parse_size(args.min), parse_size(args.max), args.factor)
    if args.repeats < 1 or args.warmup < 0:
        raise ConfigError(f"--repeats must be >= 1 and --warmup >= 0, got {args.repeats} and "
                          f"{args.warmup}")
    from bigbatch.distributed import init_distributed, launch_env, shutdown

    if launch_env().world_size < 2:
        raise ConfigError("the all-reduce benchmark needs at least 2 processes: run it under "
                          "torchrun --nproc-per-node 2 (or more)")
    ctx = init_distributed(args.backend)
    try:
        result = run_benchmark(sizes, args.repeats, args.warmup, ctx)
    finally:
        shutdown()
    if ctx.is_main:
        text = json.dumps(result, indent=2)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(text + "\n")
        print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m bigbatch.commands.bench``: the same command without the CLI around it."""
    parser = argparse.ArgumentParser(prog="python -m bigbatch.commands.bench",
                                     description=__doc__.split("\n\n")[0])
    add_allreduce_options(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        return run_allreduce_bench(args)
    except UserError as error:
        print(f"bigbatch: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
