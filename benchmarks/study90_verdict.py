"""The 90-epoch batch-scaling study's records: its CSV, figure, verdict, command and machine.

    python benchmarks/study90_verdict.py --sweeps runs/batch_scaling_90ep \\
        --out docs/results/batch_scaling_90ep

Reads every job's sweep record (benchmarks/study90.py: baseline, main-a, main-b, warmup12,
warmup25) and writes into ``--out``:

* sweep.csv: one row per finished run of every job (its sweep record and its run folders), with
  the ImageNet batch of the same steps per epoch;
* sweep.png: the best top-1 against batch per series, the baseline's seed range shaded;
* verdict.md / verdict.json: the claims of You et al., "ImageNet Training in Minutes" (ICPP
  2018) and of Nado et al., "A Large Batch Optimizer Reality Check" (2021), judged on the seeds'
  mean, beside the 20-epoch study's verdict; the warmup table at the 32K-matched batch;
* command.txt and machine.txt.

It works on partial results: a point whose grid has not finished is missing, a point whose
seeds have not all finished is judged on what it has and marked, and every such gap is listed.
While a job's seed pass rewrites its sweep record run by run, the points that record does not
hold yet are rebuilt from the job's finished run folders (a grid the sweep would still extend
is not a point yet). A claim "holds" or "fails" once every point it compares is final (all its
seeds, and at the 32K-matched batch every warmup's grid); before that it "holds so far" or
"fails so far", except that one final row that fails makes it fail.

Every number is top-1 with BatchNorm statistics recomputed (the number the sweep selects LRs
on). A point's value is the mean of its seeds 0-2 (a diverged seed is left out); a point with
one number so far uses its grid's best run (seed 0); a point where every LR diverged counts as 0
(and runs no seeds).
At the 32K-matched batch, nesterov's and lars-paper's point is the best of the three warmups
(chosen on the grid's best top-1, as the sweep chooses the LR).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS_DIR, available_cores, cpu_flags, cpu_model, load_average  # noqa: E402
from figures import machine_label  # noqa: E402
from study20_verdict import IMAGENET_TRAIN, point_value  # noqa: E402
from study90 import (  # noqa: E402
    BASELINE_BATCH,
    BATCHES,
    EPOCHS,
    JOBS,
    MACHINES,
    MATCHED_32K,
    SEEDS,
    WARMUP,
    Job,
)
from study90_text import TRAIN_EXAMPLES, cell, imagenet_batch  # noqa: E402

from bigbatch import geometry  # noqa: E402
from bigbatch.tools.plot import OPTIMIZER_STYLE, new_figure, save  # noqa: E402
from bigbatch.tools.sweep.records import (  # noqa: E402
    PLAN_FILE,
    RunResult,
    finished_result,
    point_summary,
    seed_statistics,
)
from bigbatch.tools.sweep.search import FAILED_MARGIN_POINTS, next_extension  # noqa: E402
from bigbatch.tools.sweep.series import SERIES, LRRule  # noqa: E402

FAILED_BELOW = 100 / 10 + FAILED_MARGIN_POINTS  # a run this near chance (10 classes) collapsed
BASELINE_WITHIN, AHEAD_BY, MATCH_WITHIN = 1.0, 3.0, 1.0
MATCHED_64K = 3072
SERIES_ORDER = ("sgd", "nesterov", "lars-paper", "lamb")
WARMUP_SERIES = ("lars-paper", "nesterov")
EXPECTED_SEEDS = tuple(SEEDS.split(","))
CSV_COLUMNS = ("batch", "imagenet_batch", "optimizer", "lr", "warmup_epochs", "seed", "epochs",
               "steps", "top1", "top5", "trained_top1", "wall_seconds", "job")
STYLE = {**OPTIMIZER_STYLE, "nesterov": ("tab:brown", "P", SERIES["nesterov"].label)}
PROSE_FILE = "why_they_differ.md"
RUN_NAME = re.compile(r"^b(\d+)-(.+?)-lr(.+?)(?:-seed(\d+))?$")


# ----------------------------------------------------------------------------- reading


@dataclass
class Point:
    """The best LR of one (series, batch, warmup) point and its seeds' top-1."""

    series: str
    batch: int
    warmup: float
    job: str
    best_top1: float | None
    best_lr: float | None
    steps: int | None
    at_edge: bool
    seeds: dict[str, float | None] = field(default_factory=dict)
    source: str = "sweep record"

    def values(self) -> list[float]:
        return [v for v in self.seeds.values() if v is not None and not math.isnan(v)]

    @property
    def seeded(self) -> bool:
        """Whether every seed has finished; a point where every LR diverged runs no seeds."""
        return self.best_top1 is None or set(EXPECTED_SEEDS) <= set(self.seeds)

    def diverged_seeds(self) -> list[str]:
        return sorted(s for s, v in self.seeds.items() if v is None or math.isnan(v))

    def stats(self) -> dict[str, Any]:
        """The point's value (seeds' mean, else the grid's best; 0 where nothing learned)."""
        values = self.values()
        seeds = {"top1": {s: v for s, v in self.seeds.items() if v in values}}  # NaN out too
        value, std, _ = point_value({"best_top1": self.best_top1, "seeds": seeds}, "top1")
        value = 0.0 if value is None else value  # every LR diverged: nothing learned
        return {"series": self.series, "batch": self.batch, "warmup": self.warmup,
                "job": self.job, "lr": self.best_lr, "value": value, "std": std,
                "range": [min(values), max(values)] if len(values) > 1 else None,
                "seeds": sorted(self.seeds), "seeded": self.seeded,
                "diverged": self.best_top1 is None, "diverged_seeds": self.diverged_seeds(),
                "at_edge": self.at_edge, "source": self.source}


@dataclass
class JobRecord:
    job: Job
    warmup: float
    epochs: float | None
    runs: list[dict[str, Any]]
    points: list[Point]
    machine: dict[str, Any] | None = None


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None  # absent, or being replaced this moment: read as not there yet


def point_from_record(best: dict[str, Any], job: Job, warmup: float) -> Point:
    seeds = (best.get("seeds") or {}).get("top1") or {"0": best.get("best_top1")}
    return Point(best["optimizer"], best["batch"], warmup, job.name, best.get("best_top1"),
                 best.get("best_lr"), best.get("steps"), bool(best.get("best_at_edge")),
                 dict(seeds))


def load_job(sweeps: Path, job: Job) -> JobRecord:
    """A job's runs and points: its sweep record, completed from its run folders in a seed pass."""
    record = read_json(sweeps / job.name / "sweep.json") or {}
    settings = record.get("settings", {})
    warmup = settings.get("warmup_epochs") or job.warmup
    runs = list(record.get("runs", []))
    points = [point_from_record(p, job, warmup) for p in record.get("best", [])]
    known = {r["run_dir"] for r in runs}  # a resumed sweep rewrites its record run by run
    runs += [vars(r) for r in folder_runs(sweeps / job.name) if r.run_dir not in known]
    if seed_pass_started(sweeps / f"{job.name}.log"):
        have = {(p.series, p.batch) for p in points}
        points += rebuilt_points([RunResult(**r) for r in runs], have, job, warmup,
                                 settings.get("lrs_per_point", 3),
                                 settings.get("max_extensions", 2))
    return JobRecord(job, warmup, settings.get("epochs"), runs, points, record.get("machine"))


def seed_pass_started(log: Path) -> bool:
    """Whether the job's last sweep command is its seed pass (so its grid has finished)."""
    try:
        commands = [line for line in log.read_text().splitlines() if line.startswith("# ")]
    except OSError:
        return False
    return bool(commands) and "--seeds" in commands[-1].split()


def folder_runs(job_dir: Path) -> list[RunResult]:
    """Every finished run in the job's run folders, read from its summary and its plan."""
    runs = []
    for run in sorted((job_dir / "runs").glob("*/")):
        name, result, plan = RUN_NAME.match(run.name), finished_result(run), None
        if name and result is not None:
            plan = read_json(run / PLAN_FILE)
        if plan is None:
            continue
        optim, batch = plan["optim"], plan["global_batch"]
        lr = LRRule(optim["lr"], optim["reference_batch"], optim["lr_scaling"]).centre(batch)
        runs.append(RunResult(
            batch=batch, optimizer=name.group(2), lr=lr, top1=result.get("top1"),
            top5=result.get("top5"), steps=result.get("steps"),
            wall_seconds=result.get("wall_seconds"), grid_exponent=math.log2(lr),
            run_dir=str(run.relative_to(job_dir)), diverged=result["diverged"],
            trained_top1=result.get("trained_top1", result.get("top1")),
            trained_top5=result.get("trained_top5", result.get("top5")),
            bn_recompute=result.get("bn_recompute", 0), seed=plan["seed"],
            seed_rerun=name.group(4) is not None))
    return runs


def grid_finished(grid: list[RunResult], per_point: int, most: int) -> bool:
    """Whether the sweep would run no more LRs at this point (its grid rule, search.py)."""
    results = {r.grid_exponent: r.top1 for r in grid}
    return len(grid) >= per_point and next_extension(results, len(grid) - per_point, most,
                                                     FAILED_BELOW) is None


def rebuilt_points(runs: list[RunResult], have: set, job: Job, warmup: float, per_point: int,
                   most: int) -> list[Point]:
    """The points of finished grids the sweep record does not hold (yet), with their seeds."""
    points = []
    for series in job.series:
        for batch in job.batches:
            grid = [r for r in runs if (r.optimizer, r.batch) == (series, batch)
                    and not r.seed_rerun]
            if (series, batch) in have or not grid:
                continue
            for r in grid:
                r.grid_exponent = math.log2(r.lr)
            if not grid_finished(grid, per_point, most):
                continue  # the seed pass grows it first: not a point yet
            best = point_summary(batch, series, math.nan, grid, [], FAILED_BELOW)
            seeds = [r for r in runs if (r.optimizer, r.batch) == (series, batch)
                     and r.seed_rerun and best.best_lr and math.isclose(r.lr, best.best_lr)]
            chosen = next((r for r in grid if r.lr == best.best_lr), None)
            top1 = seed_statistics(([chosen] if chosen else []) + seeds)["top1"]
            points.append(Point(series, batch, warmup, job.name, best.best_top1, best.best_lr,
                                best.steps, best.best_at_edge, top1 or {"0": None},
                                source="run folders"))
    return points


def load_study(sweeps: Path) -> list[JobRecord]:
    return [load_job(sweeps, job) for job in JOBS.values()]


# ----------------------------------------------------------------------------- the points


def all_points(jobs: list[JobRecord]) -> list[Point]:
    return [p for job in jobs for p in job.points]


def chosen(points: list[Point], series: str, batch: int) -> Point | None:
    """The series' point at ``batch``: the best warmup's (on the grid's best top-1)."""
    here = [p for p in points if (p.series, p.batch) == (series, batch)]
    if not here:
        return None
    return max(here, key=lambda p: (-math.inf if p.best_top1 is None else p.best_top1,
                                    -p.warmup))


def settled(points: list[Point], series: str, batch: int) -> bool:
    """Whether the series' point at ``batch`` is final: every warmup's grid there has finished
    (so the choice among them stands) and the chosen point has all its seeds."""
    jobs = {job for job, s, b, _ in expected_points() if (s, b) == (series, batch)}
    here = {p.job for p in points if (p.series, p.batch) == (series, batch)}
    point = chosen(points, series, batch)
    return point is not None and jobs <= here and point.seeded


def expected_points() -> list[tuple[str, str, int, float]]:
    """(job, series, batch, warmup) of every point the study runs."""
    return [(job.name, series, batch, job.warmup) for job in JOBS.values()
            for series in job.series for batch in job.batches]


def missing(jobs: list[JobRecord]) -> list[str]:
    """What has not finished: points without a finished grid, points without all their seeds."""
    points = {(p.job, p.series, p.batch): p for p in all_points(jobs)}
    gaps = []
    for job, series, batch, warmup in expected_points():
        point = points.get((job, series, batch))
        where = f"{job}: {series} at batch {batch} (warmup {warmup:g})"
        if point is None:
            gaps.append(f"{where}: LR grid not finished")
        elif not point.seeded:
            pending = sorted(set(EXPECTED_SEEDS) - set(point.seeds))
            gaps.append(f"{where}: seed{'s' if len(pending) > 1 else ''} "
                        f"{', '.join(pending)} not finished")
    return gaps


# ----------------------------------------------------------------------------- the verdict


def compare(a: Point | None, b: Point | None, threshold: float) -> dict[str, Any]:
    """``a`` against ``b``: their values, a − b with its standard error, whether a − b ≥
    threshold (None while either point is missing) and whether both have all their seeds
    (``pair`` also asks that no other warmup could still replace either)."""
    row: dict[str, Any] = {"a": a.stats() if a else None, "b": b.stats() if b else None,
                           "threshold": threshold, "difference": None, "se": None,
                           "holds": None, "final": False}
    if a is None or b is None:
        return row
    sa, sb = row["a"], row["b"]
    row["difference"] = sa["value"] - sb["value"]
    if sa["std"] is not None and sb["std"] is not None:
        row["se"] = math.sqrt(sa["std"] ** 2 / len(a.values()) + sb["std"] ** 2 / len(b.values()))
    row["holds"] = row["difference"] >= threshold
    row["final"] = sa["seeded"] and sb["seeded"]
    return row


def pair(points: list[Point], a: tuple[str, int], b: tuple[str, int], threshold: float
         ) -> dict[str, Any]:
    """One row of a claim: (series, batch) ``a`` against ``b``, final once both are settled."""
    row = {"batch": a[1], **compare(chosen(points, *a), chosen(points, *b), threshold)}
    row["final"] = settled(points, *a) and settled(points, *b)
    return row


def outcome(rows: list[dict[str, Any]]) -> str:
    """A claim over its rows (it must hold at each): "fails" once a final row fails, "holds"
    once every row is final and holds, else "holds so far" / "fails so far" with how many
    rows have both points."""
    measured = [r for r in rows if r["holds"] is not None]
    if not measured:
        return "not measured yet"
    if any(r["final"] and not r["holds"] for r in measured):
        return "fails"
    word = "holds" if all(r["holds"] for r in measured) else "fails"
    if all(r["final"] for r in rows):
        return word
    if len(measured) < len(rows):
        return f"{word} so far ({len(measured)} of {len(rows)} batches measured)"
    return f"{word} so far"


def claim(name: str, text: str, series: tuple[str, str], rows: list[dict[str, Any]]
          ) -> dict[str, Any]:
    return {"claim": name, "text": text, "a": series[0], "b": series[1], "rows": rows,
            "outcome": outcome(rows)}


def judge(points: list[Point]) -> list[dict[str, Any]]:
    """Claims 1-3 on the chosen point of every series at every batch."""
    batches = sorted({b for job in JOBS.values() for b in job.batches} - {BASELINE_BATCH})

    def rows(a: str, b: str, at: list[int], threshold: float) -> list[dict[str, Any]]:
        return [pair(points, (a, x), (b, x), threshold) for x in at]

    first = pair(points, ("lars-paper", MATCHED_32K), ("sgd", BASELINE_BATCH), -BASELINE_WITHIN)
    return [
        claim("1", f"LARS (lars-paper) within {BASELINE_WITHIN:g} point of the baseline (SGD at "
                   f"{BASELINE_BATCH}) at the 32K-matched batch {MATCHED_32K}",
              ("lars-paper", f"baseline (sgd, {BASELINE_BATCH})"), [first]),
        claim("2", f"LARS at least {AHEAD_BY:g} points ahead of SGD (linear scaling) at "
                   f"{MATCHED_32K} and {MATCHED_64K}", ("lars-paper", "sgd"),
              rows("lars-paper", "sgd", [MATCHED_32K, MATCHED_64K], AHEAD_BY)),
        claim("3a", f"tuned Nesterov within {MATCH_WITHIN:g} point of LARS (or ahead) at every "
                    "batch", ("nesterov", "lars-paper"),
              rows("nesterov", "lars-paper", batches, -MATCH_WITHIN)),
        claim("3b", f"LAMB within {MATCH_WITHIN:g} point of LARS (or ahead) at every batch",
              ("lamb", "lars-paper"), rows("lamb", "lars-paper", batches, -MATCH_WITHIN)),
        claim("3c", f"LAMB within {MATCH_WITHIN:g} point of tuned Nesterov (or ahead) at every "
                    "batch", ("lamb", "nesterov"),
              rows("lamb", "nesterov", batches, -MATCH_WITHIN)),
    ]


def warmup_table(points: list[Point]) -> list[dict[str, Any]]:
    """Best top-1 per warmup per series at the 32K-matched batch, the chosen one marked."""
    table = []
    for series in WARMUP_SERIES:
        best = chosen(points, series, MATCHED_32K)
        for warmup in sorted({job.warmup for job in JOBS.values()
                              if series in job.series and MATCHED_32K in job.batches}):
            point = next((p for p in points if (p.series, p.batch, p.warmup)
                          == (series, MATCHED_32K, warmup)), None)
            table.append({"series": series, "warmup": warmup, "best_top1": point and
                          point.best_top1, "stats": point.stats() if point else None,
                          "chosen": point is not None and point is best,
                          "settled": settled(points, series, MATCHED_32K)})
    return table


# ----------------------------------------------------------------------------- 20 epochs


def steps_per_epoch(batch: int) -> int:
    return geometry.steps_per_epoch(TRAIN_EXAMPLES, batch)


def nearest_batch(batches: list[int], batch: int) -> int:
    """Of ``batches``, the one whose steps per epoch are nearest (in ratio) ``batch``'s."""
    return min(batches, key=lambda b: abs(math.log(steps_per_epoch(b) / steps_per_epoch(batch))))


def twenty_epoch_values(record: dict[str, Any], batch: int) -> dict[str, Any]:
    """LARS (lars-paper) minus the baseline and minus SGD at one batch of the 20-epoch study,
    on its own rule (seeds' mean where it ran seeds, else the grid's best)."""
    points = {(p["batch"], p["optimizer"]): p for p in record["best"]}
    smallest = min(record["settings"]["batch_sizes"])
    baseline = point_value(points[(smallest, "sgd")], "top1")[0] or 0.0
    lars, lars_std, lars_n = point_value(points[(batch, "lars-paper")], "top1")
    sgd, sgd_std, sgd_n = point_value(points[(batch, "sgd")], "top1")
    lars, sgd = lars or 0.0, sgd or 0.0
    return {"batch": batch, "steps_per_epoch": steps_per_epoch(batch),
            "steps": points[(batch, "lars-paper")].get("steps"), "baseline": baseline,
            "lars": lars, "lars_std": lars_std, "lars_seeds": lars_n, "sgd": sgd,
            "sgd_std": sgd_std, "sgd_seeds": sgd_n, "lars_minus_baseline": lars - baseline,
            "lars_minus_sgd": lars - sgd}


def ninety_epoch_values(points: list[Point], batch: int) -> dict[str, Any]:
    lars = chosen(points, "lars-paper", batch)
    baseline = pair(points, ("lars-paper", batch), ("sgd", BASELINE_BATCH), 0.0)
    sgd = pair(points, ("lars-paper", batch), ("sgd", batch), 0.0)
    return {"batch": batch, "imagenet_batch": imagenet_batch(batch),
            "steps_per_epoch": steps_per_epoch(batch), "steps": lars.steps if lars else None,
            "lars_minus_baseline": baseline["difference"], "lars_minus_sgd": sgd["difference"],
            "final": baseline["final"] and sgd["final"]}


def side_by_side(points: list[Point], study20: Path) -> dict[str, Any] | None:
    """The 20-epoch study's verdict and, at every 90-epoch batch, both studies' LARS − baseline
    and LARS − SGD at the 20-epoch batch whose steps per epoch are nearest."""
    record = read_json(study20 / "sweep.json")
    verdict = read_json(study20 / "verdict.json")
    if record is None:
        return None
    batches = sorted(record["settings"]["batch_sizes"])
    ninety = sorted({b for job in JOBS.values() for b in job.batches} - {BASELINE_BATCH})
    rows = [{"ninety": ninety_epoch_values(points, b),
             "twenty": twenty_epoch_values(record, nearest_batch(batches, b))} for b in ninety]
    holds = next((v["holds"].get("lars-paper") for v in verdict or [] if v["number"] == "top1"),
                 None)
    return {"epochs": record["settings"]["epochs"], "batches": batches, "rows": rows,
            "verdict": holds, "warmup_epochs": record["settings"].get("warmup_epochs")}


# ----------------------------------------------------------------------------- Markdown


def difference(row: dict[str, Any]) -> str:
    if row["difference"] is None:
        return "–"
    se = f" ± {row['se']:.2f}" if row["se"] is not None else ""
    return f"{row['difference']:+.2f}{se}"


def mark(row: dict[str, Any]) -> str:
    if row["holds"] is None:
        return "–"
    word = "yes" if row["holds"] else "**no**"
    return word if row["final"] else f"{word} (so far)"


def claim_lines(result: dict[str, Any]) -> list[str]:
    a, b = result["a"], result["b"]
    lines = [f"### {result['claim']}. {result['text']}: {result['outcome']}", "",
             f"| batch (≙ ImageNet) | {a} | {b} | {a} − {b.split()[0]} (± SE) | needed | holds |",
             "|---|---|---|---|---|---|"]
    for row in result["rows"]:
        lines.append(f"| {row['batch']} ({imagenet_batch(row['batch'])}) | {cell(row['a'])} | "
                     f"{cell(row['b'])} | {difference(row)} | ≥ {row['threshold']:+g} | "
                     f"{mark(row)} |")
    return lines + [""]


def warmup_lines(table: list[dict[str, Any]]) -> list[str]:
    warmups = sorted({row["warmup"] for row in table})
    lines = [f"## Warmup at the 32K-matched batch {MATCHED_32K}", "",
             "The grid's best top-1 (seed 0) per warmup, and the seeds at that LR; ✓ the warmup "
             "the verdict uses.", "",
             "| series | " + " | ".join(f"warmup {w:g} epochs" for w in warmups) + " |",
             "|---|" + "---|" * len(warmups)]
    for series in WARMUP_SERIES:
        cells = []
        for warmup in warmups:
            row = next(r for r in table if (r["series"], r["warmup"]) == (series, warmup))
            stats = row["stats"]
            if stats is None:
                cells.append("not finished")
                continue
            if row["best_top1"] is None:
                cells.append("every LR diverged")
                continue
            mark = ("✓ " if row["settled"] else "✓ (so far) ") if row["chosen"] else ""
            cells.append(f"{mark}{row['best_top1']:.2f} (LR {stats['lr']:.3g}); "
                         f"seeds {cell(stats, details=False)}")
        lines.append(f"| {series} | " + " | ".join(cells) + " |")
    return lines + [""]


def signed(value: float | None, note: str = "") -> str:
    return "–" if value is None else f"{value:+.2f}{note}"


def twenty_lines(compared: dict[str, Any] | None, prose: str | None) -> list[str]:
    lines = ["## 4. Against the 20-epoch study", ""]
    if compared is None:
        return lines + ["The 20-epoch study's record (batch_scaling_20ep/sweep.json) was not "
                        "found.", ""]
    words = {True: "holds", False: "fails", None: "not tested"}
    verdict = compared["verdict"] or {}
    lines += [f"The 20-epoch study (same model and data, {compared['epochs']:g} epochs, "
              f"{compared['warmup_epochs']:g}-epoch warmup, batches "
              f"{', '.join(map(str, compared['batches']))}) judged lars-paper: LARS ≥ SGD at "
              f"batch ≥ 2048 {words[verdict.get('e1')]}; LARS ≥ SGD + 3 at batch ≥ 8192 "
              f"{words[verdict.get('e2')]}; LARS within 1 point of the baseline up to its "
              f"32K-matched batch {words[verdict.get('e3')]}.", "",
              "Each 90-epoch batch beside the 20-epoch batch whose steps per epoch are nearest "
              "(20-epoch values: seeds' mean where that study ran seeds, else the grid's best).",
              "",
              "| 90 ep batch (≙ ImageNet) | steps/epoch, total | LARS − baseline | LARS − SGD | "
              "20 ep batch | steps/epoch, total | LARS − baseline | LARS − SGD |",
              "|---|---|---|---|---|---|---|---|"]
    for row in compared["rows"]:
        n, t = row["ninety"], row["twenty"]
        pending = "" if n["final"] else " (so far)"
        lines.append(f"| {n['batch']} ({n['imagenet_batch']}) | {n['steps_per_epoch']}, "
                     f"{n['steps'] or '–'} | {signed(n['lars_minus_baseline'], pending)} | "
                     f"{signed(n['lars_minus_sgd'], pending)} | {t['batch']} | "
                     f"{t['steps_per_epoch']}, "
                     f"{t['steps'] or '–'} | {signed(t['lars_minus_baseline'])} | "
                     f"{signed(t['lars_minus_sgd'])} |")
    lines += ["", "### Why the two verdicts differ", ""]
    lines += [prose.strip()] if prose else [
        f"*Not written yet: the explanation goes in {PROSE_FILE} beside this file, and the "
        "next report includes it here.*"]
    return lines + [""]


def markdown(claims: list[dict[str, Any]], table: list[dict[str, Any]],
             compared: dict[str, Any] | None, gaps: list[str], prose: str | None) -> str:
    done = len(expected_points()) - sum("grid not finished" in g for g in gaps)
    status = ("complete: every point and seed has finished" if not gaps else
              f"partial: {done} of {len(expected_points())} points' grids finished, "
              f"{len(gaps)} points missing something (listed at the end)")
    lines = ["# The 90-epoch batch-scaling study: verdict", "", f"**Status: {status}.**", "",
             "Fashion-MNIST at ImageNet's steps per epoch (batch "
             + ", ".join(f"{b} ≙ {imagenet_batch(b)}" for b in BATCHES)
             + f"), {EPOCHS:g} epochs, small_resnet width 4. Top-1 (%) with BatchNorm "
             "statistics recomputed. A point: the mean ± sample std (range) of seeds "
             f"{', '.join(EXPECTED_SEEDS)} at its best LR; at {MATCHED_32K} nesterov's and "
             "lars-paper's is the best of their warmups. SE: the standard error of the "
             "difference of two seed means.", "", "| claim | outcome |", "|---|---|"]
    lines += [f"| {c['claim']}. {c['text']} | {c['outcome']} |" for c in claims]
    lines.append("")
    for result in claims:
        lines += claim_lines(result)
    lines += warmup_lines(table) + twenty_lines(compared, prose)
    if gaps:
        lines += ["## What is missing", ""] + [f"- {gap}" for gap in gaps] + [""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- files


def csv_rows(jobs: list[JobRecord]) -> list[dict[str, Any]]:
    """Every run as the sweep's own CSV row (records.RunResult.csv_row) with the study's columns."""
    rows = []
    for job in jobs:
        for run in job.runs:
            rows.append({**RunResult(**run).csv_row(), "job": job.job.name,
                         "imagenet_batch": imagenet_batch(run["batch"]),
                         "warmup_epochs": f"{job.warmup:g}",
                         "epochs": "" if job.epochs is None else f"{job.epochs:g}"})
    order = {name: i for i, name in enumerate(SERIES_ORDER)}
    return sorted(rows, key=lambda r: (r["batch"], order.get(r["optimizer"], 99),
                                       float(r["warmup_epochs"]), float(r["lr"]),
                                       r["seed"] if r["seed"] != "" else -1))


def write_csv(path: Path, jobs: list[JobRecord]) -> None:
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(CSV_COLUMNS), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(csv_rows(jobs))


def baseline_band(ax, baseline: Point | None) -> None:
    if baseline is None:
        return
    stats = baseline.stats()
    if stats["range"] is not None:
        low, high = stats["range"]
        ax.axhspan(low, high, color="0.85", label=f"baseline SGD B={BASELINE_BATCH}: seeds' "
                                                   f"range {low:.2f}–{high:.2f}")
    ax.axhline(stats["value"], color="0.5", linewidth=0.8,
               label=None if stats["range"] else f"baseline SGD B={BASELINE_BATCH}: "
                                                 f"{stats['value']:.2f} (seeds pending)")


def plot_series(ax, points: list[Point], series: str) -> None:
    here = sorted((p for p in (chosen(points, series, b) for b in
                               sorted({p.batch for p in points})) if p and p.series == series),
                  key=lambda p: p.batch)
    if not here:
        return
    color, marker, label = STYLE.get(series, ("black", "x", series))
    stats = [p.stats() for p in here]
    xs, ys = [s["batch"] for s in stats], [s["value"] for s in stats]
    low = [s["value"] - s["range"][0] if s["range"] else 0.0 for s in stats]
    high = [s["range"][1] - s["value"] if s["range"] else 0.0 for s in stats]
    ax.errorbar(xs, ys, yerr=[low, high], color=color, marker=marker, capsize=3, label=label)
    pending = [(s["batch"], s["value"]) for s in stats if not s["seeded"]]
    if pending:
        ax.scatter(*zip(*pending, strict=True), s=70, facecolors="white", edgecolors=color,
                   marker=marker, zorder=3)
    for s in stats:
        if s["warmup"] != WARMUP:
            ax.annotate(f"warmup {s['warmup']:g}", (s["batch"], s["value"]), fontsize=7,
                        textcoords="offset points", xytext=(6, -10), color=color)


def write_figure(path: Path, points: list[Point]) -> Path:
    """Best top-1 against batch per series (log2 axis), the ImageNet batch on the top axis."""
    figure, axes = new_figure(1, 1, (10.5, 5.0))
    ax = axes[0][0]
    baseline_band(ax, chosen(points, "sgd", BASELINE_BATCH))
    for series in SERIES_ORDER:
        plot_series(ax, points, series)
    batches = sorted({BASELINE_BATCH} | {b for job in JOBS.values() for b in job.batches})
    ax.set_xscale("log", base=2)
    ax.set_xlim(batches[0] / 1.3, batches[-1] * 1.3)
    ax.set_xticks(batches)
    ax.set_xticklabels([str(b) for b in batches])
    ax.set_xlabel("global batch (Fashion-MNIST, 60,000 images)")
    top = ax.secondary_xaxis("top", functions=(lambda b: b * IMAGENET_TRAIN / TRAIN_EXAMPLES,
                                               lambda b: b * TRAIN_EXAMPLES / IMAGENET_TRAIN))
    top.set_xticks([b * IMAGENET_TRAIN / TRAIN_EXAMPLES for b in batches],
                   [imagenet_batch(b) for b in batches])
    top.set_xticks([], minor=True)  # the log axis' own minor labels would overlap these
    top.set_xlabel("ImageNet batch with the same steps per epoch")
    ax.set_ylabel("top-1 (%, BN statistics recomputed): mean of seeds 0–2,\n"
                  "bars: their range; hollow: seeds not all finished", fontsize=9)
    ax.set_title("90 epochs at ImageNet's steps per epoch: best LR per point", fontsize=10)
    ax.grid(True, alpha=0.3)
    if not points:
        ax.text(0.5, 0.5, "no point has finished yet", transform=ax.transAxes, ha="center")
    else:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))  # off the points
    return save(figure, path)


def sweep_commands(sweeps: Path) -> list[str]:
    """Every job log's sweep command lines ('# <time> <command>'), each command once."""
    lines, seen = [], set()
    for name in JOBS:
        try:
            logged = (sweeps / f"{name}.log").read_text().splitlines()
        except OSError:
            lines.append(f"# {name}: not started yet")
            continue
        lines.append(f"# {name}:")
        for line in logged:
            command = line.split(" ", 2)[-1]
            if line.startswith("# ") and command not in seen:
                seen.add(command)
                lines.append(line)
    return lines


def write_command(path: Path, sweeps: Path) -> None:
    path.write_text("nice -n 19 python benchmarks/study90.py\n"
                    "# It runs (or resumes) these sweeps, from the job logs in "
                    f"{sweeps.name}/<job>.log (UTC start, command):\n"
                    + "\n".join(sweep_commands(sweeps)) + "\n")


def write_machine(path: Path, jobs: list[JobRecord]) -> None:
    flags = cpu_flags()
    load = load_average()
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "not installed"
    recorded = next((job.machine for job in jobs if job.machine), None)
    lines = [f"date: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
             f"cpu: {cpu_model()}",
             "flags: " + ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in
                                   ("avx2", "avx512f", "avx512_bf16", "amx_bf16")),
             f"cores: {available_cores()} (load average: {load['1min']} {load['5min']} "
             f"{load['15min']})",
             f"python: {sys.version.split()[0]}", f"torch: {torch}"]
    if recorded:
        lines.append("the sweeps recorded: " + ", ".join(f"{k} {v}" for k, v in recorded.items()))
    path.write_text("\n".join(lines + start_lines(path.parent / MACHINES)) + "\n")


def start_lines(machines: Path) -> list[str]:
    """The machines the study ran on, one line per start that recorded it (machines.jsonl)."""
    starts = [json.loads(line) for line in machines.read_text().splitlines()
              if line.strip()] if machines.is_file() else []
    if not starts:
        return ["the study's starts: none recorded"]
    lines = [f"the study's starts ({len(starts)} recorded in {MACHINES}; earlier starts did not "
             "record their machine):"]
    for start in starts:
        lines.append(f"  {start.get('date')}: {machine_label(start)}, "
                     f"torch {start.get('versions', {}).get('torch')}")
    return lines


def study20_folder(out: Path) -> Path:
    """The 20-epoch study's results: beside ``out``, else in this checkout's docs/results."""
    beside = out.parent / "batch_scaling_20ep"
    return beside if (beside / "sweep.json").is_file() else RESULTS_DIR / "batch_scaling_20ep"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweeps", type=Path, required=True, help="the study's run folder")
    parser.add_argument("--out", type=Path, required=True, help="where the records go")
    parser.add_argument("--study20", type=Path, default=None,
                        help="the 20-epoch study's results (default: batch_scaling_20ep beside "
                             "--out)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = load_study(args.sweeps)
    points, gaps = all_points(jobs), missing(jobs)
    claims, table = judge(points), warmup_table(points)
    compared = side_by_side(points, args.study20 or study20_folder(args.out))
    prose_path = args.out / PROSE_FILE
    prose = prose_path.read_text() if prose_path.is_file() else None
    text = markdown(claims, table, compared, gaps, prose)
    (args.out / "verdict.md").write_text(text)
    record = {"complete": not gaps, "missing": gaps, "claims": claims, "warmup": table,
              "twenty_epochs": compared, "points": [p.stats() for p in points]}
    (args.out / "verdict.json").write_text(json.dumps(record, indent=1) + "\n")
    write_csv(args.out / "sweep.csv", jobs)
    write_figure(args.out / "sweep.png", points)
    write_command(args.out / "command.txt", args.sweeps)
    write_machine(args.out / "machine.txt", jobs)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
