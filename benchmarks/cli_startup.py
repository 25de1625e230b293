"""How long the command line takes to answer when it has no training to do.

    python benchmarks/cli_startup.py                          # this checkout
    python benchmarks/cli_startup.py --compare /path/to/other/src --label-compare before

Times `bigbatch --help`, `bigbatch recipes`, `bigbatch train --recipe no-such-recipe` (a config
error, exit 2) and a one-step training run (one process, LARS, 256 Fashion-MNIST images, a
4-channel small ResNet, then the evaluation on the 10,000 test images: what a run costs beyond its
steps) as fresh processes, interleaved round by round with the same commands run against another
source tree (``--compare``: its ``src`` folder, put first on PYTHONPATH), and appends the medians
and ranges to docs/results/cli_startup.jsonl. A command that exits with another code than its
own stops the benchmark (the training run needs Fashion-MNIST).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, append_result, interleaved_rounds, load_average, machine_info, median

# name: (arguments, the exit code it must give); "{out}" becomes a fresh folder for each run.
COMMANDS = {
    "help": (["--help"], 0),
    "recipes": (["recipes"], 0),
    "misspelt_recipe": (["train", "--recipe", "no-such-recipe"], 2),
    "one_step_train": (["train", "--dataset", "fashion-mnist", "--train-subset", "256",
                        "--batch-size", "256", "--micro-batch", "256", "--epochs", "1",
                        "--warmup-epochs", "0", "--model", "small_resnet",
                        "--set", "model.options.width=4", "--out", "{out}"], 0),
}


def timed_run(source: Path, arguments: list[str], expected: int) -> float:
    """Wall seconds of ``python -m bigbatch ARGUMENTS`` with ``source`` first on the path."""
    env = dict(os.environ, PYTHONPATH=str(source))
    with tempfile.TemporaryDirectory() as scratch:
        command = [a.replace("{out}", str(Path(scratch) / "run")) for a in arguments]
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "bigbatch", *command], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              check=False)
        seconds = time.perf_counter() - started
    if done.returncode != expected:
        sys.exit(f"cli_startup: `bigbatch {' '.join(arguments)}` from {source} exited "
                 f"{done.returncode}, not {expected}: {done.stderr.strip()[-300:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed runs of each (default 5)")
    parser.add_argument("--compare", type=Path, help="another checkout's src folder")
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--label-compare", default="compared")
    args = parser.parse_args()
    trees = {args.label: REPO / "src"}
    if args.compare:
        trees[args.label_compare] = args.compare
    methods = {f"{tree}: {name}": (lambda s=source, a=arguments, e=code: timed_run(s, a, e))
               for tree, source in trees.items() for name, (arguments, code) in COMMANDS.items()}
    load_before = load_average()
    times = interleaved_rounds(methods, args.rounds)
    record = {
        "benchmark": "cli_startup",
        "machine": machine_info(),
        "load_before": load_before,
        "load_after": load_average(),
        "rounds": args.rounds,
        "seconds": {name: {"median": round(median(values), 3), "min": round(min(values), 3),
                           "max": round(max(values), 3), "all": [round(v, 3) for v in values]}
                    for name, values in times.items()},
    }
    path = append_result("cli_startup", record)
    for name, stats in record["seconds"].items():
        print(f"{name:40s} median {stats['median']:.2f} s (range {stats['min']:.2f}-"
              f"{stats['max']:.2f})")
    print(f"record appended to {path}")


if __name__ == "__main__":
    main()
