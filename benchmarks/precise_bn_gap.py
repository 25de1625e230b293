"""Top-1 as trained and with recomputed BatchNorm statistics (eval.bn_recompute), short runs.

    python benchmarks/precise_bn_gap.py                   # seed 0, runs into runs/precise_bn_gap/
    python benchmarks/precise_bn_gap.py --seeds 0,1 --count 20

Each seed is `bigbatch train` with the default recipe (its model, LARS at LR 20, batch 4096,
micro-batch 512, warmup 3 epochs) on the first 16384 Fashion-MNIST training examples for 4 epochs
(16 steps), with ``eval.bn_recompute=COUNT``. One run gives both numbers: every evaluation
record holds the top-1 with the running statistics (``trained_top1``, bit-identical to a run
without the option, tests/test_precise_bn.py) and with the recomputed ones (``top1``). A seed
whose summary.json exists is not run again. Writes docs/results/precise_bn/gap.json (with each
run's resolved config).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from common import REPO, RESULTS_DIR, machine_info

SUBSET, EPOCHS = 16384, 4


def command(seed: int, count: int, out: Path) -> list[str]:
    return [sys.executable, "-m", "bigbatch", "train", "--train-subset", str(SUBSET),
            "--epochs", str(EPOCHS), "--seed", str(seed), "--set", f"eval.bn_recompute={count}",
            "--out", str(out)]


def evaluations(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{key: record[key] for key in ("step", "epoch", "trained_top1", "top1",
                                          "trained_loss", "loss")}
            for record in records if record["kind"] == "eval"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--count", type=int, default=20, help="eval.bn_recompute")
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "precise_bn_gap")
    args = parser.parse_args()
    seeds = [int(seed) for seed in args.seeds.split(",")]
    record = {"command": f"python benchmarks/precise_bn_gap.py --seeds {args.seeds} "
                         f"--count {args.count}",
              "train_command": " ".join(command(0, args.count, Path("OUT"))[1:]),
              "machine": machine_info(), "runs": {}}
    for seed in seeds:
        out = args.runs / f"seed{seed}"
        if not (out / "summary.json").exists():
            subprocess.run(command(seed, args.count, out), check=True,
                           env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
        summary = json.loads((out / "summary.json").read_text())
        record["runs"][f"seed{seed}"] = {
            "top1_as_trained": summary["trained_top1"], "top1_recomputed": summary["top1"],
            "steps": summary["steps"], "wall_seconds": summary["wall_seconds"],
            "evaluations": evaluations(out),
            "config": yaml.safe_load((out / "config.yaml").read_text())}
    folder = RESULTS_DIR / "precise_bn"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gap.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({name: {k: v for k, v in run.items() if k != "evaluations"}
                      for name, run in record["runs"].items()}, indent=2))


if __name__ == "__main__":
    main()
