"""The planner against published runs: the data file, its labels, the bands, the step by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bigbatch.commands import main
from bigbatch.errors import EXIT_USER_ERROR, ConfigError
from bigbatch.tools.plan.curve import fit_step_time
from bigbatch.tools.plan.layers import layer_counts
from bigbatch.tools.plan.network import (
    Network,
    allreduce_seconds,
    pipelined_tree_allreduce_seconds,
)
from bigbatch.tools.plan.prediction import calibrate, make_context, predict_run
from bigbatch.tools.plan.published import (
    DATA_FILE,
    LABELS,
    labelled_inputs,
    load_published,
    published_predictions,
)

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "docs/results/published_runs.json"
CURVE_RECORD = REPO / "docs/results/device_batch_curve.jsonl"


@pytest.fixture(scope="module")
def result() -> dict:
    return published_predictions()


@pytest.fixture(scope="module")
def context():
    return make_context(load_published())


# ----------------------------------------------------------------------------- the data file


def test_every_input_is_labelled_with_a_source_or_a_record():
    data = load_published()
    inputs = dict(labelled_inputs(data))
    assert len(inputs) >= 40
    for where, item in inputs.items():
        assert item["label"] in LABELS, where
        assert item["source"], where
        if item["label"] == "measured":
            assert (REPO / item["record"]).exists(), where
    assert {item["label"] for item in inputs.values()} == set(LABELS)
    for run in data["runs"]:
        assert run["source"] and isinstance(run["assumptions"], list), run["id"]


def test_the_measured_gpu_figure_is_its_record_median():
    figure = load_published()["devices"]["h200-sxm"]["throughput"]
    summary = json.loads((REPO / figure["record"]).read_text())
    runs = summary[0]["runs"]["resnet50 bf16 channels_last"]["images_per_second"]
    assert figure["images_per_second"] == runs["median"]
    assert figure["batch"] == 256


def test_one_constant_is_fitted_on_one_run(result):
    calibrated = [row for row in result["rows"] if row["calibration"]]
    assert [row["id"] for row in calibrated] == [result["calibration"]["run"]]
    assert calibrated[0]["ratio"] == pytest.approx(1.0, abs=1e-6)
    assert result["calibration"]["constant"] == "mlperf_stack_speedup"
    assert 1.0 < result["calibration"]["value"] < 5.0  # MLPerf's stack is the faster one


@pytest.mark.parametrize(
    "change, message",
    [
        ({"label": "guess"}, "not one of measured"),
        ({"source": ""}, "has no source"),
    ],
)
def test_an_unlabelled_input_is_a_config_error(tmp_path, change, message):
    data = json.loads(DATA_FILE.read_text())
    data["inputs"]["kernel_floor_s"].update(change)
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=message):
        load_published(path)


def test_a_run_on_an_unknown_device_is_a_config_error(tmp_path):
    data = json.loads(DATA_FILE.read_text())
    data["runs"][0]["device"] = "h300"
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="unknown device 'h300'"):
        load_published(path)


# ----------------------------------------------------------------------------- the bands


def test_every_run_is_in_its_band_or_its_miss_has_a_cause(result):
    groups = {row["group"] for row in result["rows"]}
    assert groups == {"mlperf", "record", "paper"}
    for row in result["rows"]:
        low, high = row["band"]
        if row["known_miss"]:
            assert not low <= row["ratio"] <= high, f"{row['id']}: stale miss note"
        else:
            assert low <= row["ratio"] <= high, f"{row['id']}: ratio {row['ratio']:.3f}"
    assert all(row["in_band"] for row in result["rows"] if row["group"] == "mlperf")


def test_the_strong_scaling_speedup_is_within_its_band(result):
    check = result["speedup"]
    assert check["published"] == pytest.approx(13.466 / 0.183)
    assert check["low"] <= check["predicted"] / check["published"] <= check["high"]


def test_the_bands_catch_a_broken_model():
    """Without the per-kernel floor the small-batch MLPerf runs come out too fast."""
    broken = published_predictions({"kernel_floor_s": 0.0})
    missed = {row["id"] for row in broken["rows"] if not row["in_band"] and not row["known_miss"]}
    assert "mlperf-v3.0-h100-3584" in missed


def test_the_committed_table_is_what_the_planner_prints_now(result):
    record = json.loads(RECORD.read_text())
    assert [row["id"] for row in record["rows"]] == [row["id"] for row in result["rows"]]
    for kept, now in zip(record["rows"], result["rows"], strict=True):
        assert kept["predicted_minutes"] == pytest.approx(now["predicted_minutes"], rel=1e-9)
    assert record["speedup"]["predicted"] == pytest.approx(result["speedup"]["predicted"])


# ----------------------------------------------------------------------------- by hand


def test_the_3584_gpu_step_by_hand(context):
    data = context.data
    run = next(r for r in data["runs"] if r["id"] == "mlperf-v3.0-h100-3584")
    speedup = calibrate(context)
    item = predict_run(run, speedup, context)
    floor = data["inputs"]["kernel_floor_s"]["value"]
    h100 = data["devices"]["h100-sxm"]
    t0 = 370 * floor + 20 * context.parameters / h100["memory_bandwidth"]["value"]
    assert item.curve.training.fixed_s == pytest.approx(t0)
    sync_bn = 2 * 53 * (1e-6 + floor)  # BN over 2 GPUs, 1 us per NVLink step
    phase = item.phases[0]
    assert phase.local_batch == 16
    assert phase.compute == pytest.approx(t0 + 16 * item.curve.training.per_image_s + sync_bn)
    gradient = 2 * context.parameters
    inside = 2 * 7 * 1e-6 + 2 * 7 / 8 * gradient * 8 / 3600e9  # ring of 8 on NVLink4
    across = 2 * 9 * 2e-6 + 2 * gradient * 8 / 3200e9  # pipelined tree over 448 nodes
    assert phase.allreduce == pytest.approx(inside + across)
    assert phase.exposed == phase.allreduce  # no overlap under CUDA graphs
    assert phase.steps == pytest.approx(77 * 1_281_167 / 57_344)
    evaluation = 20 * 1 * (158 * floor + 16 * item.curve.training.per_image_s / 3)
    assert item.evaluation_s == pytest.approx(evaluation)
    assert item.total_s == pytest.approx(phase.steps * phase.step + evaluation)


def test_h100_per_image_time_is_the_h200_record_scaled_by_the_roofline(context):
    from bigbatch.tools.plan.prediction import per_image_seconds, roofline_seconds

    devices = context.data["devices"]
    h200, _ = per_image_seconds("h200-sxm", context)
    h100, stack = per_image_seconds("h100-sxm", context)
    ratio = roofline_seconds(devices["h100-sxm"], context) / roofline_seconds(
        devices["h200-sxm"], context
    )
    assert stack == "bigbatch" and h100 == pytest.approx(h200 * ratio)
    assert 1.0 < ratio < 4.8 / 3.35  # partly memory-bound: between equal and the HBM ratio


def test_pipelined_tree_by_hand():
    assert pipelined_tree_allreduce_seconds(1e6, 1, 1e-6, 1e-9) == 0.0
    assert pipelined_tree_allreduce_seconds(1e6, 448, 2e-6, 1e-9) == pytest.approx(
        2 * 9 * 2e-6 + 2 * 1e6 * 1e-9
    )
    network = Network(alpha=2e-6, beta=1e-9, topology="pipelined-tree")
    assert allreduce_seconds(1e6, 5, network) == pytest.approx(2 * 3 * 2e-6 + 2e-3)


def test_resnet50_layer_counts():
    counts = layer_counts("resnet50")
    assert (counts.matmuls, counts.norms, counts.elementwise) == (54, 53, 104)
    assert counts.training_kernels == 158 + 2 * 54 + 104
    assert counts.activation_bytes(2) == counts.elementwise_elements * 5 * 2


# ----------------------------------------------------------------------------- the curve


def test_step_curve_fit_recovers_a_line():
    points = [(b, 0.5 + 0.1 * b) for b in (1, 2, 4, 8, 16)]
    curve = fit_step_time(points)
    assert curve.fixed_s == pytest.approx(0.5) and curve.per_image_s == pytest.approx(0.1)
    assert curve.half_batch == pytest.approx(5.0)
    assert curve.images_per_second(5) == pytest.approx(0.5 * 10)  # half of r_max = 10
    # A line that would cross below zero is held at the origin.
    through_origin = fit_step_time([(1, 0.05), (10, 1.0)])
    assert through_origin.fixed_s == 0.0 and through_origin.per_image_s > 0


@pytest.mark.parametrize(
    "points, message",
    [([(4, 1.0), (4, 1.1)], "two different batches"), ([(1, 0.0), (2, 1.0)], "positive")],
)
def test_bad_curve_points_are_config_errors(points, message):
    with pytest.raises(ConfigError, match=message):
        fit_step_time(points)


def test_the_cpu_curve_record_is_its_own_medians_fitted():
    lines = [json.loads(line) for line in CURVE_RECORD.read_text().splitlines() if line]
    assert lines
    for record in lines:
        points = [(row["batch"], row["step_s"]["median"]) for row in record["rows"]]
        fit = fit_step_time(points)
        assert fit.per_image_s == pytest.approx(record["fit"]["per_image_s"], rel=1e-9)
        assert record["load_average_before"] and "niced background" in record["note"]
        for row in record["rows"]:
            assert row["step_s"]["min"] <= row["step_s"]["median"] <= row["step_s"]["max"]


# ----------------------------------------------------------------------------- command line


def test_published_command_prints_every_run(capsys):
    assert main(["plan", "--published"]) == 0
    text = capsys.readouterr().out
    for label in ("MLPerf v3.0, 448 HGX H100", "Goyal et al. 2017", "Ying et al. 2018"):
        assert label in text
    assert "calibration" in text and "speed-up" in text and "[measured]" in text
    assert main(["plan", "--published", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert all(row["ratio"] == row["predicted_minutes"] / row["published_minutes"] for row in rows)


@pytest.mark.parametrize(
    "value, message",
    [("kernel_floor_s", "KEY=NUMBER"), ("nope=1", "unknown published-run input")],
)
def test_bad_published_input_is_a_one_line_error(value, message, capsys):
    assert main(["plan", "--published", "--published-input", value]) == EXIT_USER_ERROR
    error = capsys.readouterr().err.strip()
    assert message in error and "\n" not in error
