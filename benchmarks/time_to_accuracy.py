"""Fashion-MNIST time to a test top-1 target: the default large-batch recipe against the small-batch
SGD baseline recipe.

    python benchmarks/time_to_accuracy.py [--target 90] [--repeats 1] [--threads N] [--full]
        [--recipes fashion-mnist,fashion-mnist-baseline] [--set KEY=VALUE ...] [--no-save]

Each recipe runs as `bigbatch train --recipe R --set eval_every=1` in a child process (repeats
interleaved, the order rotated, so a busy spell of a shared machine does not hit one recipe only).
While it runs, metrics.jsonl is polled and the wall-clock time at which each evaluation record
appears is noted. Two clocks are reported for the first evaluation at or above the target:

* wall seconds: from launching the process to the record's appearance (start-up, data loading,
  every evaluation before it and the checkpoints written at epoch ends included), what a user
  waits;
* training seconds: the sum of the per-step times the engine logged up to that evaluation
  (global batch / images_per_second of each step), the optimisation alone.

Without --full a run is stopped once it reaches the target (the schedule is fixed in advance, so
what happens up to that point does not depend on stopping). The resolved config of each recipe
and the git commit are recorded, so the figure names the recipe version it measured. The JSON
record goes to stdout and is appended to docs/results/time_to_accuracy.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import load_average, machine_info, median, report, rotated  # noqa: E402

RESULT_NAME = "time_to_accuracy"
POLL_SECONDS = 0.2


@dataclass
class EvalPoint:
    epoch: float
    step: int
    top1: float
    wall_seconds: float
    train_seconds: float


@dataclass
class RecipeRun:
    recipe: str
    reached: EvalPoint | None = None
    evals: list[EvalPoint] = field(default_factory=list)
    stopped_early: bool = False
    exit_code: int | None = None
    images_per_second_median: float | None = None
    config: dict[str, Any] = field(default_factory=dict)


def read_new_records(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Complete JSON lines appended to ``path`` since byte ``offset``; the new offset."""
    if not path.exists():
        return [], offset
    with path.open("rb") as file:
        file.seek(offset)
        chunk = file.read()
    complete = chunk[: chunk.rfind(b"\n") + 1]
    records = []
    for line in complete.decode().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records, offset + len(complete)


def train_command(recipe: str, out: Path, threads: int | None, overrides: list[str]) -> list[str]:
    command = [sys.executable, "-m", "bigbatch", "train", "--recipe", recipe,
               "--set", "eval_every=1", "--set", "log_every=1", "--set", f"out={out}"]
    if threads is not None:
        command += ["--set", f"threads={threads}"]
    for assignment in overrides:
        command += ["--set", assignment]
    return command


def run_recipe(recipe: str, target: float, full: bool, threads: int | None,
               overrides: list[str], root: Path) -> RecipeRun:
    """Train ``recipe`` in a child process, timing each evaluation as it is logged."""
    out = Path(tempfile.mkdtemp(prefix=f"{recipe}-", dir=root))
    metrics = out / "metrics.jsonl"
    result = RecipeRun(recipe)
    train_seconds, offset, rates = 0.0, 0, []
    log_file = (out / "log.txt").open("w")
    started = time.perf_counter()
    process = subprocess.Popen(train_command(recipe, out, threads, overrides),
                               stdout=log_file, stderr=subprocess.STDOUT)
    global_batch = None
    while True:
        finished = process.poll() is not None
        records, offset = read_new_records(metrics, offset)
        now = time.perf_counter() - started
        if global_batch is None and (out / "config.yaml").exists():
            result.config = yaml.safe_load((out / "config.yaml").read_text())
            global_batch = result.config["global_batch"]
        for record in records:
            if record.get("kind") == "train" and global_batch:
                rates.append(record["images_per_second"])
                train_seconds += global_batch / record["images_per_second"]
            elif record.get("kind") == "eval":
                point = EvalPoint(record["epoch"], record["step"], record["top1"], round(now, 2),
                                  round(train_seconds, 2))
                result.evals.append(point)
                if result.reached is None and point.top1 >= target:
                    result.reached = point
        if result.reached is not None and not full and not finished:
            process.kill()
            process.wait()
            result.stopped_early = True
            break
        if finished:
            break
        time.sleep(POLL_SECONDS)
    log_file.close()
    result.exit_code = process.returncode
    result.images_per_second_median = round(median(rates), 1) if rates else None
    if result.exit_code not in (0, None) and not result.stopped_early:
        tail = (out / "log.txt").read_text()[-2000:]
        raise RuntimeError(f"bigbatch train --recipe {recipe} failed ({result.exit_code}):\n{tail}")
    return result


def config_digest(config: dict[str, Any]) -> dict[str, Any]:
    """The fields that define a recipe's speed and accuracy, for the record."""
    keys = ("epochs", "global_batch", "micro_batch", "label_smoothing", "precision",
            "channels_last", "threads")
    digest = {key: config.get(key) for key in keys}
    for section in ("model", "optim", "schedule", "data"):
        digest[section] = config.get(section)
    return digest


def summary_of(runs: list[RecipeRun]) -> dict[str, Any]:
    reached = [r.reached for r in runs if r.reached is not None]
    return {
        "reached_in": f"{len(reached)}/{len(runs)} runs",
        "wall_seconds_median": median(p.wall_seconds for p in reached) if reached else None,
        "train_seconds_median": median(p.train_seconds for p in reached) if reached else None,
        "epochs_median": median(p.epoch for p in reached) if reached else None,
        "best_top1": max((e.top1 for r in runs for e in r.evals), default=None),
        "images_per_second_median": median(r.images_per_second_median for r in runs
                                           if r.images_per_second_median) if runs else None,
        "config": config_digest(runs[0].config) if runs and runs[0].config else None,
        "runs": [asdict(r) | {"config": None} for r in runs],
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=float, default=90.0, help="test top-1 in percent")
    parser.add_argument("--recipes", default="fashion-mnist,fashion-mnist-baseline",
                        help="the recipe measured, then the yardstick it is compared with")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None,
                        help="intra-op threads for both (--set threads=N); default PyTorch's")
    parser.add_argument("--full", action="store_true", help="run every recipe to its end")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override for every recipe (e.g. a quick test)")
    parser.add_argument("--no-save", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    recipes = args.recipes.split(",")
    load_before = load_average()
    runs: dict[str, list[RecipeRun]] = {recipe: [] for recipe in recipes}
    with tempfile.TemporaryDirectory(prefix="time-to-accuracy-") as tmp:
        for repeat in range(args.repeats):
            for recipe in rotated(recipes, repeat):
                run = run_recipe(recipe, args.target, args.full, args.threads, args.overrides,
                                 Path(tmp))
                reached = asdict(run.reached) if run.reached else "not reached"
                print(f"# {recipe}: {reached}", file=sys.stderr, flush=True)
                runs[recipe].append(run)
    summaries = {recipe: summary_of(recipe_runs) for recipe, recipe_runs in runs.items()}
    measured, yardstick = recipes[0], recipes[-1]
    record = {
        "benchmark": RESULT_NAME, "target_top1": args.target, "threads": args.threads,
        "overrides": args.overrides, "stopped_at_target": not args.full,
        "recipes": summaries,
        f"{yardstick}_over_{measured}": {
            "wall_seconds": ratio(summaries[yardstick]["wall_seconds_median"],
                                  summaries[measured]["wall_seconds_median"]),
            "train_seconds": ratio(summaries[yardstick]["train_seconds_median"],
                                   summaries[measured]["train_seconds_median"]),
        },
        "load_before": load_before, "load_after": load_average(),
        "machine": machine_info(),
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
    }
    report(RESULT_NAME, record, save=not args.no_save)
    return record


if __name__ == "__main__":
    main()
