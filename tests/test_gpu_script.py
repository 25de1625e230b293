"""benchmarks/gpu.sh end to end in its CPU dry-run mode, so it cannot rot before a GPU runs it."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from bigbatch.config import load_recipe

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu.sh"

pytestmark = [pytest.mark.slow, pytest.mark.fashion_mnist]


def dry_run(tmp_path: Path, **settings: str) -> subprocess.CompletedProcess:
    """gpu.sh on the CPU at tiny sizes, two processes (the torchrun path)."""
    env = dict(os.environ, CPU_DRY_RUN="1", PYTHON=sys.executable, BATCH="2", STEPS="2",
               WARMUP="1", NPROC="2", IMAGE_SIZE="32", WORKERS="0", FMNIST_EPOCHS="1",
               FMNIST_SET="data.train_subset=512 data.val_subset=500 global_batch=256 "
                          "micro_batch=128 model.options.width=8 data.workers=0",
               JPEGS="8", SMALL_BATCH="2", LARGE_BATCH="4", OUT=str(tmp_path),
               OMP_NUM_THREADS="1",
               # At 32x32 ResNet-50's last stage is 1x1, so BatchNorm over 2 images can blow a
               # step up (seen on the JPEG run, loss 15,064 at step 2): the plumbing is checked
               # here, not the numerics, so a non-finite step is skipped rather than fatal.
               EXTRA_SET="on_nonfinite=skip")
    env.pop("BIGBATCH_FAULT", None)
    env.update(settings)
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=600)


def test_gpu_script_dry_run_records_every_part(tmp_path):
    """Synthetic ResNet-50 at two batches, the plain-loop peer, ResNet-50 from generated JPEGs
    and the short Fashion-MNIST run (its warm-up scaled to its length); the record goes to the
    scratch folder, not docs/results."""
    before = (SCRIPT.parents[1] / "docs/results/train_throughput.jsonl").read_bytes()
    archive = tmp_path.parent / f"{tmp_path.name}-archive.tar.gz"
    run = dry_run(tmp_path, FMNIST_SEEDS="0 1", ARCHIVE=str(archive))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:] + run_logs(tmp_path)
    recipe = load_recipe("fashion-mnist")
    warmup = round(recipe["schedule"]["warmup_epochs"] / recipe["epochs"], 4)
    assert f"1 epochs ({warmup} warm-up)" in run.stdout
    record = json.loads((tmp_path / "dry-run.jsonl").read_text().splitlines()[-1])
    assert record["gpu"] == "none (CPU dry run)" and record["gpus"] == 2
    runs = {r["run"]: r for r in record["runs"]}
    assert set(runs) == {"resnet50 bf16 channels_last", "fashion-mnist default recipe",
                         "fashion-mnist default recipe seed 1",
                         "peer plain loop bf16 channels_last",
                         "resnet50 bf16 channels_last jpeg folder",
                         "resnet50 bf16 channels_last jpeg folder device decode",
                         "resnet50 bf16 channels_last batch 2",
                         "resnet50 bf16 channels_last batch 4"}
    assert all(0 < runs[name]["optimizer_share"] < 1 for name in runs if "peer" not in name)
    assert all(runs[name]["data_ms"] > 0 for name in runs if "peer" not in name)
    assert runs["resnet50 bf16 channels_last"]["steps"] == 2  # STEPS timed, WARMUP dropped
    assert all(r["images_per_second"] > 0 for r in runs.values())
    fashion = json.loads((tmp_path / "fashion-mnist" / "summary.json").read_text())
    assert fashion["world_size"] == 2 and fashion["steps"] == 2
    seeds = [json.loads((tmp_path / name / "summary.json").read_text())["seed"]
             for name in ("fashion-mnist", "fashion-mnist-seed-1")]
    assert seeds == [0, 1]
    decode_check = json.loads((tmp_path / "device_decode.jsonl").read_text())
    assert decode_check["broken"]["same"] and len(decode_check["broken"]["device_skipped"]) == 2
    assert decode_check["pixels"]["max_abs"] == 0  # the CPU as the device: the workers' crops
    triton_check = json.loads((tmp_path / "triton_step.jsonl").read_text())
    assert triton_check["failed"] == 0 and len(triton_check["cases"]) == 15
    assert (SCRIPT.parents[1] / "docs/results/train_throughput.jsonl").read_bytes() == before
    with tarfile.open(archive) as tar:  # the logs and records, no weights (final.pt) nor JPEGs
        names = tar.getnames()
    assert "./fashion-mnist/metrics.jsonl" in names and "./device_decode.jsonl" in names
    assert not [name for name in names if name.endswith(".pt") or "/jpegs/" in name]
    assert archive.stat().st_size < 2_000_000


def test_a_failing_part_is_recorded_and_the_others_still_run(tmp_path):
    run = dry_run(tmp_path, PEER="0", JPEGS="0", SMALL_BATCH="0", LARGE_BATCH="0",
                  FMNIST_SET="model.options.width=0")
    assert run.returncode == 2
    assert "1 part(s) failed: fashion-mnist default recipe" in run.stderr
    record = json.loads((tmp_path / "dry-run.jsonl").read_text().splitlines()[-1])
    runs = {r["run"]: r for r in record["runs"]}
    assert runs["resnet50 bf16 channels_last"]["images_per_second"] > 0
    assert "width" in runs["fashion-mnist default recipe"]["error"]


def test_the_time_limit_stops_a_part_skips_the_rest_and_the_archive_brings_all_back(tmp_path):
    """A run that hangs is stopped when TIME_LIMIT_S is reached and recorded as skipped, the parts
    after it are not started (recorded so), the record is still written and the exit is 0; the
    archive holds the logs and the scratch record, and no checkpoint."""
    out, archive = tmp_path / "out", tmp_path / "gpu-run.tar.gz"
    run = dry_run(out, TIME_LIMIT_S="45", RESERVE_S="0", ARCHIVE=str(archive), PEER="0",
                  SMALL_BATCH="0", LARGE_BATCH="0", BIGBATCH_FAULT="hang:step=1")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    record = json.loads((out / "dry-run.jsonl").read_text().splitlines()[-1])
    skipped = {r["run"]: r["skipped"] for r in record["runs"]}
    assert skipped["resnet50 bf16 channels_last"].startswith("stopped by its time limit")
    assert skipped["fashion-mnist default recipe"].startswith("not started: TIME_LIMIT_S=45")
    assert "jpeg folder" in skipped and "triton step check" not in skipped  # after the record
    assert "part(s) skipped at their time limit" in run.stderr
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert "./dry-run.jsonl" in names and "./resnet50.log" in names
    assert "./records/train_throughput.jsonl" in names
    assert not [name for name in names if "checkpoint-" in name]
    left = subprocess.run(["pgrep", "-f", f"out={out}/"], capture_output=True, text=True)
    assert not left.stdout, f"processes of the stopped run left running: {left.stdout}"


def test_a_time_limit_that_is_not_whole_seconds_is_refused(tmp_path):
    run = dry_run(tmp_path, TIME_LIMIT_S="10m")
    assert run.returncode == 1
    assert "TIME_LIMIT_S must be whole seconds, got '10m'" in run.stderr


def run_logs(folder: Path) -> str:
    """Each run's own log (the script shows only its last lines; a torchrun failure's cause is
    often above them, in the rank that failed first)."""
    return "".join(f"\n--- {log.name} ---\n{log.read_text(errors='replace')[-6000:]}"
                   for log in sorted(folder.glob("*.log")))
