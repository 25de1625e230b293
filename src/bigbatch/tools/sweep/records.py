"""The sweep's records: one result per run, the best per point, the CSV/JSON/Markdown files, and
the files that let an interrupted sweep resume."""

from __future__ import annotations

import csv
import json
import math
import os
import platform
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

CSV_COLUMNS = ("batch", "optimizer", "lr", "top1", "top5", "steps", "wall_seconds")


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

    def csv_row(self) -> dict[str, Any]:
        row = {key: getattr(self, key) for key in CSV_COLUMNS}
        for key in ("top1", "top5", "wall_seconds"):
            if row[key] is None:
                row[key] = "nan"
        if row["steps"] is None:
            row["steps"] = ""
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


def run_name(batch: int, optimizer: str, lr: float) -> str:
    return f"b{batch:05d}-{optimizer}-lr{lr:.4g}"


def point_summary(batch: int, optimizer: str, centre: float, runs: list[RunResult],
                  extensions: list[str], failed_below: float = -math.inf) -> PointResult:
    by_exponent = {r.grid_exponent: r.top1 for r in runs}
    best_e = best_exponent(by_exponent)
    best = next((r for r in runs if r.grid_exponent == best_e), None)
    at_edge = edge_extension(by_exponent, failed_below) is not None
    ordered = sorted(runs, key=lambda r: r.lr)
    return PointResult(
        batch=batch, optimizer=optimizer, centre_lr=centre,
        best_lr=best.lr if best else None, best_top1=best.top1 if best else None,
        best_top5=best.top5 if best else None, lrs=[r.lr for r in ordered],
        extensions=extensions, best_at_edge=at_edge and len(runs) > 1,
        steps=best.steps if best else None,
    )


def write_csv(path: Path, runs: list[RunResult]) -> None:
    ordered = sorted(runs, key=lambda r: (r.batch, SWEEP_OPTIMIZERS.index(r.optimizer), r.lr))
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
        "machine": machine_record(),
        "sweep_seconds": time.perf_counter() - started,
    }
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(record, indent=2, default=_json_default) + "\n")
    temporary.replace(path)


def _json_default(value: Any) -> Any:
    return str(value)


def markdown_table(points: list[PointResult], optimizers: tuple[str, ...]) -> str:
    """Best top-1 per batch and optimizer with its LR; Δ = LARS - SGD; edge/extension marks."""
    batches = sorted({p.batch for p in points})
    lookup = {(p.batch, p.optimizer): p for p in points}
    both = "sgd" in optimizers and "lars" in optimizers
    header = ["batch", "steps"] + [f"{name.upper()} top-1 % (peak LR)"
                                                for name in optimizers]
    if both:
        header.append("LARS − SGD")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for batch in batches:
        cells = [str(batch)]
        steps = next((lookup[(batch, o)].steps for o in optimizers
                      if (batch, o) in lookup and lookup[(batch, o)].steps), None)
        cells.append(str(steps) if steps else "–")
        for name in optimizers:
            cells.append(_point_cell(lookup.get((batch, name))))
        if both:
            cells.append(_difference(lookup.get((batch, "lars")), lookup.get((batch, "sgd"))))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("`+` the grid was extended past its initial edge; `!` the best LR is still at the "
                 "edge of its grid (or no LR learned) after the allowed extensions; `diverged`: "
                 "every LR of the point stopped on a non-finite loss.")
    return "\n".join(lines) + "\n"


def _point_cell(point: PointResult | None) -> str:
    if point is None:
        return "–"
    if point.best_top1 is None:
        return "diverged"
    marks = ("+" if point.extensions else "") + ("!" if point.best_at_edge else "")
    return f"{point.best_top1:.2f} ({point.best_lr:.3g}){marks}"


def _difference(lars: PointResult | None, sgd: PointResult | None) -> str:
    if lars is None or sgd is None or lars.best_top1 is None or sgd.best_top1 is None:
        return "–"
    return f"{lars.best_top1 - sgd.best_top1:+.2f}"


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
    mine, theirs = plan_signature(planned), plan_signature(recorded)
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
    differently for the same run."""
    from bigbatch.config import config_from_dict

    signature = json.loads(json.dumps(config))
    from bigbatch.build import peak_lr  # imports torch: only when a sweep runs

    signature["peak_lr"] = peak_lr(config_from_dict(config))
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
