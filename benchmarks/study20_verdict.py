"""The 20-epoch batch-scaling study against the paper's three expectations.

    python benchmarks/study20_verdict.py [docs/results/batch_scaling_20ep/sweep.json]

You et al., "ImageNet Training in Minutes" (ICPP 2018), with LARS (You, Gitman & Ginsburg 2017),
lead one to expect, of every LARS series against SGD with linear scaling and warmup (Goyal et
al. 2017) at the same batch and epoch budget:

1. LARS ≥ SGD at every batch ≥ 2048;
2. LARS ≥ SGD + 3 points at every batch ≥ 8192;
3. LARS within 1 point of the small-batch baseline (SGD at the smallest batch) at every batch up
   to the one whose steps per epoch are nearest ImageNet's at 32K (1,281,167 / 32,768 = 39),
   the smallest batch included.

Each is judged on the number the study selects its LRs on (top-1 with recomputed BatchNorm
statistics) and reported for the as-trained number too. Where a point was rerun with several
seeds, the mean of the seeds that did not diverge is used, and their spread is shown beside the
difference; a point where nothing learned counts as 0. An expectation that applies to no point
of the grid is "not tested". Writes
verdict.md and verdict.json beside the sweep record and prints the Markdown.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from common import RESULTS_DIR

IMAGENET_TRAIN = 1_281_167
IMAGENET_32K_STEPS_PER_EPOCH = IMAGENET_TRAIN / 32768
AT_LEAST_SGD_FROM, AHEAD_FROM, AHEAD_BY, BASELINE_WITHIN = 2048, 8192, 3.0, 1.0
DEFAULT = RESULTS_DIR / "batch_scaling_20ep" / "sweep.json"


def point_value(point: dict, key: str) -> tuple[float | None, float | None, int]:
    """(value, sample std or None, number of seeds) of one (batch, series) point; ``key`` is
    ``top1`` (the selection number) or ``trained_top1``."""
    seeds = point.get("seeds")
    values = [v for v in (seeds or {}).get(key, {}).values() if v is not None]  # None: diverged
    if len(values) > 1:
        return statistics.fmean(values), statistics.stdev(values), len(values)
    return point.get(f"best_{key}"), None, 1


def matching_batch(batches: list[int], train_examples: int) -> int:
    """The batch whose steps per epoch are nearest (in ratio) ImageNet's at 32K."""
    return min(batches, key=lambda b: abs(math.log((train_examples // b)
                                                   / IMAGENET_32K_STEPS_PER_EPOCH)))


def judge(record: dict, key: str, train_examples: int) -> dict:
    """Every expectation for every LARS series, point by point, on number ``key``."""
    points = {(p["batch"], p["optimizer"]): p for p in record["best"]}
    batches = sorted(record["settings"]["batch_sizes"])
    series = [s for s in record["settings"]["optimizers"] if s.startswith("lars")]
    baseline = point_value(points[(batches[0], "sgd")], key)[0] or 0.0  # None: nothing learned
    match = matching_batch(batches, train_examples)
    checks = []
    for name in series:
        for batch in batches:
            lars, lars_std, lars_n = point_value(points[(batch, name)], key)
            sgd, sgd_std, sgd_n = point_value(points[(batch, "sgd")], key)
            row = {"series": name, "batch": batch, "lars": lars, "sgd": sgd,
                   "lars_std": lars_std, "sgd_std": sgd_std, "seeds": min(lars_n, sgd_n)}
            if lars is None:
                row["lars"] = 0.0  # nothing learned: counts as 0
            if sgd is None:
                row["sgd"] = 0.0
            row["lead"] = row["lars"] - row["sgd"]
            row["vs_baseline"] = row["lars"] - baseline
            row["e1"] = row["lead"] >= 0 if batch >= AT_LEAST_SGD_FROM else None
            row["e2"] = row["lead"] >= AHEAD_BY if batch >= AHEAD_FROM else None
            row["e3"] = row["vs_baseline"] >= -BASELINE_WITHIN if batch <= match else None
            checks.append(row)
    return {"number": key, "baseline": baseline, "baseline_batch": batches[0],
            "matching_batch": match, "checks": checks,
            "holds": {name: {e: holds([c[e] for c in checks if c["series"] == name])
                             for e in ("e1", "e2", "e3")} for name in series}}


def holds(outcomes: list[bool | None]) -> bool | None:
    """Whether an expectation holds at every point it applies to; None where it applies to none."""
    tested = [outcome for outcome in outcomes if outcome is not None]
    return all(tested) if tested else None


def verdict_word(outcome: bool | None) -> str:
    return "not tested" if outcome is None else ("holds" if outcome else "**fails**")


def spread(mean: float, std: float | None) -> str:
    return f"{mean:.2f}" if std is None else f"{mean:.2f} ± {std:.2f}"


def markdown(verdicts: list[dict]) -> str:
    first = verdicts[0]
    lines = [
        "# The paper's three expectations, judged on this study",
        "",
        f"Baseline: SGD at batch {first['baseline_batch']}. The batch whose steps per epoch are "
        f"nearest ImageNet's at 32K ({IMAGENET_32K_STEPS_PER_EPOCH:.0f}): "
        f"{first['matching_batch']}. E1: LARS ≥ SGD at batch ≥ {AT_LEAST_SGD_FROM}; E2: LARS ≥ "
        f"SGD + {AHEAD_BY:g} at batch ≥ {AHEAD_FROM}; E3: LARS ≥ baseline − {BASELINE_WITHIN:g} "
        f"at batch ≤ {first['matching_batch']}. Points rerun with several seeds use the seeds' "
        "mean (± sample std).",
    ]
    for verdict in verdicts:
        lines += ["", f"## On `{verdict['number']}` (baseline {verdict['baseline']:.2f})", "",
                  "| series | batch | LARS | SGD | LARS − SGD | LARS − baseline | E1 | E2 | E3 |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for c in verdict["checks"]:
            marks = ["–" if c[e] is None else verdict_word(c[e]) for e in ("e1", "e2", "e3")]
            lines.append(f"| {c['series']} | {c['batch']} | {spread(c['lars'], c['lars_std'])} | "
                         f"{spread(c['sgd'], c['sgd_std'])} | {c['lead']:+.2f} | "
                         f"{c['vs_baseline']:+.2f} | " + " | ".join(marks) + " |")
        lines += ["", "| series | E1 | E2 | E3 |", "|---|---|---|---|"]
        for name, outcome in verdict["holds"].items():
            lines.append(f"| {name} | " + " | ".join(verdict_word(outcome[e])
                                                    for e in ("e1", "e2", "e3")) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("record", nargs="?", type=Path, default=DEFAULT,
                        help="the study's sweep.json")
    parser.add_argument("--train-examples", type=int, default=60000,
                        help="training set size (Fashion-MNIST: 60000)")
    args = parser.parse_args(argv)
    if not args.record.is_file():
        print(f"study20_verdict: {args.record} does not exist (run the study first)",
              file=sys.stderr)
        return 2
    record = json.loads(args.record.read_text())
    verdicts = [judge(record, key, args.train_examples) for key in ("top1", "trained_top1")]
    text = markdown(verdicts)
    (args.record.parent / "verdict.md").write_text(text)
    (args.record.parent / "verdict.json").write_text(json.dumps(verdicts, indent=1) + "\n")
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
