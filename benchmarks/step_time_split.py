"""Per-step time split (data, compute, exposed communication, optimizer) for 1, 2 and 4 gloo
processes, for the default recipe's model on Fashion-MNIST and for ResNet-18 on synthetic data.

Each configuration is a real `torchrun` training run; the split comes from the `time_*` fields
bigbatch writes to metrics.jsonl for every global step (rank 0's view), as medians over the steps
after the first two (warm-up). Exposed communication is the time backward() waits for gradient
all-reduces after the last bucket was handed to the network.

    python benchmarks/step_time_split.py    # JSON out; appends docs/results/step_time_split.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import load_average, machine_info, median, report

WORKLOADS = {
    "fashion-mnist default recipe (B=2048, b=256)": [
        "--train-subset", "16384", "--batch-size", "2048", "--micro-batch", "256",
        "--epochs", "1", "--warmup-epochs", "0",
    ],
    "resnet18 synthetic 64px (B=64, b=16)": [
        "--dataset", "synthetic", "--model", "resnet18", "--set", "data.image_size=64",
        "--set", "data.synthetic_classes=100", "--train-subset", "512", "--batch-size", "64",
        "--micro-batch", "16", "--epochs", "1", "--warmup-epochs", "0",
    ],
}
FIELDS = ("time_data", "time_compute", "time_comm_exposed", "time_optimizer")


def run_split(args: list[str], processes: int, out: Path) -> dict[str, float]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={processes}", "-m", "bigbatch", "train", *args,
               "--set", "eval_every=1000", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, 2 // processes))}
    subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r.get("kind") == "train"][2:]
    split = {field: median(r[field] for r in steps) for field in FIELDS}
    split["step_seconds"] = sum(split.values())
    split["steps_measured"] = len(steps)
    return split


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", default="1,2,4")
    parser.add_argument("--no-save", action="store_true")
    options = parser.parse_args()
    counts = [int(p) for p in options.processes.split(",")]
    results = []
    load_before = load_average()
    with tempfile.TemporaryDirectory() as scratch:
        for name, args in WORKLOADS.items():
            for processes in counts:
                split = run_split(args, processes, Path(scratch) / f"{len(results)}")
                results.append({"workload": name, "processes": processes, **split})
    record = {"benchmark": "step_time_split", "results": results, "load_before": load_before,
              "load_after": load_average(), "machine": machine_info()}
    report("step_time_split", record, save=not options.no_save, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
