"""The default example as a new user runs it: `bigbatch train` with no other arguments than the
seed and the run folder, one seed after another, timed around the whole command.

    python benchmarks/default_recipe.py                   # seeds 0, 1, 2 into runs/default_recipe/
    python benchmarks/default_recipe.py --seeds 0,1,2,3
    python benchmarks/default_recipe.py --avx2    # fp32, kernels held to AVX2 (a stand-in)
    python benchmarks/default_recipe.py --set epochs=12 --set local_processes=1   # a variant

One line per finished seed is appended to docs/results/default_recipe/seeds.jsonl (the seed, test
top-1, wall time of the command, peak memory, steps, the machine and its load before and after).
Peak memory is given three ways: rank 0's peak resident set (summary.json), and the peaks of
the sums over the command and every process it starts (the ranks of ``local_processes``) of
their proportional and of their resident set sizes, sampled every 2 seconds.
With ``--avx2`` the runs are fp32 with PyTorch's and oneDNN's kernels held to AVX2
(common.AVX2_ONLY) on a CPU that has more: a stand-in for an AVX2-only CPU that keeps its
instruction set, not its clock, caches or memory; such lines say ``"kernels_held_to_avx2": true``.
``--set KEY=VALUE`` (repeatable) times a variant of the recipe; its lines list the overrides.
A seed whose line is already there for the same commit, the same kind of CPU (native bf16 or
not), the same ``--avx2`` and the same overrides is not run again, so rerunning the command
continues where it stopped. The summary line printed at the end gives the median and range over
the seeds recorded for this commit and kind.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import (
    AVX2_ONLY,
    REPO,
    RESULTS_DIR,
    cpu_flags,
    cpu_has_native_bf16,
    git_commit,
    load_average,
    machine_info,
    process_tree_memory_mib,
)

RECORD = RESULTS_DIR / "default_recipe" / "seeds.jsonl"


def recorded(commit: str | None, native_bf16: bool, avx2: bool,
             overrides: list[str]) -> dict[int, dict]:
    """The seeds already recorded for ``commit`` on a CPU with (or without) native bf16, with
    (or without) the kernels held to AVX2, with these overrides of the recipe."""
    if not RECORD.exists():
        return {}
    lines = [json.loads(line) for line in RECORD.read_text().splitlines() if line.strip()]
    return {line["seed"]: line for line in lines if line["machine"]["commit"] == commit
            and line["machine"]["cpu_native_bf16"] == native_bf16
            and line.get("kernels_held_to_avx2", False) == avx2
            and line.get("overrides", []) == overrides}


def run_seed(seed: int, out: Path, avx2: bool, overrides: list[str]) -> dict:
    shutil.rmtree(out, ignore_errors=True)  # an interrupted seed starts over, timed whole
    load_before = load_average()
    start = time.perf_counter()
    held = ["--set", "precision=fp32"] if avx2 else []
    held += [arg for override in overrides for arg in ("--set", override)]
    command = subprocess.Popen([sys.executable, "-m", "bigbatch", "train", "--seed", str(seed),
                                "--out", str(out), *held], cwd=REPO,
                               env={**os.environ, **(AVX2_ONLY if avx2 else {})})
    peak = {"pss": 0.0, "rss": 0.0}  # of the command and the processes it starts
    while command.poll() is None:
        now = process_tree_memory_mib(command.pid)
        peak = {key: max(peak[key], now[key]) for key in peak}
        time.sleep(2.0)  # reading smaps costs CPU: every 0.5 s took about 4% of the machine
    wall = time.perf_counter() - start
    if command.returncode:
        raise SystemExit(f"seed {seed}: bigbatch train exited {command.returncode}")
    summary = json.loads((out / "summary.json").read_text())
    return {"benchmark": "default_recipe", "seed": seed, "top1": summary["top1"],
            "trained_top1": summary.get("trained_top1"),
            "wall_seconds": round(wall, 1), "train_wall_seconds": summary["wall_seconds"],
            "peak_memory_mib": summary.get("peak_memory_mib"),
            "peak_pss_mib_all_processes": round(peak["pss"], 1),
            "peak_rss_mib_all_processes": round(peak["rss"], 1),
            "world_size": summary["world_size"], "steps": summary["steps"],
            "global_batch": summary["global_batch"], "model": summary["model"],
            "kernels_held_to_avx2": avx2, "overrides": overrides,
            "load_before": load_before, "machine": machine_info()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", default=str(REPO / "runs" / "default_recipe"))
    parser.add_argument("--avx2", action="store_true",
                        help="fp32 with the kernels held to AVX2 (a stand-in for an AVX2-only CPU)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a recipe override (repeatable), e.g. epochs=12")
    args = parser.parse_args()
    commit = git_commit()
    native_bf16 = cpu_has_native_bf16(cpu_flags())
    done = recorded(commit, native_bf16, args.avx2, args.set)
    for seed in (int(s) for s in args.seeds.split(",")):
        if seed in done:
            continue
        record = run_seed(seed, Path(args.out) / f"seed{seed}", args.avx2, args.set)
        RECORD.parent.mkdir(parents=True, exist_ok=True)
        with RECORD.open("a") as file:
            file.write(json.dumps(record) + "\n")
        done[seed] = record
    tops = [r["top1"] for r in done.values()]
    walls = [r["wall_seconds"] for r in done.values()]
    print(json.dumps({"commit": commit, "cpu_native_bf16": native_bf16,
                      "kernels_held_to_avx2": args.avx2, "overrides": args.set,
                      "seeds": sorted(done),
                      "top1_median": statistics.median(tops), "top1_range": [min(tops), max(tops)],
                      "wall_median_s": statistics.median(walls),
                      "wall_range_s": [min(walls), max(walls)]}))


if __name__ == "__main__":
    main()
