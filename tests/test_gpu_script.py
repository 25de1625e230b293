"""benchmarks/gpu.sh end to end in its CPU dry-run mode, so it cannot rot before a GPU runs it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bigbatch.config import load_recipe

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu.sh"

pytestmark = [pytest.mark.slow, pytest.mark.fashion_mnist]


def test_gpu_script_dry_run_records_both_runs(tmp_path):
    """Tiny sizes, two processes (the torchrun path), the short Fashion-MNIST run's warm-up
    scaled to its length; the record goes to the scratch folder, not docs/results."""
    env = dict(os.environ, CPU_DRY_RUN="1", PYTHON=sys.executable, BATCH="2", STEPS="2",
               WARMUP="1", NPROC="2", IMAGE_SIZE="32", WORKERS="0", FMNIST_EPOCHS="1",
               FMNIST_SET="data.train_subset=512 data.val_subset=500 global_batch=256 "
                          "micro_batch=128 model.options.width=8 data.workers=0",
               OUT=str(tmp_path), OMP_NUM_THREADS="1")
    env.pop("BIGBATCH_FAULT", None)
    before = (SCRIPT.parents[1] / "docs/results/train_throughput.jsonl").read_bytes()
    run = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:] + run_logs(tmp_path)
    recipe = load_recipe("fashion-mnist")
    warmup = round(recipe["schedule"]["warmup_epochs"] / recipe["epochs"], 4)
    assert f"1 epochs ({warmup} warm-up)" in run.stdout
    record = json.loads((tmp_path / "dry-run.jsonl").read_text().splitlines()[-1])
    assert record["gpu"] == "none (CPU dry run)" and record["gpus"] == 2
    runs = {r["run"]: r for r in record["runs"]}
    assert set(runs) == {"resnet50 bf16 channels_last", "fashion-mnist default recipe"}
    assert runs["resnet50 bf16 channels_last"]["steps"] == 2  # STEPS timed, WARMUP dropped
    assert all(r["images_per_second"] > 0 for r in runs.values())
    fashion = json.loads((tmp_path / "fashion-mnist" / "summary.json").read_text())
    assert fashion["world_size"] == 2 and fashion["steps"] == 2
    assert (SCRIPT.parents[1] / "docs/results/train_throughput.jsonl").read_bytes() == before


def run_logs(folder: Path) -> str:
    """Each run's own log (the script shows only its last lines; a torchrun failure's cause is
    often above them, in the rank that failed first)."""
    return "".join(f"\n--- {log.name} ---\n{log.read_text(errors='replace')[-6000:]}"
                   for log in sorted(folder.glob("*.log")))
