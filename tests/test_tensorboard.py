"""log.tensorboard=true: the event files, read back with TensorBoard's own reader, hold the
values of metrics.jsonl; a crashed and resumed run has each step once; no package, exit 2."""

import os
import sys
from pathlib import Path

import pytest
from launch import TINY, run_bigbatch

from bigbatch.config import resolve_config, validate
from bigbatch.errors import ConfigError
from bigbatch.metrics import read_metrics
from bigbatch.train.tensorboard import scalars

TENSORBOARD = [*TINY, "--set", "log.tensorboard=true"]
TRAIN_TAGS = {"loss": "train/loss", "lr": "train/lr", "images_per_second":
              "train/images_per_second", "time_data": "step_time/data",
              "time_compute": "step_time/compute", "time_comm_exposed": "step_time/comm_exposed",
              "time_optimizer": "step_time/optimizer"}
EVAL_TAGS = {"top1": "eval/top1", "top5": "eval/top5", "loss": "eval/loss"}


def read_events(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} as TensorBoard shows them."""
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="the tensorboard package (the 'tensorboard' extra) is not installed")
    reader = event_accumulator.EventAccumulator(
        str(run_dir / "tensorboard"), size_guidance={event_accumulator.SCALARS: 0})
    reader.Reload()
    return {tag: [(event.step, event.value) for event in reader.Scalars(tag)]
            for tag in reader.Tags()["scalars"]}


def expected_from_metrics(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """The same {tag: [(step, value)]} built from metrics.jsonl."""
    expected: dict[str, list[tuple[int, float]]] = {}
    for record in read_metrics(run_dir / "metrics.jsonl"):
        tags = TRAIN_TAGS if record["kind"] == "train" else EVAL_TAGS
        pairs = [(tags[key], record[key]) for key in tags]
        pairs += [(f"trust_ratio/{name}", value)
                  for name, value in record.get("trust_layers", {}).items()]
        for tag, value in pairs:
            expected.setdefault(tag, []).append((record["step"], value))
    return expected


def assert_events_equal_metrics(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    events, expected = read_events(run_dir), expected_from_metrics(run_dir)
    assert any(tag.startswith("trust_ratio/") for tag in expected)
    for tag, pairs in expected.items():
        assert [step for step, _ in events[tag]] == [step for step, _ in pairs], tag
        # float32 in the event file; metrics.jsonl rounds to 8 decimals
        assert [value for _, value in events[tag]] == pytest.approx(
            [value for _, value in pairs], rel=1e-6, abs=2e-8), tag
    return events


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("tensorboard") / "run"
    run_bigbatch(["train", *TENSORBOARD, "--set", "eval_every=1", "--out", str(out)])
    return out


@pytest.mark.slow
@pytest.mark.fashion_mnist
def test_event_files_hold_the_values_of_metrics_jsonl(finished):
    events = assert_events_equal_metrics(finished)
    assert [step for step, _ in events["train/loss"]] == list(range(1, 9))
    assert [step for step, _ in events["eval/top1"]] == [4, 8]
    assert "trust_ratio/stem.0.weight" in events  # per-layer curves grouped under trust_ratio/


@pytest.mark.slow
@pytest.mark.fashion_mnist
def test_a_crashed_then_resumed_run_shows_each_step_once(tmp_path):
    out = tmp_path / "run"
    args = ["train", *TENSORBOARD, "--checkpoint-every", "3", "--resume", "auto",
            "--out", str(out)]
    crashed = run_bigbatch(args, env={"BIGBATCH_FAULT": "crash:step=7"}, check=False)
    assert crashed.returncode == 13
    # the crashed run got to step 7; its last checkpoint is step 6
    assert [step for step, _ in read_events(out)["train/loss"]] == list(range(1, 8))
    run_bigbatch(args)
    assert len(list((out / "tensorboard").iterdir())) == 2  # the resumed run appended a file
    events = assert_events_equal_metrics(out)
    for tag, pairs in events.items():
        steps = [step for step, _ in pairs]
        assert steps == sorted(set(steps)), f"{tag}: duplicated or stale steps {steps}"
    assert [step for step, _ in events["train/loss"]] == list(range(1, 9))


@pytest.mark.slow
@pytest.mark.fashion_mnist
def test_without_the_package_it_is_one_line_and_exit_2(tmp_path):
    blocker = tmp_path / "blocker" / "tensorboard"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('tensorboard is blocked here')\n")
    path = os.pathsep.join(filter(None, [str(blocker.parent), os.environ.get("PYTHONPATH")]))
    out = tmp_path / "run"
    result = run_bigbatch(["train", *TENSORBOARD, "--out", str(out)],
                          env={"PYTHONPATH": path}, check=False)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "pip install 'bigbatch[tensorboard]'" in lines[0]
    assert not out.exists()  # stopped before training started


def test_scalars_names_every_number_of_a_record():
    record = {"kind": "eval", "step": 4, "epoch": 1.0, "top1": 50.0, "top5": 90.0,
              "loss": 1.5, "examples": 1000}
    assert dict(scalars(record)) == {"eval/top1": 50.0, "eval/top5": 90.0, "eval/loss": 1.5}
    train = {"kind": "train", "step": 1, "lr": 0.1, "time_data": 0.2, "trust_min": 0.3,
             "trust_layers": {"a.weight": 0.5, "b.weight": 0.25}}
    assert dict(scalars(train)) == {"train/lr": 0.1, "step_time/data": 0.2, "train/trust_min": 0.3,
                                    "trust_ratio/a.weight": 0.5, "trust_ratio/b.weight": 0.25}


def test_a_run_needs_the_package_evaluating_saved_weights_does_not(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard: ImportError
    with pytest.raises(ConfigError, match="bigbatch\\[tensorboard\\]"):
        resolve_config(overrides=["log.tensorboard=true"])
    saved = resolve_config()
    saved.log.tensorboard = True
    validate(saved)  # what `bigbatch eval` checks of a run's saved config
