"""The 90-epoch batch-scaling study: ImageNet's steps per epoch, four optimizers, fair tuning.

    nice -n 19 python benchmarks/study90.py            # run or resume (about 10 h on 2 cores)
    python benchmarks/study90.py --report              # the records of what has finished so far
    python benchmarks/study90.py --save                # finished runs' small files into results

Fashion-MNIST (60,000 images) with global batches whose steps per epoch match ImageNet's
(1,281,167 images) at the batches of You et al., "ImageNet Training in Minutes" (ICPP 2018):
384 ≙ 8K (156 steps per epoch), 768 ≙ 16K (78), 1536 ≙ 32K (39), 3072 ≙ 64K (19); 90 epochs
for every run, and the small-batch baseline (SGD at 128, 468 steps per epoch). The 32K-matched
runs have 3,510 steps, the paper's ImageNet runs at 32K 3,519.

Series (benchmarks/../src/bigbatch/tools/sweep/series.py), each with linear warmup (5 epochs,
as Goyal et al. 2017 and the paper's ResNet-50 runs up to 8K) and poly(2) decay:

* ``lars-paper``: LARS adapting every tensor, as the authors ran it; square-root LR scaling;
* ``lamb``: LAMB (You et al., ICLR 2020), square-root LR scaling;
* ``sgd``: momentum SGD with the linear scaling rule (Goyal et al. 2017);
* ``nesterov``: Nesterov momentum tuned as Nado et al. (2021) did: LR grid per point, and the
  warmup length searched as a second axis (5, 12 and 25 epochs) at the 32K-matched batch, where
  LARS gets the same warmup search.

Every point is the best of an LR grid (3 LRs a factor 2 apart, extended up to 4 LRs while the best
is at an edge, so that the best LR is interior or the extension budget is spent; the budget was 2
until Nesterov at 3072 ended at its lower edge with both spent), centred at the
smallest batch on the 20-epoch study's best LRs at 128 scaled by each series' rule and at larger
batches on the smallest batch's best LR scaled by the rule. Top-1 is measured with BatchNorm
statistics recomputed over 50 micro-batches (precise BN) and the LR selected on it. Then seeds 0,
1 and 2 at every point's best LR. Model: small_resnet width 4, one block per stage (the 20-epoch
study's, so the two studies compare), micro-batch (= BatchNorm batch) 128, fp32, one thread per
run, two runs at a time ("lanes").

Resumable: rerunning the command continues where it stopped (finished runs are kept and skipped,
an interrupted one resumes from its checkpoint). Finished runs' small files are copied after each
sweep and every few minutes into docs/results/batch_scaling_90ep/finished_runs/ (``--save`` does
it at any time), and copied back into an empty run folder, so the study also resumes on a new
machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, RESULTS_DIR, machine_info  # noqa: E402

# STUDY90_OUT, STUDY90_RESULTS, STUDY90_EPOCHS and STUDY90_SUBSET shrink the study for its test.
OUT = Path(os.environ.get("STUDY90_OUT", REPO / "runs" / "batch_scaling_90ep"))
RESULTS = Path(os.environ.get("STUDY90_RESULTS", RESULTS_DIR / "batch_scaling_90ep"))
EPOCHS = float(os.environ.get("STUDY90_EPOCHS", 90))
SUBSET = os.environ.get("STUDY90_SUBSET")
WARMUP, BASELINE_BATCH, MATCHED_32K = 5, 128, 1536
SAVE_EVERY_SECONDS = 300  # finished runs reach the results this often, not only after a sweep
BATCHES = (384, 768, 1536, 3072)
WARMUP_AXIS = (12, 25)
SEEDS = "0,1,2"
# Grid centres at batch 128: the 20-epoch study's best LRs there (docs/results/batch_scaling_20ep).
CENTRES = {"sgd": 0.8, "nesterov": 0.8, "lars-paper": 5.656854249492381, "lamb": 0.04}
MACHINES = "machines.jsonl"  # one line per start of the study: the machine that ran on from there
KEPT = ("summary.json", "diverged.json", "sweep_run.json", "config.yaml")
COMMON = (
    "--recipe", "fashion-mnist", "--epochs", f"{EPOCHS:g}", "--lrs-per-point", "3",
    "--max-extensions", "4", "--lr-grid-factor", "2", "--micro-batch", "128", "--threads", "1",
    "--set", "data.name=fashion-mnist", "--set", "model.name=small_resnet",
    "--set", "model.options={width: 4, blocks_per_stage: 1}", "--set", "precision=fp32",
    "--set", "channels_last=false", "--set", "threads=1", "--set", "data.workers=0",
    "--set", "local_processes=1", "--set", "seed=0", "--set", "label_smoothing=0.1",
    "--set", "optim.weight_decay=0.0005", "--set", "optim.momentum=0.9",
    "--set", "optim.trust_coefficient=0.001", "--set", "eval_every=10",
    "--set", "eval.bn_recompute=50", "--set", "checkpoint.keep=1",
    *(("--train-subset", SUBSET) if SUBSET else ()),
)


@dataclass
class Job:
    """One `bigbatch sweep`: its folder under OUT, its series, batches, warmup and LR centres."""

    name: str
    series: tuple[str, ...]
    batches: tuple[int, ...]
    warmup: float = WARMUP
    centres: dict[str, tuple[float, int]] = field(default_factory=dict)  # series -> (lr, batch)
    anchor: bool = True
    after: str | None = None  # a job whose best LRs at MATCHED_32K centre this one

    @property
    def out(self) -> Path:
        return OUT / self.name

    def command(self, seeds: bool) -> list[str]:
        command = [sys.executable, "-m", "bigbatch", "sweep", *COMMON,
                   "--batch-sizes", ",".join(map(str, self.batches)),
                   "--optimizers", ",".join(self.series), "--warmup-epochs", str(self.warmup),
                   "--out", str(self.out)]
        for name, (lr, batch) in self.centres_now().items():
            command += [f"--{name}-lr", repr(lr), f"--{name}-reference-batch", str(batch)]
        if not self.anchor:
            command.append("--no-anchor")
        if seeds:
            command += ["--seeds", SEEDS]
        return command

    def centres_now(self) -> dict[str, tuple[float, int]]:
        if self.after is None:
            return self.centres or {s: (CENTRES[s], BASELINE_BATCH) for s in self.series}
        best = best_lrs(OUT / self.after, MATCHED_32K)
        return {s: (best[s], MATCHED_32K) for s in self.series}


def best_lrs(sweep: Path, batch: int) -> dict[str, float]:
    points = json.loads((sweep / "sweep.json").read_text())["best"]
    return {p["optimizer"]: p["best_lr"] for p in points
            if p["batch"] == batch and p["best_lr"] is not None}


def warmup_job(warmup: int) -> Job:
    return Job(f"warmup{warmup}", ("lars-paper", "nesterov"), (MATCHED_32K,), warmup=warmup,
               anchor=False, after="main-a")


# Two lanes, one process each; every lane runs its jobs' grids, then their seeds. (Moving the
# 12-epoch warmup job to the second lane, tried once, left the first idle: its 64K-matched
# seeds are short.)
LANES = (
    (Job("main-a", ("lars-paper", "nesterov"), BATCHES), warmup_job(WARMUP_AXIS[0])),
    (Job("baseline", ("sgd",), (BASELINE_BATCH,)), Job("main-b", ("sgd", "lamb"), BATCHES),
     warmup_job(WARMUP_AXIS[1])),
)
JOBS = {job.name: job for lane in LANES for job in lane}


def centres_known(job: Job) -> bool:
    """Whether the job's LR centres are known (its `after` job has its points at 32K)."""
    if job.after is None:
        return True
    sweep = OUT / job.after / "sweep.json"
    return sweep.is_file() and set(job.series) <= set(best_lrs(OUT / job.after, MATCHED_32K))


def run_job(job: Job, seeds: bool, finished: dict[str, int]) -> int:
    """Run one sweep (after its `after` job has the points it needs); its exit code."""
    while not centres_known(job):
        if job.after in finished:
            print(f"{job.name}: skipped, {job.after} ended without its points at "
                  f"{MATCHED_32K}", file=sys.stderr)
            return 1
        time.sleep(30)
    job.out.mkdir(parents=True, exist_ok=True)
    with (OUT / f"{job.name}.log").open("a") as log:
        log.write(f"\n# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} "
                  f"{' '.join(job.command(seeds))}\n")
        log.flush()
        code = subprocess.call(job.command(seeds), stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    save(job)
    return code


def run_lane(jobs: tuple[Job, ...], finished: dict[str, int]) -> None:
    """A lane's jobs' grids, then their seeds; each job's exit code into ``finished``."""
    for seeds in (False, True):
        for job in jobs:
            code = run_job(job, seeds, finished)
            finished[job.name] = max(code, finished.get(job.name, 0))


def save(job: Job) -> None:
    """Copy the job's finished runs' small files into the results folder."""
    for run in sorted((job.out / "runs").glob("*/")):
        if not any((run / name).is_file() for name in ("summary.json", "diverged.json")):
            continue
        dest = RESULTS / "finished_runs" / job.name / run.name
        dest.mkdir(parents=True, exist_ok=True)
        for name in KEPT:
            if (run / name).is_file():
                shutil.copy2(run / name, dest / name)


def save_all() -> None:
    for job in JOBS.values():
        save(job)


def restore() -> None:
    """Copy kept runs back into run folders that lack them (a new machine or a fresh clone)."""
    for kept in sorted((RESULTS / "finished_runs").glob("*/*/")):
        run = OUT / kept.parent.name / "runs" / kept.name
        if not any((run / name).is_file() for name in ("summary.json", "diverged.json")):
            run.mkdir(parents=True, exist_ok=True)
            for path in kept.iterdir():
                shutil.copy2(path, run / path.name)


def record_start() -> None:
    """Append this machine to the results: a study resumed on another machine says so."""
    with open(RESULTS / MACHINES, "a") as file:
        file.write(json.dumps(machine_info()) + "\n")


def run_study() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    record_start()
    restore()
    finished: dict[str, int] = {}
    lanes = [threading.Thread(target=run_lane, args=(jobs, finished)) for jobs in LANES]
    for lane in lanes:
        lane.start()
    while running := [lane for lane in lanes if lane.is_alive()]:
        running[0].join(timeout=SAVE_EVERY_SECONDS)
        save_all()
    report()
    return max(finished.values(), default=0)


def report() -> None:
    """The study's records so far: sweep.csv, verdict, figure, command and machine."""
    subprocess.check_call([sys.executable, str(Path(__file__).with_name("study90_verdict.py")),
                           "--sweeps", str(OUT), "--out", str(RESULTS)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", action="store_true", help="write the records of what finished")
    parser.add_argument("--save", action="store_true", help="copy finished runs into the results")
    args = parser.parse_args()
    if args.save:
        save_all()
        return 0
    if args.report:
        report()
        return 0
    return run_study()


if __name__ == "__main__":
    raise SystemExit(main())
