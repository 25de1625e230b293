"""PNG figures of a sweep (top-1 against batch size) and of a run (loss, top-1, LR, trust ratios).

    bigbatch plot runs/sweep                 # -> runs/sweep/sweep.png
    bigbatch plot runs/fashion-mnist         # -> runs/fashion-mnist/training.png

Figures are drawn with matplotlib's object API on an Agg canvas (no pyplot, no global backend
switch), so plotting works on machines without a display and leaves no state behind.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bigbatch.errors import ConfigError
from bigbatch.tools.sweep.series import SERIES

# The paper's claim is "within 1 point of the small-batch accuracy" (You et al., ICPP 2018), so
# the baseline band spans the best small-batch top-1 plus and minus that one point.
BASELINE_BAND_POINTS = 1.0


# Colour and marker of each sweep series; the legend is the series' own label.
OPTIMIZER_STYLE = {name: (color, marker, SERIES[name].label) for name, color, marker in (
    ("sgd", "tab:orange", "s"), ("lars", "tab:blue", "o"), ("lars-paper", "tab:green", "^"),
    ("lars-mlperf", "tab:red", "v"), ("lamb", "tab:purple", "D"))}


def new_figure(rows: int, columns: int, size: tuple[float, float]):
    """A (figure, axes) pair on an Agg canvas; ConfigError if matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError("plotting needs matplotlib: pip install 'bigbatch[plot]' "
                          "(or pip install matplotlib)") from None
    figure = Figure(figsize=size, dpi=110)
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False)
    return figure, axes


def _number(value: Any) -> float:
    """A metric value as float; the metrics log spells NaN/Inf as strings."""
    if value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def load_sweep(folder: Path) -> dict[str, Any]:
    path = folder / "sweep.json"
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path} is not valid JSON ({error}); rerun the sweep to rewrite "
                          "it") from None


def baseline_point(best: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The small-batch baseline: the SGD point at the smallest batch (else any optimizer's)."""
    finished = [p for p in best if p.get("best_top1") is not None]
    if not finished:
        return None
    smallest = min(p["batch"] for p in finished)
    at_smallest = [p for p in finished if p["batch"] == smallest]
    return next((p for p in at_smallest if p["optimizer"] == "sgd"), at_smallest[0])


def plot_sweep(folder: Path, out: Path) -> Path:
    """Best top-1 against global batch (log2 axis), one line per optimizer, baseline band."""
    record = load_sweep(folder)
    best = record.get("best", [])
    if not best:
        raise ConfigError(f"{folder / 'sweep.json'} has no finished points yet; nothing to plot")
    figure, axes = new_figure(1, 1, (7.0, 4.6))
    ax = axes[0][0]
    baseline = baseline_point(best)
    if baseline is not None:
        top1 = baseline["best_top1"]
        ax.axhspan(top1 - BASELINE_BAND_POINTS, top1 + BASELINE_BAND_POINTS, color="0.85",
                   label=f"baseline B={baseline['batch']} {baseline['optimizer'].upper()} "
                         f"{top1:.2f}% ± {BASELINE_BAND_POINTS:g} point")
        ax.axhline(top1, color="0.5", linewidth=0.8)
    optimizers = [o for o in record.get("settings", {}).get("optimizers", [])
                  if any(p["optimizer"] == o for p in best)]
    for index, name in enumerate(optimizers or sorted({p["optimizer"] for p in best})):
        points = sorted((p for p in best if p["optimizer"] == name), key=lambda p: p["batch"])
        color, marker, label = OPTIMIZER_STYLE.get(name, ("black", "x", name))
        xs = [p["batch"] for p in points]
        ys = [_number(p.get("best_top1")) for p in points]
        ax.plot(xs, ys, color=color, marker=marker, label=label)
        tried = [(r["batch"], _number(r.get("top1"))) for r in record.get("runs", [])
                 if r.get("optimizer") == name and not math.isnan(_number(r.get("top1")))]
        if tried:
            # every LR of the grid, faint, so the reader sees how flat or sharp each optimum is
            ax.scatter(*zip(*tried, strict=True), color=color, marker=marker, s=10, alpha=0.25)
        for x, y, point in zip(xs, ys, points, strict=True):
            if not math.isnan(y):
                # first optimizer's labels above its points, the second's below: no overlap
                ax.annotate(f"{point['best_lr']:.3g}", (x, y), textcoords="offset points",
                            xytext=(0, 6 if index % 2 == 0 else -12), ha="center", fontsize=7,
                            color=color)
    ax.set_xscale("log", base=2)
    batches = sorted({p["batch"] for p in best} | {r["batch"] for r in record.get("runs", [])})
    ax.set_xticks(batches)
    ax.set_xticklabels([_batch_label(b) for b in batches])
    ax.set_xlabel("global batch size")
    recomputed = any("recomputed" in label for label in record.get("selected_on", []))
    ax.set_ylabel("top-1 (%" + (", BN statistics recomputed" if recomputed else "")
                  + "): best LR (line), every LR tried (dots)", fontsize=9 if recomputed else 10)
    settings = record.get("settings", {})
    epochs = settings.get("epochs")
    budget = f"{epochs:g}" if isinstance(epochs, (int, float)) else "?"
    ax.set_title(f"Batch-size scaling at a fixed budget of {budget} epochs "
                 "(labels: best peak LR)", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    return save(figure, out)


def _batch_label(batch: int) -> str:
    return f"{batch // 1024}K" if batch >= 1024 and batch % 1024 == 0 else str(batch)


def load_run_metrics(folder: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train records, eval records) of a run's metrics.jsonl; cut-off lines are skipped."""
    train, evaluations = [], []
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("kind") == "train":
            train.append(record)
        elif record.get("kind") == "eval":
            evaluations.append(record)
    return train, evaluations


def plot_run(folder: Path, out: Path) -> Path:
    """Loss, top-1 and LR against step, and the per-layer LARS trust ratios."""
    train, evaluations = load_run_metrics(folder)
    if not train:
        raise ConfigError(f"{folder / 'metrics.jsonl'} has no training records yet; "
                          "nothing to plot")
    figure, axes = new_figure(2, 2, (10.0, 7.0))
    steps = [r["step"] for r in train]

    loss_ax = axes[0][0]
    eval_steps = [r["step"] for r in evaluations]
    loss_ax.plot(steps, [_number(r.get("loss")) for r in train], color="tab:red", linewidth=1,
                 label="training")
    if evaluations:
        loss_ax.plot(eval_steps, [_number(r.get("loss")) for r in evaluations],
                     color="black", marker="o", markersize=3, linewidth=1, label="validation")
        loss_ax.legend(fontsize=8)
    loss_ax.set_ylabel("loss (training, per step)")

    top1_ax = axes[0][1]
    if evaluations:
        top1_ax.plot(eval_steps, [_number(r.get("top1")) for r in evaluations],
                     marker="o", markersize=3, color="tab:green", label="top-1")
        top1_ax.plot(eval_steps, [_number(r.get("top5")) for r in evaluations],
                     marker=".", markersize=3, color="tab:olive", linewidth=0.8, label="top-5")
        top1_ax.legend(fontsize=8)
    else:
        _empty_note(top1_ax, "no evaluation yet")
    top1_ax.set_ylabel("validation accuracy (%)")

    lr_ax = axes[1][0]
    lr_ax.plot(steps, [_number(r.get("lr")) for r in train], color="tab:purple")
    lr_ax.set_ylabel("global LR γ_t (warmup + decay)")

    plot_trust_ratios(axes[1][1], train)
    for row in axes:
        for ax in row:
            ax.set_xlabel("global step")
            ax.grid(True, alpha=0.3)
    figure.suptitle(_run_title(folder), fontsize=10)
    return save(figure, out)


def plot_trust_ratios(ax, train: list[dict[str, Any]]) -> None:
    """LARS local LR against step: one line per layer, coloured from the first layer (dark) to
    the last (yellow), with the median over layers; runs logged before per-layer records get
    the min-max band over layers instead."""
    layered = [r for r in train if isinstance(r.get("trust_layers"), dict)]
    if layered:
        _plot_layer_lines(ax, layered)
    elif any("trust_median" in r for r in train):
        _plot_layer_band(ax, [r for r in train if "trust_median" in r])
    else:
        _empty_note(ax, "no LARS trust ratios in this run (optimizer is not LARS)")
        return
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.set_ylabel("LARS local LR λ_l = η‖w‖/(‖g‖+β‖w‖)")


def _plot_layer_lines(ax, records: list[dict[str, Any]]) -> None:
    from matplotlib import colormaps

    names = list(dict.fromkeys(name for r in records for name in r["trust_layers"]))
    colours = colormaps["viridis"]
    steps = [r["step"] for r in records]
    for i, name in enumerate(names):
        values = [_number(r["trust_layers"].get(name)) for r in records]
        first_or_last = i in (0, len(names) - 1)
        ax.plot(steps, values, color=colours(i / max(1, len(names) - 1)), linewidth=0.7,
                alpha=0.8, label=name if first_or_last else None)
    ax.plot(steps, [_number(r.get("trust_median")) for r in records], color="black",
            linewidth=1.4, linestyle="--", label=f"median of {len(names)} layers")


def _plot_layer_band(ax, records: list[dict[str, Any]]) -> None:
    steps = [r["step"] for r in records]
    ax.fill_between(steps, [_number(r.get("trust_min")) for r in records],
                    [_number(r.get("trust_max")) for r in records], color="tab:blue",
                    alpha=0.25, label="min–max over layers")
    ax.plot(steps, [_number(r.get("trust_median")) for r in records], color="tab:blue",
            label="median")


def _run_title(folder: Path) -> str:
    summary_path = folder / "summary.json"
    if summary_path.is_file():
        try:
            s = json.loads(summary_path.read_text())
            return (f"{folder.name}: {s.get('model')} {s.get('optimizer')}, batch "
                    f"{s.get('global_batch')}, top-1 {_number(s.get('top1')):.2f}%")
        except json.JSONDecodeError:
            pass
    return folder.name


def _empty_note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=9)


def save(figure, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(out, format="png")
    return out


def plot_target(target: str | Path, out: str | Path | None = None) -> Path:
    """Plot a sweep folder (has sweep.json) or a run folder (has metrics.jsonl); return the PNG."""
    folder = Path(target)
    if not folder.is_dir():
        raise ConfigError(f"'{target}' is not a folder; pass a run or sweep folder")
    if out is not None and not str(out).lower().endswith(".png"):
        raise ConfigError(f"--out must name a .png file, got '{out}'")
    if (folder / "sweep.json").is_file():
        return plot_sweep(folder, Path(out) if out else folder / "sweep.png")
    if (folder / "metrics.jsonl").is_file():
        return plot_run(folder, Path(out) if out else folder / "training.png")
    raise ConfigError(f"'{target}' has neither sweep.json (a sweep) nor metrics.jsonl (a run)")
