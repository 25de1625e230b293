"""The median and range over several runs of benchmarks/lars_step.py, ratio by ratio.

    python benchmarks/lars_step_summary.py 17-22

Reads lines FIRST-LAST (1-based, inclusive) of docs/results/lars_step.jsonl, takes each run's
median of the per-repetition ratios (``median_paired``) of every ratio all of them measured, and
writes their median, range and per-run values, with the lines, commits and loads, to
docs/results/lars_step_summary.json (one entry per line range, replaced when rerun).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common import RESULTS_DIR, spread


def summarize(records: list[dict]) -> dict[str, dict]:
    """Per ratio present in every record: median, min, max and the per-run values."""
    names = set.intersection(*(set(r["ratios"]) for r in records))
    return {name: spread([r["ratios"][name]["median_paired"] for r in records])
            for name in sorted(names)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("lines", help="FIRST-LAST, 1-based line numbers of lars_step.jsonl")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    first, _, last = args.lines.partition("-")
    lines = (args.results / "lars_step.jsonl").read_text().splitlines()
    try:
        first_line, last_line = int(first), int(last or first)
    except ValueError:
        sys.exit(f"lars_step_summary: '{args.lines}' is not FIRST-LAST")
    if not 1 <= first_line <= last_line <= len(lines):
        sys.exit(f"lars_step_summary: lines {args.lines} are not in lars_step.jsonl "
                 f"({len(lines)} lines)")
    records = [json.loads(line) for line in lines[first_line - 1:last_line]]
    devices = {r["machine"].get("device", "cpu") for r in records}
    if len(devices) > 1:
        sys.exit(f"lars_step_summary: lines {args.lines} mix devices: {sorted(devices)}")
    entry = {"lines": args.lines, "runs": len(records),
             "commits": [r["machine"].get("commit") for r in records],
             "loadavg_1min": [r["machine"].get("loadavg_1min") for r in records],
             "ratios": summarize(records)}
    path = args.results / "lars_step_summary.json"
    entries = json.loads(path.read_text()) if path.is_file() else []
    entries = [e for e in entries if e["lines"] != args.lines] + [entry]
    path.write_text(json.dumps(entries, indent=1) + "\n")
    for name, stats in entry["ratios"].items():
        print(f"{name:28s} median {stats['median']:.3f} (range {stats['min']:.3f}-"
              f"{stats['max']:.3f}) over {len(records)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
