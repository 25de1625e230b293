"""benchmarks/gpu_summary.py: medians, ranges and ratios over runs of benchmarks/gpu.sh."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_summary.py"
EAGER, COMPILED = "resnet50 bf16 channels_last", "resnet50 bf16 channels_last compile"


def gpu_record(gpu, eager, compiled=None, gpus=1, commit="c"):
    runs = [{"run": EAGER, "images_per_second": eager, "steps": 60, "top1": 0.5}]
    if compiled is not None:
        runs.append({"run": COMPILED, "images_per_second": compiled, "steps": 60, "top1": 0.2})
    return {"suite": "gpu", "gpu": gpu, "gpus": gpus, "torch": "2.x", "commit": commit,
            "date": "d", "runs": runs, "anchors_images_per_second_one_gpu": {"ref": 4000}}


def summarize(tmp_path, records, gpu):
    (tmp_path / "train_throughput.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records))
    return subprocess.run([sys.executable, str(SCRIPT), gpu, "--results", str(tmp_path)],
                          capture_output=True, text=True)


def test_medians_ranges_and_ratios_of_one_gpu_kind(tmp_path):
    records = [{"suite": "threads"}, gpu_record("G", 3000, 3300), gpu_record("G", 2000, 2400),
               gpu_record("G", 4600), gpu_record("Other", 9999, 9999),
               gpu_record("G", 9999, 9999, gpus=8)]
    for _ in range(2):  # rerunning replaces the entry of the same GPU
        assert summarize(tmp_path, records, "G").returncode == 0
    [entry] = json.loads((tmp_path / "gpu" / "summary.json").read_text())
    assert entry["gpu"] == "G" and entry["records"] == 3
    assert entry["runs"][EAGER]["images_per_second"] == {
        "median": 3000, "min": 2000, "max": 4600, "runs": [3000, 2000, 4600]}
    assert entry["runs"][COMPILED]["images_per_second"]["median"] == 2850
    assert entry["compiled_over_eager"]["runs"] == [1.1, 1.2]  # the record without both: left out
    assert entry["median_over_anchor"][EAGER] == {"ref": 0.75}


def test_no_record_of_that_gpu_is_a_one_line_error(tmp_path):
    done = summarize(tmp_path, [gpu_record("G", 1)], "H")
    assert done.returncode != 0 and "gpu_summary:" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_engine_over_its_peer_and_failed_parts(tmp_path):
    """engine_over_peer and jpeg_folder_over_synthetic record by record; a part that failed
    (its run carries an error, no images/s) is counted, not averaged."""
    peer, jpeg = "peer plain loop bf16 channels_last", "resnet50 bf16 channels_last jpeg folder"
    first, second = gpu_record("G", 3000), gpu_record("G", 3300)
    first["runs"] += [{"run": peer, "images_per_second": 3000 / 0.9, "steps": 60, "top1": None},
                      {"run": jpeg, "images_per_second": 2400, "steps": 60, "top1": 0.1}]
    second["runs"] += [{"run": peer, "images_per_second": 3300, "steps": 60, "top1": None},
                       {"run": jpeg, "error": "bigbatch: error: no images"}]
    assert summarize(tmp_path, [first, second], "G").returncode == 0
    [entry] = json.loads((tmp_path / "gpu" / "summary.json").read_text())
    assert entry["engine_over_peer"]["runs"] == [0.9, 1.0]
    assert entry["jpeg_folder_over_synthetic"]["runs"] == [0.8]
    assert entry["failed"] == {jpeg: 1}
    assert entry["runs"][jpeg]["images_per_second"]["runs"] == [2400]
