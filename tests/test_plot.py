"""Plot: PNG files for a run and for a sweep, and clear errors for folders that are neither."""

from __future__ import annotations

import argparse
import builtins
import json
from pathlib import Path

import pytest

from bigbatch.commands import plot as plot_command
from bigbatch.errors import ConfigError
from bigbatch.tools import plot as plot_tools

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def parser_with_plot() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bigbatch")
    plot_command.add_commands(parser.add_subparsers())
    return parser


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, which follows the 8-byte signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


LAYERS = ("stem.weight", "block.weight", "fc.weight")


def write_run(folder: Path, lars: bool = True, per_layer: bool = True) -> Path:
    """A run folder as the engine writes it: train and eval records, NaN spelled as a string."""
    folder.mkdir(parents=True)
    lines = []
    for step in range(1, 41):
        record = {"kind": "train", "step": step, "epoch": step / 10, "lr": min(step, 10) * 0.5,
                  "loss": 2.3 / step ** 0.3, "images_per_second": 1000.0}
        if lars:
            record.update(trust_min=1e-4 * step, trust_median=1e-3, trust_max=2e-2)
        if lars and per_layer:
            record["trust_layers"] = dict(zip(LAYERS, (1e-4 * step, 1e-3, 2e-2), strict=True))
        lines.append(record)
        if step % 10 == 0:
            lines.append({"kind": "eval", "step": step, "epoch": step / 10, "top1": 50 + step,
                          "top5": 90.0, "loss": 1.0 / step})
    lines[3]["loss"] = "nan"
    text = "".join(json.dumps(r) + "\n" for r in lines) + '{"kind": "train", "st'  # cut-off line
    (folder / "metrics.jsonl").write_text(text)
    (folder / "summary.json").write_text(json.dumps(
        {"top1": 90.0, "model": "small_cnn", "optimizer": "lars", "global_batch": 4096}))
    return folder


def write_sweep(folder: Path) -> Path:
    folder.mkdir(parents=True)
    best = []
    for batch, sgd, lars in ((128, 90.0, 89.5), (2048, 88.0, 89.4), (16384, 60.0, 80.0)):
        best.append({"batch": batch, "optimizer": "sgd", "best_top1": sgd, "best_lr": 0.1})
        best.append({"batch": batch, "optimizer": "lars", "best_top1": lars, "best_lr": 8.0})
    best.append({"batch": 32768, "optimizer": "sgd", "best_top1": None, "best_lr": None})
    record = {"settings": {"epochs": 4, "optimizers": ["sgd", "lars"]}, "best": best, "runs": []}
    (folder / "sweep.json").write_text(json.dumps(record))
    return folder


def test_run_plot_is_a_png_with_four_panels_worth_of_pixels(tmp_path):
    run = write_run(tmp_path / "run")
    out = plot_tools.plot_target(run)
    assert out == run / "training.png"
    width, height = png_size(out)
    assert (width, height) == (1100, 770)  # 10 x 7 inches at 110 dpi
    assert out.stat().st_size > 20_000


def test_trust_panel_draws_a_line_per_layer_and_the_median(tmp_path):
    import matplotlib.pyplot as plt

    train, _ = plot_tools.load_run_metrics(write_run(tmp_path / "run"))
    figure, ax = plt.subplots()
    plot_tools.plot_trust_ratios(ax, train)
    assert len(ax.lines) == len(LAYERS) + 1
    assert [line.get_label() for line in ax.get_legend().get_lines()] == [
        "stem.weight", "fc.weight", "median of 3 layers"]
    assert list(ax.lines[0].get_ydata()[:2]) == [1e-4, 2e-4]  # the first layer, steps 1 and 2
    assert ax.get_yscale() == "log"
    plt.close(figure)


def test_trust_panel_of_a_run_without_per_layer_records_draws_the_band(tmp_path):
    import matplotlib.pyplot as plt

    train, _ = plot_tools.load_run_metrics(write_run(tmp_path / "run", per_layer=False))
    figure, ax = plt.subplots()
    plot_tools.plot_trust_ratios(ax, train)
    assert len(ax.lines) == 1 and len(ax.collections) == 1  # median line, min-max band
    plt.close(figure)


def test_run_plot_without_trust_ratios_still_draws(tmp_path):
    out = plot_tools.plot_target(write_run(tmp_path / "sgd", lars=False),
                                 tmp_path / "x" / "sgd.png")
    assert png_size(out) == (1100, 770)


def test_sweep_plot_through_the_cli(tmp_path, capsys):
    folder = write_sweep(tmp_path / "sweep")
    args = parser_with_plot().parse_args(["plot", str(folder), "--out", str(tmp_path / "s.png")])
    assert args.handler(args) == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 's.png'}"
    assert png_size(tmp_path / "s.png") == (770, 506)  # 7 x 4.6 inches at 110 dpi
    assert (tmp_path / "s.png").stat().st_size > 15_000


def test_baseline_is_the_smallest_batch_sgd_point():
    best = [{"batch": 256, "optimizer": "sgd", "best_top1": 91.0},
            {"batch": 128, "optimizer": "lars", "best_top1": 92.0},
            {"batch": 128, "optimizer": "sgd", "best_top1": 90.0},
            {"batch": 64, "optimizer": "sgd", "best_top1": None}]
    assert plot_tools.baseline_point(best)["best_top1"] == 90.0


@pytest.mark.parametrize("make, words", [
    (lambda p: p, "neither sweep.json"),
    (lambda p: p / "missing", "is not a folder"),
])
def test_folders_that_are_not_runs_are_config_errors(tmp_path, make, words):
    with pytest.raises(ConfigError, match=words):
        plot_tools.plot_target(make(tmp_path))


def test_out_must_be_a_png(tmp_path):
    with pytest.raises(ConfigError, match=r"\.png"):
        plot_tools.plot_target(write_run(tmp_path / "r"), tmp_path / "figure.pdf")


def test_missing_matplotlib_is_a_config_error(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(ConfigError, match="pip install"):
        plot_tools.plot_target(write_run(tmp_path / "r"))
