"""Sweep: grid decisions, records, resume, and one tiny real sweep through the training engine."""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
from pathlib import Path

import pytest

from bigbatch import build
from bigbatch.commands import sweep as sweep_command
from bigbatch.commands.sweep import parse_int_list
from bigbatch.config import resolve_config
from bigbatch.errors import ConfigError
from bigbatch.tools.sweep import records, runner, search
from bigbatch.tools.sweep.records import CSV_COLUMNS, PointResult, markdown_table
from bigbatch.tools.sweep.search import (
    LRRule,
    SweepSettings,
    best_exponent,
    initial_exponents,
    next_extension,
)

# Tiny and fast: synthetic 28x28 single-channel 10-class data, a width-2 CNN, one epoch.
TINY_OVERRIDES = [
    "data.name=synthetic", "data.image_size=28", "data.synthetic_examples=512",
    "data.synthetic_classes=10", "model.name=small_cnn", "model.options.width=2",
    "label_smoothing=0.0", "checkpoint.keep=1",
]


def parser_with_sweep() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bigbatch")
    sweep_command.add_commands(parser.add_subparsers())
    return parser


def tiny_args(out: Path, *extra: str) -> list[str]:
    args = ["sweep", "--batch-sizes", "128,256", "--optimizers", "sgd,lars", "--epochs", "1",
            "--lrs-per-point", "3", "--max-extensions", "0", "--micro-batch", "128",
            "--warmup-epochs", "0.5",
            "--out", str(out)]
    for assignment in TINY_OVERRIDES:
        args += ["--set", assignment]
    return args + list(extra)


# ----------------------------------------------------------------------------- grid decisions


def test_initial_grid_is_centred_with_the_requested_size():
    assert initial_exponents(3) == [-1.0, 0.0, 1.0]
    assert initial_exponents(2) == [-0.5, 0.5]
    assert initial_exponents(1) == [0.0]
    assert search.grid_lr(4.0, 2.0, -1) == 2.0 and search.grid_lr(4.0, 2.0, 1) == 8.0


def test_best_exponent_ignores_diverged_runs_and_breaks_ties_to_the_smaller_lr():
    assert best_exponent({-1: 80.0, 0: 85.0, 1: None}) == 0
    assert best_exponent({-1: 80.0, 0: float("nan"), 1: 70.0}) == -1
    assert best_exponent({-1: 85.0, 0: 85.0, 1: 60.0}) == -1
    assert best_exponent({0: None, 1: None}) is None


def test_extension_goes_up_when_the_best_is_the_largest_lr():
    assert next_extension({-1: 70.0, 0: 75.0, 1: 80.0}, 0, 2) == 2


def test_extension_goes_down_when_the_best_is_the_smallest_lr():
    assert next_extension({-1: 80.0, 0: 75.0, 1: 10.0}, 0, 2) == -2


def test_extension_goes_down_when_every_lr_diverged():
    assert next_extension({-1: None, 0: None, 1: None}, 0, 2) == -2


def test_no_extension_when_the_best_is_inside_or_the_budget_is_spent():
    assert next_extension({-1: 70.0, 0: 85.0, 1: 80.0}, 0, 2) is None
    assert next_extension({-1: 70.0, 0: 75.0, 1: 80.0}, 2, 2) is None
    # after one extension upwards the new top (2) is inside once 3 beats it no more
    assert next_extension({-1: 70.0, 0: 75.0, 1: 80.0, 2: 78.0}, 1, 2) is None


def test_runs_at_chance_count_as_failed_for_the_edge_decision():
    # measured at batch 16384: every SGD LR collapsed; 10.08 is not an interior optimum
    at_chance = {-1: 10.0, 0: 10.08, 1: 7.6, 2: 4.93}
    assert next_extension(at_chance, 1, 4) is None  # without a failure level: "inside"
    assert next_extension(at_chance, 1, 4, failed_below=12.0) == -2
    # one run that learned at the low edge: grow downwards from it, as for any best at an edge
    assert next_extension({-1: 40.0, 0: 10.5, 1: 10.0}, 0, 4, failed_below=12.0) == -2
    # a learned best inside the grid stays inside even with collapsed neighbours
    assert next_extension({-1: 30.0, 0: 45.0, 1: 10.0}, 0, 4, failed_below=12.0) is None


def test_chance_level_comes_from_the_number_of_classes():
    from bigbatch.config import resolve_config

    cfg = resolve_config(overrides=TINY_OVERRIDES)
    assert runner.chance_top1(cfg) == pytest.approx(10.0)

def test_lr_rules_scale_linearly_for_sgd_and_by_sqrt_for_lars():
    assert LRRule(0.1, 128, "linear").centre(16384) == pytest.approx(12.8)
    assert LRRule(8.0, 4096, "sqrt").centre(16384) == pytest.approx(16.0)
    assert LRRule(8.0, 4096, "sqrt").centre(1024) == pytest.approx(4.0)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("text, words", [
    ("", "empty"), (" , ", "empty"), ("128,abc", "'abc' is not an integer"),
    ("128,2.5", "'2.5' is not an integer"),
])
def test_bad_batch_lists_are_config_errors(text, words):
    with pytest.raises(ConfigError, match=words):
        parse_int_list(text, "--batch-sizes")


@pytest.mark.parametrize("change, words", [
    ({"batch_sizes": ()}, "empty"),
    ({"batch_sizes": (128, 0)}, "positive"),
    ({"batch_sizes": (128, 128)}, "repeats"),
    ({"optimizers": ("adam",)}, "unknown optimizer 'adam'"),
    ({"optimizers": ("lars_paper",)},
     "choose from sgd, nesterov, lars, lars-paper, lars-mlperf, lamb"),
    ({"lrs_per_point": 0}, "at least 1"),
    ({"lr_grid_factor": 1.0}, "above 1"),
    ({"epochs": 0}, "positive"),
])
def test_bad_settings_are_config_errors(change, words):
    base = dict(batch_sizes=(128,), optimizers=("sgd",), epochs=1.0)
    with pytest.raises(ConfigError, match=words):
        SweepSettings(**{**base, **change}).check()


def test_cli_rejects_a_non_number_in_the_batch_list(tmp_path):
    args = parser_with_sweep().parse_args(
        ["sweep", "--batch-sizes", "128,x", "--epochs", "1", "--out", str(tmp_path)])
    with pytest.raises(ConfigError, match="'x' is not an integer"):
        args.handler(args)


def test_cli_rejects_a_batch_larger_than_the_data_before_training(tmp_path):
    args = parser_with_sweep().parse_args(tiny_args(tmp_path / "s", "--train-subset", "200"))
    with pytest.raises(ConfigError, match="smaller than the global batch"):
        args.handler(args)
    assert not (tmp_path / "s" / "runs").exists()


# ----------------------------------------------------------------------------- the loop, faked


def fake_execute(peak: float):
    """An execute_run stand-in: top-1 is a parabola in log2(LR) peaking at ``peak``."""
    calls = []

    def execute(cfg, run_dir, torchrun):
        lr = build.peak_lr(cfg)
        calls.append(lr)
        if lr > 64 * peak:
            summary = {"top1": None, "top5": None, "steps": 1, "wall_seconds": 0.1}
            (run_dir / records.DIVERGED_FILE).write_text(json.dumps(summary))
            return {**summary, "diverged": True}
        top1 = 90.0 - (math.log2(lr) - math.log2(peak)) ** 2
        summary = {"top1": top1, "top5": 99.0, "steps": 4, "wall_seconds": 0.5}
        (run_dir / "summary.json").write_text(json.dumps(summary))
        return summary

    return execute, calls


def fake_settings(**change) -> SweepSettings:
    base = dict(batch_sizes=(256,), optimizers=("sgd",), epochs=1.0, lrs_per_point=3,
                max_extensions=2, warmup_epochs=0.0, overrides=tuple(TINY_OVERRIDES),
                rules={"sgd": LRRule(0.1, 128, "linear"), "lars": LRRule(8.0, 4096, "sqrt")})
    return SweepSettings(**{**base, **change})


def test_sweep_extends_the_grid_towards_a_better_edge_and_records_it(tmp_path, monkeypatch):
    execute, calls = fake_execute(peak=1.6)  # centre 0.2 at B=256: best lies 3 factors up
    monkeypatch.setattr(runner, "execute_run", execute)
    (point,) = runner.run_sweep(fake_settings(), tmp_path)
    assert calls == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6])
    assert point.extensions == ["up", "up"]
    assert point.best_lr == pytest.approx(1.6) and point.best_at_edge
    record = json.loads((tmp_path / "sweep.json").read_text())
    assert record["best"][0]["extensions"] == ["up", "up"]
    assert [r["extension"] for r in record["runs"]] == [False, False, False, True, True]


def test_sweep_stops_extending_once_the_best_is_inside(tmp_path, monkeypatch):
    execute, calls = fake_execute(peak=0.1)  # one factor below the smallest initial LR
    monkeypatch.setattr(runner, "execute_run", execute)
    (point,) = runner.run_sweep(fake_settings(), tmp_path)
    assert calls == pytest.approx([0.1, 0.2, 0.4, 0.05])
    assert point.extensions == ["down"] and not point.best_at_edge
    assert point.best_lr == pytest.approx(0.1)


def test_larger_batches_are_centred_on_the_smallest_batch_best_lr_scaled_by_the_rule(
        tmp_path, monkeypatch):
    execute, calls = fake_execute(peak=0.4)  # the best LR is 0.4 at every batch
    monkeypatch.setattr(runner, "execute_run", execute)
    small, large = runner.run_sweep(fake_settings(batch_sizes=(512, 128)), tmp_path)
    # B=128 (run first, whatever the order given): 0.1 * 128/128 centre, extended up to 0.4
    assert calls[:5] == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8])
    assert (small.batch, small.best_lr, small.extensions) == (128, pytest.approx(0.4), ["up", "up"])
    # B=512: centre 0.4 * 512/128 = 1.6 (linear rule from the measured best), then down twice
    # until the best (0.4) is inside the grid
    assert calls[5:] == pytest.approx([0.8, 1.6, 3.2, 0.4, 0.2])
    assert large.rule == {"lr": pytest.approx(0.4), "reference_batch": 128, "scaling": "linear"}
    assert large.centre_lr == pytest.approx(1.6) and large.best_lr == pytest.approx(0.4)


def test_no_anchor_centres_every_batch_on_the_given_rule(tmp_path, monkeypatch):
    execute, calls = fake_execute(peak=0.4)
    monkeypatch.setattr(runner, "execute_run", execute)
    runner.run_sweep(fake_settings(batch_sizes=(128, 512), anchor=False, max_extensions=0),
                    tmp_path)
    assert calls == pytest.approx([0.05, 0.1, 0.2, 0.2, 0.4, 0.8])  # 0.1 * B/128 x 2^k


def test_diverged_runs_are_rows_with_nan_accuracy(tmp_path, monkeypatch):
    execute, _ = fake_execute(peak=0.001)
    monkeypatch.setattr(runner, "execute_run", execute)
    runner.run_sweep(fake_settings(max_extensions=0), tmp_path)
    rows = list(csv.DictReader((tmp_path / "sweep.csv").open()))
    assert [r["top1"] for r in rows] == ["nan", "nan", "nan"]
    assert "diverged" in (tmp_path / "sweep.md").read_text()


def test_a_grid_of_collapsed_runs_keeps_growing_downwards(tmp_path, monkeypatch):
    def collapsed_above(cfg, run_dir, torchrun):
        lr = build.peak_lr(cfg)
        summary = {"top1": 10.0 if lr > 0.03 else 60.0 + lr, "top5": 50.0, "steps": 2,
                   "wall_seconds": 0.1}
        (run_dir / "summary.json").write_text(json.dumps(summary))
        return summary

    monkeypatch.setattr(runner, "execute_run", collapsed_above)
    (point,) = runner.run_sweep(fake_settings(max_extensions=4), tmp_path)
    # 0.1, 0.2, 0.4 and then 0.05 collapse; 0.025 learns; 0.0125 learns less: 0.025 is inside
    assert point.extensions == ["down", "down", "down"]
    assert point.best_lr == pytest.approx(0.025) and not point.best_at_edge


def test_markdown_table_shows_best_lr_marks_and_difference():
    points = [
        PointResult(8192, "sgd", 6.4, 3.2, 71.5, 98.0, [3.2, 6.4, 12.8], ["down"], False, 21),
        PointResult(8192, "lars", 11.3, 22.6, 80.25, 99.0, [5.7, 11.3, 22.6], [], True, 21),
    ]
    table = markdown_table(points, ("sgd", "lars"))
    row = next(line for line in table.splitlines() if line.startswith("| 8192"))
    assert row == "| 8192 | 21 | 71.50 (3.2)+ | 80.25 (22.6)! | +8.75 |"
    assert table.splitlines()[0] == ("| batch | steps | SGD top-1 % (peak LR) | "
                                     "LARS top-1 % (peak LR) | LARS − SGD |")


# ----------------------------------------------------------------------------- series


@pytest.mark.parametrize("series, optimizer_class, adapted_bn", [
    ("sgd", "SGD", None), ("nesterov", "SGD", None), ("lars-paper", "LARS", True),
    ("lars-mlperf", "LARS", False),
    ("lamb", "LAMB", False),
])
@pytest.mark.parametrize("recipe_excludes", [True, False])
def test_each_series_builds_the_optimizer_that_defines_it(series, optimizer_class, adapted_bn,
                                                          recipe_excludes, tmp_path):
    """lars-paper adapts and decays every tensor, lars-mlperf and lamb exclude BN and bias,
    whatever the sweep's own --set says; sgd keeps the sweep's setting."""
    from bigbatch.tools.sweep.series import SERIES

    settings = fake_settings(optimizers=(series,), overrides=(
        *TINY_OVERRIDES, f"optim.exclude_bn_and_bias={recipe_excludes}"))
    rule = SERIES[series].rule
    cfg = runner.resolve_run(settings, 256, series, rule, rule.lr, tmp_path)
    model = build.model_for(cfg, 10, 1)
    optimizer = build.optimizer_for(cfg, model)
    assert type(optimizer).__name__ == optimizer_class
    adapted = {name for group in optimizer.param_groups if group.get("lars", True)
               for name in group["names"]}
    bn_weight = next(name for name, p in model.named_parameters() if p.ndim == 1)
    expected = recipe_excludes is False if adapted_bn is None else adapted_bn
    assert cfg.optim.exclude_bn_and_bias is (not expected)
    assert (bn_weight in adapted) is expected
    assert len(optimizer.param_groups) == (1 if expected else 2)
    assert all(group.get("nesterov", False) is (series == "nesterov")
               for group in optimizer.param_groups)


def test_series_names_appear_as_their_own_rows_and_differences(tmp_path, monkeypatch):
    execute, calls = fake_execute(peak=0.4)
    monkeypatch.setattr(runner, "execute_run", execute)
    rules = {"sgd": LRRule(0.4, 128, "linear"), "lars-paper": LRRule(0.4, 128, "sqrt"),
             "lamb": LRRule(0.4, 128, "sqrt")}
    points = runner.run_sweep(fake_settings(batch_sizes=(128,), rules=rules, max_extensions=0,
                                            optimizers=("sgd", "lars-paper", "lamb")), tmp_path)
    assert [p.optimizer for p in points] == ["sgd", "lars-paper", "lamb"]
    assert {path.name for path in (tmp_path / "runs").iterdir()} >= {
        "b00128-lars-paper-lr0.4", "b00128-lamb-lr0.4", "b00128-sgd-lr0.4"}
    head = (tmp_path / "sweep.md").read_text().splitlines()[0]
    assert head.endswith("| LARS-PAPER − SGD | LAMB − SGD |")


# ----------------------------------------------------------------------------- BatchNorm numbers


def fake_recomputed(peak: float, trained_peak: float):
    """Recomputed top-1 peaks at ``peak``, as-trained top-1 at ``trained_peak``."""
    def execute(cfg, run_dir, torchrun):
        lr = build.peak_lr(cfg)
        summary = {"top1": 90.0 - (math.log2(lr / peak)) ** 2, "top5": 99.0,
                   "trained_top1": 80.0 - (math.log2(lr / trained_peak)) ** 2,
                   "trained_top5": 97.0, "bn_recompute": cfg.eval.bn_recompute,
                   "steps": 4, "wall_seconds": 0.5, "seed": cfg.seed}
        summary["top1"] += cfg.seed  # seeds differ
        (run_dir / "summary.json").write_text(json.dumps(summary))
        return summary

    return execute


def test_both_batchnorm_numbers_are_recorded_and_the_recomputed_one_selects(
        tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "execute_run", fake_recomputed(peak=0.2, trained_peak=0.4))
    settings = fake_settings(max_extensions=0,
                             overrides=(*TINY_OVERRIDES, "eval.bn_recompute=3"))
    (point,) = runner.run_sweep(settings, tmp_path)  # grid 0.1, 0.2, 0.4 at B=256
    assert point.best_lr == pytest.approx(0.2) and point.best_top1 == pytest.approx(90.0)
    assert point.best_trained_top1 == pytest.approx(79.0)  # the same run, as trained
    assert point.as_trained_best_lr == pytest.approx(0.4)
    assert point.as_trained_best_top1 == pytest.approx(80.0)
    assert point.selected_on == "top1 with BatchNorm statistics recomputed over 3 micro-batches"
    rows = list(csv.DictReader((tmp_path / "sweep.csv").open()))
    assert [(float(r["top1"]), float(r["trained_top1"]), r["bn_recompute"]) for r in rows] == [
        (89.0, 76.0, "3"), (90.0, 79.0, "3"), (89.0, 80.0, "3")]
    table = (tmp_path / "sweep.md").read_text()
    assert "| 256 | 4 | 90.00 (0.2) |" in table
    assert "LR selected on: top1 with BatchNorm statistics recomputed over 3" in table
    assert "| 256 | 79.00 / 80.00 (0.4) |" in table
    record = json.loads((tmp_path / "sweep.json").read_text())
    assert record["selected_on"] == [point.selected_on]


def test_without_recomputation_the_trained_number_is_the_result(tmp_path, monkeypatch):
    execute, _ = fake_execute(peak=0.2)
    monkeypatch.setattr(runner, "execute_run", execute)
    (point,) = runner.run_sweep(fake_settings(max_extensions=0), tmp_path)
    assert point.selected_on == "top1 as trained"
    assert point.best_trained_top1 == point.best_top1 == pytest.approx(90.0)
    assert "LR selected on" not in (tmp_path / "sweep.md").read_text()


# ----------------------------------------------------------------------------- seeds


def test_seeds_rerun_the_best_lr_of_the_chosen_batches_only(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "execute_run", fake_recomputed(peak=0.2, trained_peak=0.2))
    settings = fake_settings(batch_sizes=(128, 256), anchor=False, max_extensions=0,
                             seeds=(0, 1, 2), seed_batches=(256,)).check()
    small, large = runner.run_sweep(settings, tmp_path)
    assert small.seeds is None
    assert large.seeds["lr"] == pytest.approx(0.2)
    assert large.seeds["top1"] == {"0": 90.0, "1": 91.0, "2": 92.0}
    assert large.seeds["top1_mean"] == pytest.approx(91.0)
    assert large.seeds["top1_std"] == pytest.approx(1.0)
    assert large.seeds["trained_top1_range"] == [80.0, 80.0]
    assert large.best_top1 == pytest.approx(90.0)  # the grid's seed selects, not the best seed
    names = sorted(path.name for path in (tmp_path / "runs").iterdir())
    assert [n for n in names if "seed" in n] == ["b00256-sgd-lr0.2-seed1", "b00256-sgd-lr0.2-seed2"]
    assert "| 256 | sgd | 0.2 | 0, 1, 2 | 91.00 ± 1.00 (90.00–92.00) |" in (
        tmp_path / "sweep.md").read_text()

    def must_not_train(*_):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(runner, "execute_run", must_not_train)
    again = runner.run_sweep(settings, tmp_path)  # resumes: every run, seeds included, kept
    assert again[1].seeds == large.seeds


@pytest.mark.parametrize("change, words", [
    ({"seeds": (1, 1)}, "repeats"), ({"seed_batches": (256,)}, "needs --seeds"),
    ({"seeds": (0, 1), "seed_batches": (512,)}, "not in --batch-sizes"),
])
def test_bad_seed_settings_are_config_errors(change, words):
    with pytest.raises(ConfigError, match=words):
        fake_settings(**change).check()


# ----------------------------------------------------------------------------- a real tiny sweep


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    args = parser_with_sweep().parse_args(tiny_args(out))
    assert args.handler(args) == 0
    return out


def test_real_sweep_writes_one_row_per_run_with_the_exact_columns(tiny_sweep):
    with (tiny_sweep / "sweep.csv").open() as file:
        reader = csv.DictReader(file)
        rows = list(reader)
    assert tuple(reader.fieldnames) == CSV_COLUMNS
    assert len(rows) == 2 * 2 * 3
    assert {(int(r["batch"]), r["optimizer"]) for r in rows} == {
        (128, "sgd"), (128, "lars"), (256, "sgd"), (256, "lars")}
    # 512 examples: 4 steps of 128, 2 of 256 in one epoch
    assert {int(r["batch"]): int(r["steps"]) for r in rows} == {128: 4, 256: 2}
    def lrs(batch, optimizer):
        return sorted(float(r["lr"]) for r in rows
                      if r["batch"] == str(batch) and r["optimizer"] == optimizer)

    def best_lr(batch, optimizer):
        return max((r for r in rows if r["batch"] == str(batch) and r["optimizer"] == optimizer),
                   key=lambda r: (float(r["top1"]), -float(r["lr"])))["lr"]

    assert lrs(128, "sgd") == pytest.approx([0.05, 0.1, 0.2])  # 0.1 at 128, grid factor 2
    assert lrs(128, "lars") == pytest.approx([8 * (128 / 4096) ** 0.5 * k for k in (0.5, 1, 2)],
                                             rel=1e-5)  # the sqrt rule from 8 at 4096
    # B=256 is centred on B=128's best, scaled linearly for SGD and by sqrt(2) for LARS
    sgd_centre = float(best_lr(128, "sgd")) * 2
    lars_centre = float(best_lr(128, "lars")) * 2 ** 0.5
    assert lrs(256, "sgd") == pytest.approx([sgd_centre / 2, sgd_centre, sgd_centre * 2], rel=1e-5)
    assert lrs(256, "lars") == pytest.approx([lars_centre / 2, lars_centre, lars_centre * 2],
                                             rel=1e-5)
    for row in rows:  # each row is its run's own summary, not a default or a neighbour's
        name = records.run_name(int(row["batch"]), row["optimizer"], float(row["lr"]))
        result = json.loads((tiny_sweep / "runs" / name / "summary.json").read_text())
        assert float(row["top1"]) == pytest.approx(result["top1"], abs=1e-9)
        assert float(row["wall_seconds"]) == pytest.approx(result["wall_seconds"], rel=1e-6)
        assert result["global_batch"] == int(row["batch"])
        assert result["optimizer"] == row["optimizer"]


def test_real_sweep_table_reports_the_best_lr_of_each_point(tiny_sweep):
    record = json.loads((tiny_sweep / "sweep.json").read_text())
    table = (tiny_sweep / "sweep.md").read_text()
    assert len(record["best"]) == 4
    for point in record["best"]:
        runs = [r for r in record["runs"]
                if (r["batch"], r["optimizer"]) == (point["batch"], point["optimizer"])]
        assert point["best_top1"] == max(r["top1"] for r in runs)
        assert f"{point['best_top1']:.2f} ({point['best_lr']:.3g})" in table
    assert record["settings"]["epochs"] == 1.0 and record["settings"]["lrs_per_point"] == 3


def test_real_sweep_resumes_without_rerunning_finished_runs(tiny_sweep, monkeypatch):
    summaries = sorted(tiny_sweep.glob("runs/*/summary.json"))
    assert len(summaries) == 12
    before = {p: p.stat().st_mtime_ns for p in summaries}
    rows_before = (tiny_sweep / "sweep.csv").read_text()

    def must_not_train(*_):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(runner, "execute_run", must_not_train)
    args = parser_with_sweep().parse_args(tiny_args(tiny_sweep))
    assert args.handler(args) == 0
    assert {p: p.stat().st_mtime_ns for p in summaries} == before
    assert (tiny_sweep / "sweep.csv").read_text() == rows_before  # same wall times, same rows


def test_real_sweep_reruns_only_an_unfinished_run(tiny_sweep, monkeypatch):
    victim = sorted(tiny_sweep.glob("runs/b00256-lars-*/summary.json"))[0]
    victim.unlink()
    trained = []
    real_execute = runner.execute_run

    def counting(cfg, run_dir, torchrun):
        trained.append(run_dir.name)
        return real_execute(cfg, run_dir, torchrun)

    monkeypatch.setattr(runner, "execute_run", counting)
    args = parser_with_sweep().parse_args(tiny_args(tiny_sweep))
    assert args.handler(args) == 0
    assert trained == [victim.parent.name]
    assert victim.is_file()


def test_real_sweep_refuses_other_settings_in_the_same_folder(tiny_sweep):
    args = parser_with_sweep().parse_args(tiny_args(tiny_sweep, "--set", "seed=5"))
    with pytest.raises(ConfigError, match="other settings"):
        args.handler(args)


def test_a_run_recorded_before_a_config_field_existed_is_the_same_plan(tiny_sweep, tmp_path,
                                                                      monkeypatch):
    """A field added to the config later (here data.decode_on_device) counts at its default in
    runs recorded without it, so upgrading bigbatch does not orphan a sweep; a real difference
    in the same record is still refused."""
    sweep = shutil.copytree(tiny_sweep, tmp_path / "sweep")
    plans = sorted(sweep.glob("runs/*/sweep_run.json"))
    for plan in plans:
        recorded = json.loads(plan.read_text())
        del recorded["data"]["decode_on_device"]
        plan.write_text(json.dumps(recorded))
    monkeypatch.setattr(runner, "execute_run", lambda *args: pytest.fail("a finished run reran"))
    args = parser_with_sweep().parse_args(tiny_args(sweep))
    assert args.handler(args) == 0
    recorded["data"]["augment"] = not recorded["data"]["augment"]
    plans[-1].write_text(json.dumps(recorded))
    with pytest.raises(ConfigError, match="other settings"):
        args.handler(args)


def test_torchrun_path_trains_on_two_processes_like_one(tmp_path):
    """--torchrun N: the run goes through torchrun (its log, world size 2) and gives the
    single-process result (the same global batch; docs/DISTRIBUTED.md)."""
    overrides = [*TINY_OVERRIDES, "global_batch=128", "micro_batch=64", "epochs=1",
                 "schedule.warmup_epochs=0.5", "optim.name=sgd", "optim.lr=0.1",
                 "precision=fp32", "channels_last=false"]
    summaries = {}
    for processes in (None, 2):
        cfg = resolve_config(None, None, [*overrides, f"out={tmp_path / str(processes)}"])
        summaries[processes] = runner.execute_run(cfg, Path(cfg.out), processes)
    assert (tmp_path / "2" / "torchrun.log").is_file()
    assert not (tmp_path / "None" / "torchrun.log").exists()
    assert summaries[2]["world_size"] == 2 and summaries[None]["world_size"] == 1
    assert summaries[2]["diverged"] is False and summaries[2]["steps"] == 4
    assert summaries[2]["top1"] == pytest.approx(summaries[None]["top1"], abs=0.5)
