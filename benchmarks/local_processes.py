"""One process with all the cores as intra-op threads against one rank per core
(`local_processes`): the default recipe's training speed both ways, side by side.

    python benchmarks/local_processes.py                       # 3 rounds of 2-epoch runs
    python benchmarks/local_processes.py --precision fp32 --avx2   # kernels held to AVX2

Each round runs `bigbatch train --epochs E --set local_processes=1` and `... =auto` (the order
rotated by round), and takes from each run's summary.json its training images/s and the wall
time of the whole command. The kernels can be held to AVX2 on an AVX-512 machine
(ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2): a stand-in for an AVX2-only CPU that keeps
its instruction set, not its clock, caches or memory. One JSON line goes to
docs/results/local_processes.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import AVX2_ONLY, REPO, interleaved_rounds, machine_info, median, paired_ratio, report


def timed_run(setting: str, options: argparse.Namespace, scratch: Path) -> dict[str, float]:
    out = scratch / f"run-{setting}"
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, **(AVX2_ONLY if options.avx2 else {})}
    command = [sys.executable, "-m", "bigbatch", "train", "--epochs", str(options.epochs),
               "--set", "schedule.warmup_epochs=1", "--set", f"local_processes={setting}",
               "--set", f"precision={options.precision}", "--out", str(out)]
    start = time.perf_counter()
    subprocess.run(command, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    summary = json.loads((out / "summary.json").read_text())
    return {"images_per_second": summary["images_per_second"], "wall_seconds": wall,
            "world_size": summary["world_size"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
    parser.add_argument("--avx2", action="store_true", help="hold the kernels to AVX2")
    parser.add_argument("--no-save", action="store_true")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        runs = interleaved_rounds(
            {setting: lambda s=setting: timed_run(s, options, Path(scratch))
             for setting in ("1", "auto")}, options.rounds)
    speed = {s: [r["images_per_second"] for r in runs[s]] for s in runs}
    wall = {s: [r["wall_seconds"] for r in runs[s]] for s in runs}
    record = {
        "benchmark": "local_processes",
        "settings": {"recipe": "fashion-mnist", "epochs": options.epochs,
                     "precision": options.precision, "kernels_held_to_avx2": options.avx2,
                     "rounds": options.rounds,
                     "world_size_auto": runs["auto"][0]["world_size"]},
        "images_per_second": {s: [round(v, 1) for v in speed[s]] for s in speed},
        "wall_seconds": {s: [round(v, 2) for v in wall[s]] for s in wall},
        "median_images_per_second": {s: round(median(speed[s]), 1) for s in speed},
        "speedup_auto_over_one": paired_ratio(speed["auto"], speed["1"]),
        "wall_ratio_one_over_auto": paired_ratio(wall["1"], wall["auto"]),
        "machine": machine_info(),
    }
    report("local_processes", record, save=not options.no_save, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
