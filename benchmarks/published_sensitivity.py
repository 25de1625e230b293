"""How the planner's predictions of the published runs move with its assumptions.

    python benchmarks/published_sensitivity.py

Recomputes `bigbatch plan --published` with one input of the data file changed at a time (the
fitted constant refitted each time on its one run) and writes every run's ratio (predicted /
published) and the speed-up check per variant to docs/results/published_runs_sensitivity.json.
No timing: the numbers depend on the code and the data file only.
"""

from __future__ import annotations

import json

from common import RESULTS_DIR

from bigbatch.tools.plan.published import published_predictions

OUT = RESULTS_DIR / "published_runs_sensitivity.json"
VARIANTS = {
    "as published.json": {},
    "kernel floor 0 (no per-kernel cost)": {"kernel_floor_s": 0.0},
    "kernel floor 1.7 us (half)": {"kernel_floor_s": 1.7e-6},
    "kernel floor 6.8 us (double)": {"kernel_floor_s": 6.8e-6},
    "MLPerf overlap 0.5 (as the records)": {"mlperf_overlap": 0.5},
    "MLPerf gradients in fp32": {"mlperf_gradient_bytes": 4},
    "optimizer 40 bytes a parameter": {"optimizer_bytes_per_parameter": 40},
}


def main() -> None:
    variants = {}
    for name, changes in VARIANTS.items():
        result = published_predictions(changes)
        variants[name] = {
            "changes": changes,
            "mlperf_stack_speedup": round(result["calibration"]["value"], 4),
            "speedup_ratio": round(result["speedup"]["ratio"], 4),
            "ratios": {row["id"]: round(row["ratio"], 4) for row in result["rows"]},
            "out_of_band": [row["id"] for row in result["rows"] if not row["in_band"]],
        }
    OUT.write_text(json.dumps(variants, indent=1) + "\n")
    print(json.dumps(variants, indent=1))


if __name__ == "__main__":
    main()
