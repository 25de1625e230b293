"""benchmarks/lars_step_summary.py: medians and ranges over runs of the optimizer-step benchmark."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "lars_step_summary.py"


def run_record(lars, lamb, commit):
    return {"machine": {"commit": commit, "loadavg_1min": 1.0},
            "ratios": {"lars/sgd_fused": {"median_paired": lars},
                       "lamb/adamw_fused": {"median_paired": lamb}}}


def test_medians_and_ranges_of_the_chosen_lines(tmp_path):
    lines = [run_record(9.0, 9.0, "x"), run_record(1.3, 1.5, "a"), run_record(1.2, 1.4, "b"),
             run_record(1.21, 1.6, "c")]
    (tmp_path / "lars_step.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    for _ in range(2):  # rerunning replaces the entry of the same lines
        subprocess.run([sys.executable, str(SCRIPT), "2-4", "--results", str(tmp_path)],
                       check=True, capture_output=True)
    [entry] = json.loads((tmp_path / "lars_step_summary.json").read_text())
    assert entry["lines"] == "2-4" and entry["commits"] == ["a", "b", "c"]
    assert entry["ratios"]["lars/sgd_fused"] == {"median": 1.21, "min": 1.2, "max": 1.3,
                                                 "runs": [1.3, 1.2, 1.21]}
    assert entry["ratios"]["lamb/adamw_fused"]["median"] == 1.5


def test_lines_outside_the_record_are_one_line_errors(tmp_path):
    gpu = run_record(1, 1, "b")
    gpu["machine"]["device"] = "cuda"
    (tmp_path / "lars_step.jsonl").write_text(json.dumps(run_record(1, 1, "a")) + "\n"
                                              + json.dumps(gpu) + "\n")
    for lines in ("5-6", "x-y", "1-3", "1-2"):  # past the end, not numbers, two devices
        done = subprocess.run([sys.executable, str(SCRIPT), lines, "--results", str(tmp_path)],
                              capture_output=True, text=True)
        assert done.returncode != 0 and "lars_step_summary:" in done.stderr
        assert "Traceback" not in done.stderr
