"""How far runs on 1, 2 and 4 gloo processes drift apart at the default recipe's model.

The same global batch B, micro-batch b and seed give the same run at any world size up to the
order in which micro-batch gradients are summed (a last-bit difference after one step); training
dynamics amplify it, the more so the larger the LR. This script measures it: the default recipe's
model (small_resnet, width 24), fp32, contiguous memory (or channels_last, the recipe's), in the
default mode or with exact_reduction, on a Fashion-MNIST subset, at the LRs given,
for each world size; per logged step, the largest relative loss difference from the 1-process
run, and at the end the largest relative difference over every tensor of the final state.

    python benchmarks/world_size_invariance.py   # appends docs/results/world_size_invariance.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from common import append_result, machine_info

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from launch import max_relative_difference  # noqa: E402  (the tests' own measure)


def run_args(lr: float, steps: int, examples: int, batch: int, micro: int,
             channels_last: bool = False, exact: bool = False) -> list[str]:
    epochs = steps * batch / examples
    return ["--dataset", "fashion-mnist", "--train-subset", str(examples), "--batch-size",
            str(batch), "--micro-batch", str(micro), "--epochs", f"{epochs:g}", "--lr", str(lr),
            "--warmup-epochs", "0", "--model", "small_resnet", "--set", "model.options.width=24",
            "--set", "precision=fp32", "--set", f"channels_last={str(channels_last).lower()}",
            "--set", f"exact_reduction={str(exact).lower()}", "--set", "eval_every=1000"]


def train(args: list[str], nproc: int, out: Path) -> tuple[list[float], dict]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("BIGBATCH_FAULT", None)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={nproc}", "-m", "bigbatch"] if nproc > 1 else \
               [sys.executable, "-m", "bigbatch"]
    subprocess.run([*launcher, "train", *args, "--out", str(out)], env=env, check=True,
                   capture_output=True, text=True)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    state = torch.load(out / "final.pt", map_location="cpu", weights_only=True)["model"]
    return losses, state


def measure(lr: float, steps: int, world_sizes: list[int], scratch: Path, **options) -> dict:
    args = run_args(lr, steps, **options)
    runs = {n: train(args, n, scratch / f"lr{lr}-s{steps}-w{n}") for n in world_sizes}
    reference_losses, reference_state = runs[world_sizes[0]]
    result = {"lr": lr, "steps": steps, "by_world_size": {}}
    for n, (losses, state) in runs.items():
        per_step = [abs(a - b) / abs(b) for a, b in zip(losses, reference_losses, strict=True)]
        result["by_world_size"][str(n)] = {
            "loss_relative_difference_per_step": per_step,
            "bit_identical": losses == reference_losses and all(
                torch.equal(state[key], reference_state[key]) for key in state),
            "final_state_max_relative_difference": max_relative_difference(state,
                                                                           reference_state),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lrs", default="0.5,20")
    parser.add_argument("--steps", default="16")
    parser.add_argument("--world-sizes", default="1,2,4")
    parser.add_argument("--examples", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--micro-batch", type=int, default=256)
    parser.add_argument("--channels-last", action="store_true", help="the recipe's memory format")
    parser.add_argument("--exact", action="store_true", help="--set exact_reduction=true")
    parser.add_argument("--no-record", action="store_true")
    options = parser.parse_args()
    world_sizes = [int(n) for n in options.world_sizes.split(",")]
    sizes = dict(examples=options.examples, batch=options.batch, micro=options.micro_batch)
    modes = dict(channels_last=options.channels_last, exact=options.exact)
    with tempfile.TemporaryDirectory() as scratch:
        results = [measure(float(lr), int(steps), world_sizes, Path(scratch), **sizes, **modes)
                   for lr in options.lrs.split(",") for steps in options.steps.split(",")]
    record = {"benchmark": "world_size_invariance", "model": "small_resnet width 24",
              "precision": "fp32",
              "memory_format": "channels_last" if options.channels_last else "contiguous",
              "exact_reduction": options.exact, "warmup": 0,
              "optimizer": "lars (default recipe)", **sizes, "world_sizes": world_sizes,
              "command": "python benchmarks/world_size_invariance.py " + " ".join(sys.argv[1:]),
              "results": results, "machine": machine_info()}
    if not options.no_record:
        append_result("world_size_invariance", record)
    print(json.dumps(record))


if __name__ == "__main__":
    main()
