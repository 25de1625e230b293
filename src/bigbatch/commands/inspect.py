"""`bigbatch inspect`: its options, and the call into bigbatch.tools.inspect."""

from __future__ import annotations

import argparse

from bigbatch.config import apply_overrides


def add_commands(commands) -> argparse.ArgumentParser:
    command = commands.add_parser(
        "inspect", help="‖w‖/‖∇w‖ per layer at the first iteration (why LARS)",
        description="Print the ratio of weight norm to gradient norm of every parameter tensor "
                    "of a fresh model after one forward/backward pass (LARS paper, Table 2).")
    command.add_argument("--model", required=True, help="model name (see `bigbatch models`)")
    command.add_argument("--dataset", default="synthetic",
                         help="data set: synthetic, fashion-mnist, imagefolder or packed "
                              "(default synthetic)")
    command.add_argument("--data", default=None, metavar="DIR",
                         help="data folder (imagefolder and packed; optional for fashion-mnist)")
    command.add_argument("--image-size", type=int, default=None,
                         help="input side (default: the model's, e.g. 227 for AlexNet)")
    command.add_argument("--batch", type=int, default=8, help="examples in the batch")
    command.add_argument("--seed", type=int, default=0, help="initialisation and data seed")
    command.add_argument("--input-std", type=float, default=1.0,
                         help="scale of the input relative to normalised images (default 1, "
                              "what training feeds the model)")
    command.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                         help="model option, e.g. --option init=torch (repeatable; the options "
                              "of a model are listed by `bigbatch models`)")
    command.set_defaults(handler=run_inspect_command)
    return command


def run_inspect_command(args: argparse.Namespace) -> int:
    from bigbatch.tools.inspect import (
        default_image_size,
        format_table,
        inspect_model,
        paper_values_for,
        spread_summary,
    )

    options = apply_overrides({}, args.option, flag="--option")
    rows = inspect_model(args.model, args.dataset, args.image_size, args.batch, args.seed,
                         args.input_std, options, args.data)
    paper = paper_values_for(args.model)
    size = args.image_size or default_image_size(args.model, args.dataset)
    chosen = "".join(f", {key}={value}" for key, value in options.items())
    print(f"{args.model}{chosen}: first iteration, {args.dataset} data, batch {args.batch}, "
          f"{size}x{size} input of std {args.input_std:g}, fresh weights (seed {args.seed})")
    print(format_table(rows, paper))
    print(spread_summary(rows))
    if paper is not None:
        print("paper: LARS paper (You, Gitman, Ginsburg 2017) Table 2, AlexNet on ImageNet in "
              "Caffe; every ratio grows about as sqrt(batch) and depends on the data, so compare "
              "the order and spread across layers rather than single values "
              "(docs/results/trust_ratio/)")
    return 0
