"""The median and range over several runs of benchmarks/gpu.sh on one kind of GPU.

    python benchmarks/gpu_summary.py "NVIDIA H200"

Reads the ``"suite": "gpu"`` records of docs/results/train_throughput.jsonl made on that GPU (one
GPU per run, CPU dry runs never land there) and writes, per run name (ResNet-50 eager, compiled,
the default recipe), the median, range and per-record images/s; the compiled over eager ratio,
record by record; and each median over the published one-GPU anchors the records carry. The
result goes to docs/results/gpu/summary.json, one entry per GPU name, replaced when rerun.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common import RESULTS_DIR, spread

EAGER, COMPILED = "resnet50 bf16 channels_last", "resnet50 bf16 channels_last compile"
PEER = "peer plain loop bf16 channels_last"
PEER_COMPILED = "peer plain loop bf16 channels_last compile"
JPEG = "resnet50 bf16 channels_last jpeg folder"
JPEG_DEVICE = "resnet50 bf16 channels_last jpeg folder device decode"
# Record by record: the engine against the plain loop beside it, JPEGs (decoded by the loader
# workers or by the device) against synthetic data.
RATIOS = {"compiled_over_eager": (COMPILED, EAGER), "engine_over_peer": (EAGER, PEER),
          "engine_compiled_over_peer_compiled": (COMPILED, PEER_COMPILED),
          "jpeg_folder_over_synthetic": (JPEG, EAGER),
          "jpeg_folder_device_decode_over_synthetic": (JPEG_DEVICE, EAGER)}


def summarize(records: list[dict]) -> dict:
    """Images/s and top-1 per run name (and how often it failed), the RATIOS per record,
    medians over the anchors."""
    by_name: dict[str, list[dict]] = {}
    failed: dict[str, int] = {}
    for record in records:
        for run in record["runs"]:
            if "error" in run:
                failed[run["run"]] = failed.get(run["run"], 0) + 1
            else:
                by_name.setdefault(run["run"], []).append(run)
    runs = {name: {"images_per_second": spread([r["images_per_second"] for r in found]),
                   "top1": top1_spread(found)}
            for name, found in sorted(by_name.items())}
    ratios = {key: record_ratios(records, *names) for key, names in RATIOS.items()}
    anchors = records[-1]["anchors_images_per_second_one_gpu"]
    over_anchors = {name: {anchor: round(stats["images_per_second"]["median"] / value, 3)
                           for anchor, value in anchors.items()}
                    for name, stats in runs.items() if name in (EAGER, COMPILED)}
    return {"runs": runs, **ratios, "failed": failed, "median_over_anchor": over_anchors,
            "anchors_images_per_second_one_gpu": anchors}


def top1_spread(runs: list[dict]) -> dict | None:
    """The spread of the runs' top-1 where they have one (the throughput-only peer has none)."""
    values = [r["top1"] for r in runs if r.get("top1") is not None]
    return spread(values) if values else None


def record_ratios(records: list[dict], over: str, under: str) -> dict | None:
    """The spread of ``over`` / ``under`` images/s over the records that have both."""
    pairs = [(_rate(r, over), _rate(r, under)) for r in records]
    ratios = [round(a / b, 3) for a, b in pairs if a and b]
    return spread(ratios) if ratios else None


def _rate(record: dict, name: str) -> float | None:
    return next((r.get("images_per_second") for r in record["runs"] if r["run"] == name), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("gpu", help="the GPU's name as the records give it, e.g. 'NVIDIA H200'")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    lines = (args.results / "train_throughput.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, filter(str.strip, lines))
               if r.get("suite") == "gpu" and r.get("gpu") == args.gpu and r.get("gpus") == 1]
    if not records:
        sys.exit(f"gpu_summary: no one-GPU record of '{args.gpu}' in train_throughput.jsonl")
    entry = {"gpu": args.gpu, "records": len(records),
             "dates": [r["date"] for r in records], "commits": [r["commit"] for r in records],
             "torch": sorted({r["torch"] for r in records}), **summarize(records)}
    path = args.results / "gpu" / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = json.loads(path.read_text()) if path.is_file() else []
    entries = [e for e in entries if e["gpu"] != args.gpu] + [entry]
    path.write_text(json.dumps(entries, indent=1) + "\n")
    for name, stats in entry["runs"].items():
        rate = stats["images_per_second"]
        print(f"{name:38s} {rate['median']:>10,.0f} images/s (range {rate['min']:,.0f}-"
              f"{rate['max']:,.0f}) over {len(rate['runs'])} runs")
    print(json.dumps({"compiled_over_eager": entry["compiled_over_eager"],
                      "median_over_anchor": entry["median_over_anchor"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
