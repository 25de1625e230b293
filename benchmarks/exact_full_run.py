"""The default recipe, whole run, with exact_reduction on 1 and 2 processes and without it on 1.

    python benchmarks/exact_full_run.py                  # runs into runs/exact_full_run/
    python benchmarks/exact_full_run.py --layouts exact-w1,exact-w2,exact-w4,default-w1
    python benchmarks/exact_full_run.py --threads 1 --runs runs/exact_full_run_t1 \
        --record full_run_1thread --layouts exact-w1,exact-w2,exact-w4,exact-w2-killed-w4

Each layout is `bigbatch train` with no other arguments than the mode (the recipe's model, batch,
LR, steps, channels_last, the precision `auto` picks; the committed records were made with the
20-epoch recipe of the time, 280 steps), under torchrun (gloo) for more than
one process. A layout whose summary.json exists is not run again, so rerunning the command
continues where it stopped. Writes docs/results/exact_reduction/full_run.json: each run's top-1,
wall time and peak memory, and for every exact layout whether its final weights, BatchNorm
statistics and per-step losses are bit-identical to the 1-process exact run's (the layout
exact-w2-killed-w4 runs on 2 processes, rank 1 is killed after step 141 (fault
`crash:step=141`), and 4 processes resume it from the step-141 checkpoint); the runs'
summary.json and metrics.jsonl files are copied beside it.

Intra-op threads: by default each process gets the cores divided by the processes (what a user
gets). The exact mode makes every *sum across micro-batches* independent of the layout; each
micro-batch's own forward and backward are computed by the CPU kernels, whose results can
depend on the number of threads they run on. ``--threads N`` gives every process N threads, so
the layouts compute each micro-batch alike and differ only in how micro-batches are spread.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from common import REPO, RESULTS_DIR, machine_info

LAYOUTS = {"exact-w1": (1, True), "exact-w2": (2, True), "exact-w4": (4, True),
           "default-w1": (1, False), "exact-w2-killed-w4": (2, True)}
# A layout killed mid-way and resumed on another number of processes: (the fault's step, after
# which rank 1 exits, the processes that resume it). Checkpoints are written every step.
KILLED = {"exact-w2-killed-w4": (141, 4)}


def launch(processes: int, out: Path, exact: bool, source: Path, threads: int | None,
           extra: list[str], fault: str | None = None) -> int:
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
                 f"--nproc-per-node={processes}"] if processes > 1 else [sys.executable])
    command = [*launcher, "-m", "bigbatch", "train", "--out", str(out), "--resume", "auto",
               "--set", f"exact_reduction={str(exact).lower()}", *extra]
    env = dict(os.environ, PYTHONPATH=str(source),
               OMP_NUM_THREADS=str(threads or max(1, (os.cpu_count() or 2) // processes)))
    env.pop("BIGBATCH_FAULT", None)
    if fault:
        env["BIGBATCH_FAULT"] = fault
    return subprocess.run(command, env=env, check=False).returncode


def run(name: str, out: Path, source: Path, threads: int | None) -> None:
    processes, exact = LAYOUTS[name]
    if (out / "summary.json").exists():
        return
    if name not in KILLED:
        if launch(processes, out, exact, source, threads, []) != 0:
            raise SystemExit(f"{name} failed")
        return
    crash_step, resume_processes = KILLED[name]
    every_step = ["--checkpoint-every", "1"]
    if not (out / "killed").exists():
        code = launch(processes, out, exact, source, threads, every_step,
                      fault=f"crash:step={crash_step}:rank=1")
        if code == 0:
            raise SystemExit(f"{name}: the run was not killed at step {crash_step}")
        (out / "killed").write_text(f"rank 1 crashed at the start of step {crash_step}\n")
    if launch(resume_processes, out, exact, source, threads, every_step) != 0:
        raise SystemExit(f"{name}: the resumed run failed")


def losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text()
            .splitlines() if json.loads(line)["kind"] == "train"]


def identical(run_dir: Path, reference: Path) -> bool:
    ours = torch.load(run_dir / "final.pt", map_location="cpu", weights_only=True)["model"]
    theirs = torch.load(reference / "final.pt", map_location="cpu", weights_only=True)["model"]
    same_state = ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k])
                                                      for k in ours)
    return same_state and losses(run_dir) == losses(reference)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layouts", default="exact-w1,exact-w2,default-w1")
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "exact_full_run")
    parser.add_argument("--src", type=Path, default=REPO / "src",
                        help="the source tree to run (e.g. a snapshot of src/)")
    parser.add_argument("--threads", type=int, default=None,
                        help="intra-op threads of every process (default: cores / processes)")
    parser.add_argument("--record", default="full_run", help="record file name, no suffix")
    args = parser.parse_args()
    names = args.layouts.split(",")
    for name in names:
        run(name, args.runs / name, args.src, args.threads)
    folder = RESULTS_DIR / "exact_reduction"
    folder.mkdir(parents=True, exist_ok=True)
    record = {"command": "python " + " ".join(["benchmarks/exact_full_run.py", *sys.argv[1:]]),
              "threads_per_process": args.threads or "cores / processes",
              "machine": machine_info(), "runs": {}}
    for name in names:
        summary = json.loads((args.runs / name / "summary.json").read_text())
        entry = {key: summary[key] for key in ("top1", "top5", "steps", "world_size",
                                               "wall_seconds", "peak_memory_mib")}
        if LAYOUTS[name][1] and name != "exact-w1" and "exact-w1" in names:
            entry["bit_identical_to_exact_w1"] = identical(args.runs / name,
                                                           args.runs / "exact-w1")
        record["runs"][name] = entry
        for part in ("summary.json", "metrics.jsonl"):
            shutil.copy(args.runs / name / part, folder / f"{args.record}.{name}.{part}")
    (folder / f"{args.record}.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record["runs"], indent=2))


if __name__ == "__main__":
    main()
