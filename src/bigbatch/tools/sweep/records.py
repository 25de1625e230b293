"""The sweep's records: one result per run, the best per point, the CSV/JSON/Markdown files, and
the files that let an interrupted sweep resume."""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bigbatch.errors import ConfigError
from bigbatch.tools.sweep.search import (
    SWEEP_OPTIMIZERS,
    SweepSettings,
    best_exponent,
    edge_extension,
)

# top1/top5: the evaluated result (with eval.bn_recompute: after recomputing the BatchNorm
# statistics), the number LR selection uses; trained_*: with the running statistics as trained.
CSV_COLUMNS = ("batch", "optimizer", "lr", "top1", "top5", "steps", "wall_seconds",
               "trained_top1", "trained_top5", "bn_recompute", "seed")


DIVERGED_FILE = "diverged.json"


PLAN_FILE = "sweep_run.json"


@dataclass
class RunResult:
    """One training run of the sweep: a CSV row plus where it came from."""

    batch: int
    optimizer: str
    lr: float
    top1: float | None
    top5: float | None
    steps: int | None
    wall_seconds: float | None
    grid_exponent: float
    run_dir: str
    diverged: bool = False
    extension: bool = False
    trained_top1: float | None = None
    trained_top5: float | None = None
    bn_recompute: int = 0  # micro-batches the BatchNorm statistics were recomputed over
    seed: int | None = None
    seed_rerun: bool = False  # a rerun of the point's best LR with another seed (not grid)

    def csv_row(self) -> dict[str, Any]:
        row = {key: getattr(self, key) for key in CSV_COLUMNS}
        for key in ("top1", "top5", "wall_seconds", "trained_top1", "trained_top5"):
            if row[key] is None:
                row[key] = "nan"
        for key in ("steps", "seed"):
            if row[key] is None:
                row[key] = ""
        row["lr"] = f"{self.lr:.6g}"
        return row


@dataclass
class PointResult:
    """The best run of one (batch, optimizer) point and how its grid grew."""

    batch: int
    optimizer: str
    centre_lr: float
    best_lr: float | None
    best_top1: float | None
    best_top5: float | None
    lrs: list[float]
    extensions: list[str]
    best_at_edge: bool
    steps: int | None
    rule: dict[str, Any] | None = None  # the LR rule that centred the grid
    selected_on: str = "top1 as trained"
    best_trained_top1: float | None = None  # the selected run, as trained
    as_trained_best_lr: float | None = None  # the best LR had selection used the trained top-1
    as_trained_best_top1: float | None = None
    seeds: dict[str, Any] | None = None  # the best LR rerun with --seeds (seed_statistics)


def run_name(batch: int, optimizer: str, lr: float, seed: int | None = None) -> str:
    """The run's folder name; ``seed`` only for a seed rerun (the grid's runs keep no suffix)."""
    suffix = "" if seed is None else f"-seed{seed}"
    return f"b{batch:05d}-{optimizer}-lr{lr:.4g}{suffix}"


def point_summary(batch: int, optimizer: str, centre: float, runs: list[RunResult],
                  extensions: list[str], failed_below: float = -math.inf) -> PointResult:
    """The point's best run on ``top1`` (the recomputed-BN number where there is one), with the
    same run as trained and the best the trained numbers alone would have chosen."""
    best = _best_run(runs, "top1")
    as_trained = _best_run(runs, "trained_top1")
    at_edge = edge_extension({r.grid_exponent: r.top1 for r in runs}, failed_below) is not None
    ordered = sorted(runs, key=lambda r: r.lr)
    return PointResult(
        batch=batch, optimizer=optimizer, centre_lr=centre,
        best_lr=best.lr if best else None, best_top1=best.top1 if best else None,
        best_top5=best.top5 if best else None, lrs=[r.lr for r in ordered],
        extensions=extensions, best_at_edge=at_edge and len(runs) > 1,
        steps=best.steps if best else None, selected_on=selection_label(runs),
        best_trained_top1=best.trained_top1 if best else None,
        as_trained_best_lr=as_trained.lr if as_trained else None,
        as_trained_best_top1=as_trained.trained_top1 if as_trained else None,
    )


def _best_run(runs: list[RunResult], metric: str) -> RunResult | None:
    best_e = best_exponent({r.grid_exponent: getattr(r, metric) for r in runs})
    return next((r for r in runs if r.grid_exponent == best_e), None)


def selection_label(runs: list[RunResult]) -> str:
    """Which number picks the best LR: top-1 after recomputing BatchNorm statistics when every
    run recomputed them (over the same count), else top-1 as trained."""
    counts = {r.bn_recompute for r in runs if not r.diverged}
    if len(counts) == 1 and (count := counts.pop()):
        return f"top1 with BatchNorm statistics recomputed over {count} micro-batches"
    return "top1 as trained"


def seed_statistics(runs: list[RunResult]) -> dict[str, Any]:
    """Per-seed top-1 (selection number and as trained) of one LR, with mean, sample standard
    deviation and range; diverged seeds count as missing."""
    summary: dict[str, Any] = {"lr": runs[0].lr if runs else None,
                               "top1": {str(r.seed): r.top1 for r in runs},
                               "trained_top1": {str(r.seed): r.trained_top1 for r in runs}}
    for key in ("top1", "trained_top1"):
        values = [v for v in summary[key].values() if v is not None and not math.isnan(v)]
        summary[f"{key}_mean"] = statistics.fmean(values) if values else None
        summary[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else None
        summary[f"{key}_range"] = [min(values), max(values)] if values else None
    return summary


def write_csv(path: Path, runs: list[RunResult]) -> None:
    ordered = sorted(runs, key=lambda r: (r.batch, SWEEP_OPTIMIZERS.index(r.optimizer), r.lr,
                                          r.seed_rerun, r.seed or 0))
    temporary = path.with_suffix(".csv.tmp")
    with temporary.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(CSV_COLUMNS))
        writer.writeheader()
        for run in ordered:
            writer.writerow(run.csv_row())
    temporary.replace(path)


def write_json(path: Path, settings: SweepSettings, runs: list[RunResult],
               points: list[PointResult], started: float) -> None:
    record = {
        "settings": settings.as_record(),
        "lr_rules": {
            name: f"peak LR = {rule.lr:g} * {'B' if rule.scaling == 'linear' else 'sqrt(B'} / "
                  f"{rule.reference_batch}{')' if rule.scaling == 'sqrt' else ''} x "
                  f"{settings.lr_grid_factor:g}^k"
            for name, rule in settings.rules.items()
        },
        "runs": [asdict(r) for r in runs],
        "best": [asdict(p) for p in points],
        "selected_on": sorted({p.selected_on for p in points}),
        "machine": machine_record(),
        "sweep_seconds": time.perf_counter() - started,
    }
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(record, indent=2, default=_json_default) + "\n")
    temporary.replace(path)


def _json_default(value: Any) -> Any:
    return str(value)


def markdown_table(points: list[PointResult], optimizers: tuple[str, ...]) -> str:
    """Best top-1 per batch and series with its LR, each series minus SGD, edge/extension
    marks; with recomputed BatchNorm statistics also the same runs as trained; the seeds."""
    batches = sorted({p.batch for p in points})
    lookup = {(p.batch, p.optimizer): p for p in points}
    against = [o for o in optimizers if o != "sgd"] if "sgd" in optimizers else []
    header = ["batch", "steps"] + [f"{name.upper()} top-1 % (peak LR)" for name in optimizers]
    header += [f"{name.upper()} − SGD" for name in against]
    lines = _table_head(header)
    for batch in batches:
        steps = next((lookup[(batch, o)].steps for o in optimizers
                      if (batch, o) in lookup and lookup[(batch, o)].steps), None)
        cells = [str(batch), str(steps) if steps else "–"]
        cells += [_point_cell(lookup.get((batch, name))) for name in optimizers]
        cells += [_difference(lookup.get((batch, name)), lookup.get((batch, "sgd")))
                  for name in against]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("`+` the grid was extended past its initial edge; `!` the best LR is still at the "
                 "edge of its grid (or no LR learned) after the allowed extensions; `diverged`: "
                 "every LR of the point stopped on a non-finite loss.")
    selected = {p.selected_on for p in points}
    if any(label != "top1 as trained" for label in selected):
        lines += ["", f"LR selected on: {', '.join(sorted(selected))}.", ""]
        lines += _as_trained_table(batches, lookup, optimizers)
    seeded = [p for p in points if p.seeds]
    if seeded:
        lines += [""] + _seeds_table(seeded)
    return "\n".join(lines) + "\n"


def _table_head(header: list[str]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]


def _as_trained_table(batches: list[int], lookup: dict, optimizers: tuple[str, ...]
                      ) -> list[str]:
    """The selected run's top-1 with the running statistics, and the best LR those alone pick."""
    lines = ["As trained (running BatchNorm statistics): the selected run / the best LR on "
             "this number alone (its LR).", ""]
    lines += _table_head(["batch"] + [name.upper() for name in optimizers])
    for batch in batches:
        cells = [str(batch)]
        for name in optimizers:
            point = lookup.get((batch, name))
            if point is None or point.best_trained_top1 is None:
                cells.append("–")
                continue
            cells.append(f"{point.best_trained_top1:.2f} / {point.as_trained_best_top1:.2f} "
                         f"({point.as_trained_best_lr:.3g})")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _seeds_table(points: list[PointResult]) -> list[str]:
    lines = ["Seeds at the best LR: top-1 mean ± sample std (range), selection number and as "
             "trained.", ""]
    lines += _table_head(["batch", "series", "peak LR", "seeds", "top-1", "as trained"])
    for point in sorted(points, key=lambda p: (p.batch, SWEEP_OPTIMIZERS.index(p.optimizer))):
        seeds = point.seeds
        lines.append(f"| {point.batch} | {point.optimizer} | {seeds['lr']:.3g} | "
                     f"{', '.join(seeds['top1'])} | {_spread(seeds, 'top1')} | "
                     f"{_spread(seeds, 'trained_top1')} |")
    return lines


def _spread(seeds: dict[str, Any], key: str) -> str:
    mean, std, span = seeds[f"{key}_mean"], seeds[f"{key}_std"], seeds[f"{key}_range"]
    if mean is None:
        return "diverged"
    deviation = f" ± {std:.2f}" if std is not None else ""
    return f"{mean:.2f}{deviation} ({span[0]:.2f}–{span[1]:.2f})"


def _point_cell(point: PointResult | None) -> str:
    if point is None:
        return "–"
    if point.best_top1 is None:
        return "diverged"
    marks = ("+" if point.extensions else "") + ("!" if point.best_at_edge else "")
    return f"{point.best_top1:.2f} ({point.best_lr:.3g}){marks}"


def _difference(point: PointResult | None, sgd: PointResult | None) -> str:
    if point is None or sgd is None or point.best_top1 is None or sgd.best_top1 is None:
        return "–"
    return f"{point.best_top1 - sgd.best_top1:+.2f}"


def machine_record() -> dict[str, Any]:
    import torch

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def finished_result(run_dir: Path) -> dict[str, Any] | None:
    """The summary of a finished run (or its divergence record), None if it has not finished."""
    for name in ("summary.json", DIVERGED_FILE):
        path = run_dir / name
        if path.is_file():
            try:
                record = json.loads(path.read_text())
            except json.JSONDecodeError:
                return None  # a half-written file: run again
            record["diverged"] = name == DIVERGED_FILE
            return record
    return None


def check_same_plan(run_dir: Path, planned: dict[str, Any]) -> None:
    """Refuse to mix results of different settings in one sweep directory."""
    path = run_dir / PLAN_FILE
    if not path.is_file():
        return
    recorded = json.loads(path.read_text())
    keys = ("epochs", "global_batch", "micro_batch", "seed", "model", "optim", "schedule", "data")
    mine = plan_signature(planned)
    try:
        theirs = plan_signature(recorded)
    except ConfigError as error:
        raise ConfigError(f"{run_dir} holds a run recorded by another bigbatch version ({error}); "
                          "use a new --out folder or remove that run") from None
    changed = [k for k in keys if mine.get(k) != theirs.get(k)]
    if not math.isclose(mine["peak_lr"], theirs["peak_lr"], rel_tol=1e-9):
        changed.append("peak LR")
    if changed:
        raise ConfigError(
            f"{run_dir} holds a run made with other settings ({', '.join(changed)} differ); "
            "use a new --out folder or remove that run"
        )


def plan_signature(config: dict[str, Any]) -> dict[str, Any]:
    """What defines the training of a run: its config with the peak LR in place of the
    (base LR, reference batch) pair it was derived from, which a re-centred grid spells
    differently for the same run. The config is read back through RunConfig, so that a field
    added since a run was recorded counts at its default (a new field's default must therefore
    be what runs did before it existed)."""
    from bigbatch.config import config_from_dict

    run_config = config_from_dict(config)
    signature = json.loads(json.dumps(asdict(run_config)))
    from bigbatch.build import peak_lr  # imports torch: only when a sweep runs

    signature["peak_lr"] = peak_lr(run_config)
    for key in ("lr", "reference_batch"):
        signature["optim"].pop(key, None)
    signature.pop("out", None)
    return signature


def record_divergence(run_dir: Path, message: str, seconds: float) -> dict[str, Any]:
    record = {"top1": None, "top5": None, "steps": _diverged_step(message),
              "wall_seconds": seconds, "message": message}
    (run_dir / DIVERGED_FILE).write_text(json.dumps(record, indent=2) + "\n")
    record["diverged"] = True
    return record


def _diverged_step(message: str) -> int | None:
    words = message.replace(",", " ").replace("(", " ").split()
    for before, word in zip(words, words[1:], strict=False):
        if before == "step" and word.isdigit():
            return int(word)
    return None
