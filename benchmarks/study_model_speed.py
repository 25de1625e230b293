"""Training speed of the 20-epoch batch-scaling study's candidate models, one thread, fp32.

    python benchmarks/study_model_speed.py [--rounds 3] [--examples 10240]
        [--candidates small_resnet:8,small_resnet:12,small_cnn:8]

Each candidate trains (`bigbatch train`, one process per run) on the first ``--examples``
Fashion-MNIST images for one epoch, with the study's settings: global batch 1024 in
micro-batches of 128 (the study's BatchNorm batch; the work per image does not depend on the
global batch), SGD, fp32, one intra-op thread, no loader processes. The figure is the run's own
``images_per_second`` (training steps only; start-up and evaluation excluded). Candidates are
interleaved, order rotated each round, so that a noisy shared machine slows them alike; the
median and range over the rounds are reported, and the record is appended to
docs/results/batch_scaling_20ep/model_speed.jsonl with the machine's description.

A candidate is ``model:width`` or ``model:width:cl`` (channels_last memory format).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS_DIR, append_result, interleaved_rounds, machine_info, median  # noqa: E402

RESULTS = RESULTS_DIR / "batch_scaling_20ep"


def candidate_overrides(candidate: str, examples: int, out: Path) -> list[str]:
    model, width, *flags = candidate.split(":")
    return [
        f"model.name={model}", f"model.options={{width: {int(width)}}}",
        f"channels_last={'cl' in flags}", "precision=fp32", "threads=1", "data.workers=0",
        f"data.train_subset={examples}", "global_batch=1024", "micro_batch=128", "epochs=1",
        "eval_every=1000", "optim.name=sgd", "optim.lr=0.1", "optim.lr_scaling=none",
        "schedule.warmup_epochs=0", "checkpoint.keep=1", f"out={out}",
    ]


def train_once(candidate: str, examples: int) -> float:
    """One training in its own process (`bigbatch train`): its images/s, NaN if it failed."""
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "bigbatch", "train", "--recipe", "fashion-mnist"]
        for assignment in candidate_overrides(candidate, examples, Path(folder)):
            command += ["--set", assignment]
        done = subprocess.run(command, capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        summary = Path(folder) / "summary.json"
        if done.returncode != 0 or not summary.is_file():
            print(f"{candidate}: exit code {done.returncode}: {done.stderr[-300:]}")
            return math.nan
        return float(json.loads(summary.read_text())["images_per_second"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--examples", type=int, default=10240)
    parser.add_argument("--candidates",
                        default="small_resnet:8,small_resnet:8:cl,small_resnet:12,small_cnn:8")
    args = parser.parse_args()
    candidates = [c.strip() for c in args.candidates.split(",") if c.strip()]
    machine = machine_info()
    speeds = interleaved_rounds(
        {c: (lambda c=c: train_once(c, args.examples)) for c in candidates}, args.rounds)
    record = {
        "benchmark": "study_model_speed", "machine": machine,
        "load_average_end": machine_info()["load_average"],
        "settings": {"examples": args.examples, "global_batch": 1024, "micro_batch": 128,
                     "threads": 1, "precision": "fp32", "optimizer": "sgd"},
        "images_per_second": {
            c: {"median": round(median(v), 1), "min": round(min(v), 1), "max": round(max(v), 1),
                "rounds": [round(x, 1) for x in v]}
            for c, v in speeds.items()
        },
    }
    print(json.dumps(record["images_per_second"], indent=2))
    print(f"appended to {append_result('model_speed', record, RESULTS)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
