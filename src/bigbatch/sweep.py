"""The batch-size scaling study: accuracy against global batch, SGD (linear scaling) vs LARS.

    bigbatch sweep --recipe fashion-mnist --batch-sizes 128,512,2048,8192,16384 \\
        --optimizers sgd,lars --epochs 4 --lrs-per-point 3 --out runs/sweep

For every (batch B, optimizer) point the sweep trains a small grid of peak learning rates at a
fixed epoch budget and reports the best top-1, as the paper's Table 3/4 do (PAPER.md §3).

Grid centres (the rule each optimizer is known by):

* ``sgd``: the linear scaling rule of Goyal et al., peak LR = lr0 * B / B0
  (config ``optim.lr_scaling: linear``), with the shared warmup.
* ``lars``: square-root scaling, peak LR = lr0 * sqrt(B / B0) (``optim.lr_scaling: sqrt``).
  With the trust ratio normalising each layer's step, the LR the paper found best grows far
  slower than B (AlexNet-BN: 2 at 512, 10 at 4K, 14 at 8K, 23 at 16K, 22 at 32K, i.e. x11 for
  x64 in batch); sqrt scaling (x8 for x64) is the simplest rule that tracks that curve, and the
  grid plus automatic extension absorbs the rest.

Anchoring (default): the smallest batch's grid is centred on the rule as given (``--sgd-lr`` at
``--sgd-reference-batch``, likewise for LARS); every larger batch's grid is centred on the best
LR measured at the smallest batch, scaled by the optimizer's rule (lr0 = that best LR, B0 = the
smallest batch). That is how a scaling rule is used in practice (tune small, then scale), it
needs no guess of the right LR for a recipe and epoch budget, and both optimizers get exactly
the same procedure. ``--no-anchor`` centres every point on the rule as given.

Fairness: both optimizers get the same number of LRs per point, the same grid spacing, epoch
budget, warmup length, schedule (poly, power 2), micro-batch (= BatchNorm batch), model and seed.
If the best LR of a point lies at the edge of its grid, the grid is extended by one factor in that
direction and the new LR is run, up to ``max_extensions`` times; every extension is recorded.
A run that ends within FAILED_MARGIN_POINTS of chance top-1 failed to learn and counts like a
diverged one for that decision, so a grid of collapsed runs keeps growing towards smaller LRs
instead of declaring one collapsed run (10.08% against 10.00%) an interior optimum.

A run that stops on a non-finite loss is recorded as diverged (top-1 ``nan``). A run whose
``summary.json`` (or ``diverged.json``) exists is not run again, so an interrupted sweep resumes
where it stopped, and a run cut short mid-way resumes from its last checkpoint.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bigbatch.errors import ConfigError, UserError

log = logging.getLogger(__name__)

CSV_COLUMNS = ("batch", "optimizer", "lr", "top1", "top5", "steps", "wall_seconds")
SWEEP_OPTIMIZERS = ("sgd", "lars")
DIVERGED_FILE = "diverged.json"
PLAN_FILE = "sweep_run.json"
EXIT_NONFINITE = 3  # the CLI's exit code for a run stopped on a non-finite loss
# A run within this many points of chance top-1 failed to learn (collapsed), which for the grid
# decisions counts like divergence. Two points is far above the noise of a 10,000-image test set
# at chance (0.3 points) and far below anything that learned.
FAILED_MARGIN_POINTS = 2.0


class SweepRunError(UserError):
    """A run launched under torchrun failed for a reason other than divergence."""


# ----------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class LRRule:
    """How a point's grid centre follows the batch: lr * scale(B / reference_batch)."""

    lr: float
    reference_batch: int
    scaling: str  # "linear" or "sqrt", as config.optim.lr_scaling

    def centre(self, batch: int) -> float:
        ratio = batch / self.reference_batch
        return self.lr * (ratio if self.scaling == "linear" else math.sqrt(ratio))


@dataclass(frozen=True)
class SweepSettings:
    """Everything that defines a sweep; recorded in sweep.json."""

    batch_sizes: tuple[int, ...]
    optimizers: tuple[str, ...]
    epochs: float
    lrs_per_point: int = 3
    lr_grid_factor: float = 2.0
    max_extensions: int = 2
    warmup_epochs: float | None = None  # None: the recipe's
    micro_batch: int = 128  # capped at the global batch; also the BatchNorm batch
    recipe: str | None = None
    config_file: str | None = None
    overrides: tuple[str, ...] = ()
    rules: dict[str, LRRule] = field(default_factory=lambda: dict(DEFAULT_RULES))
    torchrun: int | None = None
    anchor: bool = True  # centre larger batches on the smallest batch's best LR, scaled by rule

    def check(self) -> SweepSettings:
        if not self.batch_sizes:
            raise ConfigError("--batch-sizes is empty; give a list such as 128,1024,8192")
        if any(b < 1 for b in self.batch_sizes):
            raise ConfigError(f"batch sizes must be positive, got {list(self.batch_sizes)}")
        if len(set(self.batch_sizes)) != len(self.batch_sizes):
            raise ConfigError(f"--batch-sizes repeats a value: {list(self.batch_sizes)}")
        if not self.optimizers:
            raise ConfigError("--optimizers is empty; choose from sgd, lars")
        for name in self.optimizers:
            if name not in SWEEP_OPTIMIZERS:
                raise ConfigError(f"unknown optimizer '{name}' in --optimizers; choose from "
                                  f"{', '.join(SWEEP_OPTIMIZERS)}")
        if not (self.epochs > 0 and math.isfinite(self.epochs)):
            raise ConfigError(f"--epochs must be a positive number, got {self.epochs}")
        if self.lrs_per_point < 1:
            raise ConfigError(f"--lrs-per-point must be at least 1, got {self.lrs_per_point}")
        if not self.lr_grid_factor > 1:
            raise ConfigError(f"--lr-grid-factor must be above 1, got {self.lr_grid_factor}")
        if self.max_extensions < 0:
            raise ConfigError(f"--max-extensions must be 0 or more, got {self.max_extensions}")
        if self.micro_batch < 1:
            raise ConfigError(f"--micro-batch must be positive, got {self.micro_batch}")
        if self.torchrun is not None and self.torchrun < 1:
            raise ConfigError(f"--torchrun needs a positive number of processes, "
                              f"got {self.torchrun}")
        return self

    def as_record(self) -> dict[str, Any]:
        record = asdict(self)
        record["rules"] = {name: asdict(rule) for name, rule in self.rules.items()}
        return record


# SGD: the fashion-mnist-baseline recipe's LR at its batch, scaled linearly (Goyal et al.).
# LARS: the fashion-mnist recipe's LR at batch 4096, scaled by sqrt (see module docstring).
DEFAULT_RULES = {
    "sgd": LRRule(lr=0.1, reference_batch=128, scaling="linear"),
    "lars": LRRule(lr=8.0, reference_batch=4096, scaling="sqrt"),
}


# ----------------------------------------------------------------------------- parsing


def parse_int_list(text: str, option: str) -> tuple[int, ...]:
    """'128,256, 512' -> (128, 256, 512); ConfigError naming the option on anything else."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise ConfigError(f"{option} is empty; give comma-separated integers such as 128,1024")
    values = []
    for item in items:
        try:
            values.append(int(item))
        except ValueError:
            raise ConfigError(f"{option}: '{item}' is not an integer") from None
    return tuple(values)


def parse_name_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip().lower() for item in text.split(",") if item.strip())


# ----------------------------------------------------------------------------- the grid


def grid_lr(centre: float, factor: float, exponent: float) -> float:
    """The LR ``exponent`` grid steps from the centre; exponents are integers or half-integers."""
    return centre * factor**exponent


def initial_exponents(count: int) -> list[float]:
    """``count`` grid positions centred on 0, one factor apart: 3 -> [-1, 0, 1]; 2 -> [-.5, .5]."""
    return [k - (count - 1) / 2 for k in range(count)]


def best_exponent(results: dict[float, float | None]) -> float | None:
    """The grid position with the highest top-1; diverged runs (None/NaN) never win.

    Ties go to the smaller LR, the safer choice.
    """
    finite = {e: t for e, t in results.items() if t is not None and not math.isnan(t)}
    if not finite:
        return None
    return max(sorted(finite), key=lambda e: (finite[e], -e))


def edge_extension(results: dict[float, float | None], failed_below: float = -math.inf
                   ) -> float | None:
    """The grid position that would continue the grid past the edge holding the best LR, or None
    when the best is inside the grid.

    Best at the lowest LR: one factor below it; at the highest: one factor above. A run whose
    top-1 is below ``failed_below`` (chance level plus a margin) failed to learn, like a diverged
    one: a grid of nothing but failures says nothing about where the optimum is except that its
    LRs are too large (collapse at a large LR is the usual failure), so it grows downwards. A grid
    of one LR is its own edge on both sides; it grows upwards.
    """
    if not results:
        return None
    low, high = min(results), max(results)
    learned = {e: (t if t is not None and t >= failed_below else None)
               for e, t in results.items()}
    best = best_exponent(learned)
    if best is None:
        return low - 1
    if best == high:
        return high + 1
    if best == low:
        return low - 1
    return None


def next_extension(results: dict[float, float | None], extensions_done: int,
                   max_extensions: int, failed_below: float = -math.inf) -> float | None:
    """The grid position to run next (see :func:`edge_extension`), None when the best LR is
    inside the grid or the extension budget is spent."""
    if extensions_done >= max_extensions:
        return None
    return edge_extension(results, failed_below)


# ----------------------------------------------------------------------------- records


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


# ----------------------------------------------------------------------------- running


def run_overrides(settings: SweepSettings, batch: int, optimizer: str, rule: LRRule,
                  base_lr: float, run_dir: Path) -> list[str]:
    """The --set assignments that turn the recipe into one run of the sweep.

    ``base_lr`` is the LR at the rule's reference batch; the engine scales it to B with the
    rule's ``lr_scaling``, so each run's config.yaml states the rule it followed.
    """
    assignments = list(settings.overrides) + [
        f"global_batch={batch}",
        f"micro_batch={min(settings.micro_batch, batch)}",
        f"epochs={settings.epochs}",
        f"optim.name={optimizer}",
        f"optim.lr={base_lr!r}",
        f"optim.lr_scaling={rule.scaling}",
        f"optim.reference_batch={rule.reference_batch}",
        "schedule.kind=poly",
        "schedule.power=2",
        "checkpoint.resume=auto",
        "on_nonfinite=stop",
        f"out={run_dir}",
    ]
    if settings.warmup_epochs is not None:
        assignments.append(f"schedule.warmup_epochs={settings.warmup_epochs}")
    return assignments


def resolve_run(settings: SweepSettings, batch: int, optimizer: str, rule: LRRule,
                base_lr: float, run_dir: Path):
    from bigbatch.config import resolve_config

    return resolve_config(settings.recipe, settings.config_file,
                          run_overrides(settings, batch, optimizer, rule, base_lr, run_dir))


def chance_top1(cfg) -> float:
    """Top-1 (%) of guessing: 100 / number of classes of the run's training set."""
    from bigbatch.build import datasets_for

    train, _ = datasets_for(cfg)
    classes = getattr(train, "num_classes", None) or len(train.classes)
    return 100.0 / classes


def anchored_rule(rule: LRRule, point: PointResult) -> LRRule:
    """The rule re-centred on the best LR measured at the smallest batch.

    This is how the scaling rules are meant to be used (Goyal et al.: tune at the small batch,
    then scale): every larger batch's grid is centred on best_lr(B0) * scale(B / B0), with the
    optimizer's own scaling. If every LR of the anchor point diverged, the rule is kept.
    """
    if point.best_lr is None:
        return rule
    return LRRule(lr=point.best_lr, reference_batch=point.batch, scaling=rule.scaling)


def peak_lr_of(cfg) -> float:
    from bigbatch.build import peak_lr

    return peak_lr(cfg)


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
    signature["peak_lr"] = peak_lr_of(config_from_dict(config))
    for key in ("lr", "reference_batch"):
        signature["optim"].pop(key, None)
    signature.pop("out", None)
    return signature


def execute_run(cfg, run_dir: Path, torchrun: int | None) -> dict[str, Any]:
    """Train one configuration; return its summary, or a divergence record."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if torchrun:
        return _execute_under_torchrun(cfg, run_dir, torchrun)
    import torch

    from bigbatch.distributed import DistContext
    from bigbatch.train import NonFiniteLoss, train

    single = DistContext(rank=0, world_size=1, local_rank=0, backend=None,
                         device=torch.device("cpu"))
    started = time.perf_counter()
    try:
        summary = train(cfg, single)
    except NonFiniteLoss as error:
        return _record_divergence(run_dir, str(error), time.perf_counter() - started)
    summary["diverged"] = False
    return summary


def _execute_under_torchrun(cfg, run_dir: Path, processes: int) -> dict[str, Any]:
    config_path = run_dir / "sweep_config.yaml"
    config_path.write_text(cfg.to_yaml())
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={processes}", "-m", "bigbatch", "train",
               "--config", str(config_path)]
    started = time.perf_counter()
    with (run_dir / "torchrun.log").open("w") as output:
        code = subprocess.call(command, stdout=output, stderr=subprocess.STDOUT)
    elapsed = time.perf_counter() - started
    if code == EXIT_NONFINITE:
        return _record_divergence(run_dir, "non-finite loss (exit code 3)", elapsed)
    if code != 0:
        raise SweepRunError(f"run in {run_dir} failed with exit code {code}; "
                            f"see {run_dir / 'torchrun.log'}")
    result = finished_result(run_dir)
    if result is None:
        raise SweepRunError(f"run in {run_dir} exited cleanly but wrote no summary.json")
    return result


def _record_divergence(run_dir: Path, message: str, seconds: float) -> dict[str, Any]:
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


class Sweep:
    """Runs the points of a sweep one after another and keeps its three record files current."""

    def __init__(self, settings: SweepSettings, out: Path) -> None:
        self.settings = settings.check()
        self.out = out
        self.runs: list[RunResult] = []
        self.points: list[PointResult] = []
        self.started = time.perf_counter()
        self._chance: float | None = None

    def run(self) -> list[PointResult]:
        self.out.mkdir(parents=True, exist_ok=True)
        self._check_configs()
        rules = dict(self.settings.rules)
        smallest = min(self.settings.batch_sizes)
        for batch in sorted(self.settings.batch_sizes):
            for optimizer in self.settings.optimizers:
                point = self._run_point(batch, optimizer, rules[optimizer])
                self.points.append(point)
                self.write_records()
                if self.settings.anchor and batch == smallest:
                    rules[optimizer] = anchored_rule(rules[optimizer], point)
        return self.points

    def failed_below(self, batch: int, optimizer: str) -> float:
        """Top-1 under which a run counts as having failed to learn: chance + FAILED_MARGIN."""
        if self._chance is None:
            rule = self.settings.rules[optimizer]
            cfg = resolve_run(self.settings, batch, optimizer, rule, rule.lr, self.out / "check")
            self._chance = chance_top1(cfg)
        return self._chance + FAILED_MARGIN_POINTS

    def _check_configs(self) -> None:
        """Resolve every point's centre config before any training: bad input fails first."""
        for batch in self.settings.batch_sizes:
            for optimizer in self.settings.optimizers:
                rule = self.settings.rules[optimizer]
                resolve_run(self.settings, batch, optimizer, rule, rule.lr, self.out / "check")

    def _run_point(self, batch: int, optimizer: str, rule: LRRule) -> PointResult:
        factor = self.settings.lr_grid_factor
        runs: dict[float, RunResult] = {}
        extensions: list[str] = []
        pending = initial_exponents(self.settings.lrs_per_point)
        while pending:
            exponent = pending.pop(0)
            runs[exponent] = self._run_one(batch, optimizer, rule,
                                           grid_lr(rule.lr, factor, exponent), exponent,
                                           extension=bool(extensions))
            if pending:
                continue
            grow = next_extension({e: r.top1 for e, r in runs.items()}, len(extensions),
                                  self.settings.max_extensions, self.failed_below(batch, optimizer))
            if grow is not None:
                extensions.append("up" if grow > max(runs) else "down")
                log.info("batch %d %s: best LR at the grid's edge, extending %s", batch,
                         optimizer, extensions[-1])
                pending.append(grow)
        point = point_summary(batch, optimizer, rule.centre(batch), list(runs.values()),
                              extensions, self.failed_below(batch, optimizer))
        point.rule = asdict(rule)
        return point

    def _run_one(self, batch: int, optimizer: str, rule: LRRule, base_lr: float,
                 exponent: float, extension: bool) -> RunResult:
        cfg = resolve_run(self.settings, batch, optimizer, rule, base_lr, self.out / "tmp")
        lr = peak_lr_of(cfg)
        run_dir = self.out / "runs" / run_name(batch, optimizer, lr)
        cfg.out = str(run_dir)
        planned = cfg.to_dict()
        check_same_plan(run_dir, planned)
        summary = finished_result(run_dir)
        if summary is None:
            log.info("run %s: batch %d, %s, peak LR %.4g", run_dir.name, batch, optimizer, lr)
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / PLAN_FILE).write_text(json.dumps(planned, indent=2) + "\n")
            summary = execute_run(cfg, run_dir, self.settings.torchrun)
        else:
            log.info("run %s already finished: not run again", run_dir.name)
        result = RunResult(
            batch=batch, optimizer=optimizer, lr=lr, top1=summary.get("top1"),
            top5=summary.get("top5"), steps=summary.get("steps"),
            wall_seconds=summary.get("wall_seconds"), grid_exponent=exponent,
            run_dir=str(run_dir.relative_to(self.out)), diverged=bool(summary.get("diverged")),
            extension=extension,
        )
        self.runs.append(result)
        self.write_records()
        return result

    def write_records(self) -> None:
        write_csv(self.out / "sweep.csv", self.runs)
        write_json(self.out / "sweep.json", self.settings, self.runs, self.points, self.started)
        (self.out / "sweep.md").write_text(markdown_table(self.points, self.settings.optimizers))


def run_sweep(settings: SweepSettings, out: str | Path) -> list[PointResult]:
    """Run (or resume) a sweep into ``out``; return the best run of every point."""
    return Sweep(settings, Path(out)).run()


# ----------------------------------------------------------------------------- CLI


def add_sweep_command(commands) -> argparse.ArgumentParser:
    command = commands.add_parser(
        "sweep", help="batch-size scaling study: best top-1 per batch size, SGD vs LARS",
        description="Train an LR grid for every (batch size, optimizer) point at a fixed epoch "
                    "budget and report the best top-1 per point (resumable).")
    source = command.add_mutually_exclusive_group()
    source.add_argument("--recipe",
                        help="base recipe (see `bigbatch recipes`); default fashion-mnist")
    source.add_argument("--config", help="base YAML config file")
    command.add_argument("--batch-sizes", required=True, help="comma-separated global batches")
    command.add_argument("--optimizers", default="sgd,lars", help="comma-separated: sgd, lars")
    command.add_argument("--epochs", type=float, required=True, help="epoch budget of every run")
    command.add_argument("--lrs-per-point", type=int, default=3, help="initial LR grid size")
    command.add_argument("--lr-grid-factor", type=float, default=2.0, help="ratio of neighbour LRs")
    command.add_argument("--max-extensions", type=int, default=2,
                         help="LRs added per point when the best is at the grid's edge")
    command.add_argument("--no-anchor", dest="anchor", action="store_false",
                         help="centre every batch on the rule as given instead of on the best "
                              "LR of the smallest batch scaled by the rule")
    command.add_argument("--warmup-epochs", type=float, default=None,
                         help="warmup of every run, both optimizers (default: the recipe's)")
    command.add_argument("--micro-batch", type=int, default=128,
                         help="micro-batch = BatchNorm batch of every run (capped at the batch)")
    for name, rule in DEFAULT_RULES.items():
        command.add_argument(f"--{name}-lr", type=float, default=rule.lr,
                             help=f"{name} grid centre at its reference batch "
                                  f"(default {rule.lr:g})")
        command.add_argument(f"--{name}-reference-batch", type=int, default=rule.reference_batch,
                             help=f"reference batch of the {name} rule ({rule.scaling} scaling)")
    command.add_argument("--train-subset", type=int, default=None,
                         help="use the first N training examples (quick runs)")
    command.add_argument("--set", dest="overrides", action="append", default=[],
                         metavar="KEY=VALUE", help="override a config key of every run")
    command.add_argument("--torchrun", type=int, default=None, metavar="N",
                         help="run each training under torchrun with N local processes")
    command.add_argument("--threads", type=int, default=None,
                         help="torch intra-op threads for in-process runs")
    command.add_argument("--out", required=True, help="sweep folder")
    command.set_defaults(handler=run_sweep_command)
    return command


def settings_from_args(args: argparse.Namespace) -> SweepSettings:
    overrides = list(args.overrides)
    if args.train_subset is not None:
        overrides.append(f"data.train_subset={args.train_subset}")
    rules = {
        name: LRRule(getattr(args, f"{name}_lr"), getattr(args, f"{name}_reference_batch"),
                     rule.scaling)
        for name, rule in DEFAULT_RULES.items()
    }
    for name, rule in rules.items():
        if not (rule.lr > 0 and rule.reference_batch > 0):
            raise ConfigError(f"--{name}-lr and --{name}-reference-batch must be positive")
    return SweepSettings(
        batch_sizes=parse_int_list(args.batch_sizes, "--batch-sizes"),
        optimizers=parse_name_list(args.optimizers),
        epochs=args.epochs,
        lrs_per_point=args.lrs_per_point,
        lr_grid_factor=args.lr_grid_factor,
        max_extensions=args.max_extensions,
        warmup_epochs=args.warmup_epochs,
        micro_batch=args.micro_batch,
        recipe=args.recipe,
        config_file=args.config,
        overrides=tuple(overrides),
        rules=rules,
        torchrun=args.torchrun,
        anchor=args.anchor,
    ).check()


def run_sweep_command(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    if args.threads is not None:
        if args.threads < 1:
            raise ConfigError(f"--threads must be positive, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    points = run_sweep(settings, args.out)
    print(markdown_table(points, settings.optimizers), end="")
    print(f"wrote {Path(args.out) / 'sweep.csv'}, sweep.json and sweep.md")
    return 0
