"""benchmarks/study20_verdict.py: the paper's three expectations judged on a sweep record."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "study20_verdict.py"
sys.path.insert(0, str(SCRIPT.parent))

from study20_verdict import judge, matching_batch  # noqa: E402


def point(batch, optimizer, top1, trained, seeds=None):
    return {"batch": batch, "optimizer": optimizer, "best_top1": top1,
            "best_trained_top1": trained, "seeds": seeds}


def record():
    seeds = {"top1": {"0": 80.0, "1": 84.0, "2": 82.0},
             "trained_top1": {"0": 70.0, "1": 71.0, "2": 72.0}}
    return {"settings": {"batch_sizes": [128, 2048, 8192], "optimizers": ["sgd", "lars-paper"]},
            "best": [point(128, "sgd", 85.0, 84.0), point(128, "lars-paper", 85.5, 84.0),
                     point(2048, "sgd", 83.0, 80.0), point(2048, "lars-paper", 84.5, 79.0),
                     point(8192, "sgd", 79.0, 60.0), point(8192, "lars-paper", 99.0, 75.0, seeds)]}


def test_steps_per_epoch_nearest_imagenet_32k():
    assert matching_batch([128, 512, 2048, 4096, 8192, 16384], 60000) == 2048
    assert matching_batch([128, 512, 1024, 4096], 60000) == 1024


def test_each_expectation_point_by_point_with_the_seeds_mean():
    verdict = judge(record(), "top1", 60000)
    rows = {c["batch"]: c for c in verdict["checks"]}
    assert verdict["baseline"] == 85.0 and verdict["matching_batch"] == 2048
    assert rows[2048]["lead"] == pytest.approx(1.5) and rows[2048]["e1"] is True
    assert rows[2048]["e2"] is None and rows[2048]["e3"] is True  # 84.5 >= 85 - 1
    # 8192: the three seeds' mean (82, not the first pass's 99) against SGD's 79
    assert rows[8192]["lars"] == pytest.approx(82.0) and rows[8192]["lars_std"] == pytest.approx(2)
    assert rows[8192]["e1"] is True and rows[8192]["e2"] is True and rows[8192]["e3"] is None
    assert verdict["holds"] == {"lars-paper": {"e1": True, "e2": True, "e3": True}}


def test_the_as_trained_number_is_judged_apart():
    verdict = judge(record(), "trained_top1", 60000)
    rows = {c["batch"]: c for c in verdict["checks"]}
    assert rows[2048]["lead"] == pytest.approx(-1.0) and rows[2048]["e1"] is False
    assert rows[2048]["e3"] is False  # 79 < 84 - 1
    assert rows[8192]["lead"] == pytest.approx(11.0)  # seeds' mean 71 against 60
    assert verdict["holds"]["lars-paper"] == {"e1": False, "e2": True, "e3": False}


def test_script_writes_verdict_files_and_refuses_a_missing_record(tmp_path):
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps(record()))
    done = subprocess.run([sys.executable, str(SCRIPT), str(sweep)], capture_output=True,
                          text=True, check=True)
    assert "| lars-paper | holds | holds | holds |" in done.stdout
    assert (tmp_path / "verdict.md").read_text() == done.stdout
    assert json.loads((tmp_path / "verdict.json").read_text())[1]["number"] == "trained_top1"
    missing = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "nope.json")],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_a_diverged_seed_is_left_out_and_an_untested_expectation_says_so():
    data = record()
    data["best"][-1]["seeds"]["top1"]["1"] = None  # that seed diverged: mean of 80 and 82
    data["settings"]["batch_sizes"] = [128, 2048, 8192]
    verdict = judge(data, "top1", 60000)
    assert {c["batch"]: c for c in verdict["checks"]}[8192]["lars"] == pytest.approx(81.0)
    small = {"settings": {"batch_sizes": [128, 512], "optimizers": ["sgd", "lars-paper"]},
             "best": [point(128, "sgd", None, None), point(128, "lars-paper", 80.0, 80.0),
                      point(512, "sgd", 70.0, 70.0), point(512, "lars-paper", 75.0, 75.0)]}
    verdict = judge(small, "top1", 60000)
    assert verdict["baseline"] == 0.0  # SGD learned nothing at the smallest batch
    assert verdict["holds"]["lars-paper"] == {"e1": None, "e2": None, "e3": True}
