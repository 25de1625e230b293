"""The sweep's runner: the config of each run, running it (in this process or under torchrun),
and the loop over batches, optimizers and learning rates."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bigbatch.errors import EXIT_NONFINITE, UserError
from bigbatch.tools.sweep.records import (
    PLAN_FILE,
    PointResult,
    RunResult,
    check_same_plan,
    finished_result,
    markdown_table,
    point_summary,
    record_divergence,
    run_name,
    seed_statistics,
    write_csv,
    write_json,
)
from bigbatch.tools.sweep.search import (
    FAILED_MARGIN_POINTS,
    LRRule,
    SweepSettings,
    anchored_rule,
    grid_lr,
    initial_exponents,
    next_extension,
)
from bigbatch.tools.sweep.series import SERIES

log = logging.getLogger(__name__)






class SweepRunError(UserError):
    """A run launched under torchrun failed for a reason other than divergence."""




def run_overrides(settings: SweepSettings, batch: int, optimizer: str, rule: LRRule,
                  base_lr: float, run_dir: Path, seed: int | None = None) -> list[str]:
    """The --set assignments that turn the recipe into one run of the sweep.

    ``optimizer`` names a series (series.py), whose own settings come after the sweep's --set
    ones. ``base_lr`` is the LR at the rule's reference batch; the engine scales it to B with the
    rule's ``lr_scaling``, so each run's config.yaml states the rule it followed. ``seed``: the
    run's seed in place of the config's.
    """
    assignments = list(settings.overrides) + [
        f"global_batch={batch}",
        f"micro_batch={min(settings.micro_batch, batch)}",
        f"epochs={settings.epochs}",
        *SERIES[optimizer].assignments(),
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
    if seed is not None:
        assignments.append(f"seed={seed}")
    return assignments


def resolve_run(settings: SweepSettings, batch: int, optimizer: str, rule: LRRule,
                base_lr: float, run_dir: Path, seed: int | None = None):
    from bigbatch.config import resolve_config

    return resolve_config(settings.recipe, settings.config_file,
                          run_overrides(settings, batch, optimizer, rule, base_lr, run_dir, seed))




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
        return record_divergence(run_dir, str(error), time.perf_counter() - started)
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
        return record_divergence(run_dir, "non-finite loss (exit code 3)", elapsed)
    if code != 0:
        raise SweepRunError(f"run in {run_dir} failed with exit code {code}; "
                            f"see {run_dir / 'torchrun.log'}")
    result = finished_result(run_dir)
    if result is None:
        raise SweepRunError(f"run in {run_dir} exited cleanly but wrote no summary.json")
    return result


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
        if self.settings.seeded(batch) and point.best_lr is not None:
            best = next(r for r in runs.values() if r.lr == point.best_lr)
            point.seeds = seed_statistics(self._run_seeds(batch, optimizer, rule, best))
        return point

    def _run_seeds(self, batch: int, optimizer: str, rule: LRRule, best: RunResult
                   ) -> list[RunResult]:
        """The best run's LR with every --seeds seed; the grid's own run stands for its seed."""
        factor = self.settings.lr_grid_factor
        return [best if seed == best.seed else
                self._run_one(batch, optimizer, rule, grid_lr(rule.lr, factor, best.grid_exponent),
                              best.grid_exponent, extension=best.extension, seed=seed)
                for seed in self.settings.seeds]

    def _run_one(self, batch: int, optimizer: str, rule: LRRule, base_lr: float,
                 exponent: float, extension: bool, seed: int | None = None) -> RunResult:
        cfg = resolve_run(self.settings, batch, optimizer, rule, base_lr, self.out / "tmp", seed)
        from bigbatch.build import peak_lr  # imports torch: only when a sweep runs

        lr = peak_lr(cfg)
        run_dir = self.out / "runs" / run_name(batch, optimizer, lr, seed)
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
            extension=extension, trained_top1=summary.get("trained_top1", summary.get("top1")),
            trained_top5=summary.get("trained_top5", summary.get("top5")),
            bn_recompute=cfg.eval.bn_recompute, seed=cfg.seed, seed_rerun=seed is not None,
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


def chance_top1(cfg) -> float:
    """Top-1 (%) of guessing: 100 / number of classes of the run's training set."""
    from bigbatch.build import datasets_for

    train, _ = datasets_for(cfg)
    classes = getattr(train, "num_classes", None) or len(train.classes)
    return 100.0 / classes
