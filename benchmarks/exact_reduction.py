"""What exact_reduction costs: step time of the default recipe on 2 processes, with and without.

    python benchmarks/exact_reduction.py                   # 3 rounds, 6 steps each
    python benchmarks/exact_reduction.py --rounds 5 --processes 2

Each round trains the default recipe (its model, batch 4096 in micro-batches of 512, channels_last,
the precision `auto` picks here) for a few steps on a slice of Fashion-MNIST under torchrun (gloo),
once in each mode, the order alternating between rounds. A run's step time is the median of its
steps after the first (from metrics.jsonl); the ratio exact/default is taken per round. The
all-reduced bytes per step are counted from the model: fp32 gradients (4 bytes a parameter) in the
default mode; int64 gradients (8 bytes) plus the int64 BatchNorm statistics and the step's
votes in the exact one. Appends one record to docs/results/exact_reduction.jsonl.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import REPO, append_result, load_average, machine_info, median, rotated

MODES = {"default": [], "exact": ["--set", "exact_reduction=true"]}


def run_steps(mode: str, processes: int, steps: int, folder: Path) -> list[float]:
    """Seconds per global step of one run (every step after the first)."""
    out = folder / mode
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={processes}", "-m", "bigbatch", "train",
               "--train-subset", str(4096 * steps), "--epochs", "1", "--warmup-epochs", "0.5",
               "--set", "eval_every=100", "--out", str(out), *MODES[mode]]
    env = {"OMP_NUM_THREADS": str(max(1, 2 // processes)), "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(REPO / "src")}
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=3600)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [4096 / r["images_per_second"] for r in records if r["kind"] == "train"][1:]


def allreduce_bytes(exact: bool) -> int:
    """Bytes each rank sends into the step's all-reduces for the default recipe's model."""
    sys.path.insert(0, str(REPO / "src"))
    from bigbatch.config import resolve_config
    from bigbatch.models import create_model

    cfg = resolve_config()
    model = create_model(cfg.model.name, 10, 1, **cfg.model.options)
    parameters = sum(p.numel() for p in model.parameters())
    if not exact:
        return 4 * parameters + 4 * 5  # fp32 gradients, the step's five-value vote
    statistics = sum(b.numel() for name, b in model.named_buffers() if "running" in name)
    tensors = sum(1 for _ in model.parameters())
    return 8 * parameters + 8 * statistics + 8 * (6 + tensors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6, help="global steps per run")
    args = parser.parse_args()
    load_before = load_average()
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as scratch:
        for round_index in range(args.rounds):
            for mode in rotated(list(MODES), round_index):
                folder = Path(scratch) / str(round_index)
                seconds[mode].append(median(run_steps(mode, args.processes, args.steps, folder)))
    ratios = [e / d for e, d in zip(seconds["exact"], seconds["default"], strict=True)]
    record = {
        "benchmark": "exact_reduction",
        "machine": machine_info(),
        "load_before": load_before,
        "load_after": load_average(),
        "processes": args.processes,
        "steps_per_run": args.steps,
        "step_seconds": {mode: [round(s, 3) for s in values] for mode, values in seconds.items()},
        "ratio_exact_over_default": {"median": round(median(ratios), 3),
                                     "min": round(min(ratios), 3), "max": round(max(ratios), 3)},
        "allreduce_bytes_per_step": {"default": allreduce_bytes(False),
                                     "exact": allreduce_bytes(True)},
    }
    path = append_result("exact_reduction", record)
    print(json.dumps(record["ratio_exact_over_default"]), record["allreduce_bytes_per_step"])
    print(f"record appended to {path}")


if __name__ == "__main__":
    main()
