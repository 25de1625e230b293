"""What MLPerf ResNet-50 result logs say: time to train, epochs, evaluations, logged throughput.

    python benchmarks/mlperf_logs.py GIT_DIR RESULT_DIR [RESULT_DIR ...] [--out FILE]

GIT_DIR is a clone (bare or not) of mlcommons/training_results_v3.0 or _v4.0; each RESULT_DIR a
folder in it holding result_*.txt (e.g. NVIDIA/results/dgxh100_ngc23.04_mxnet/resnet). Reads
the :::MLLOG lines of each file at HEAD. Per run: minutes from run_start to run_stop, status,
the last epoch, evaluations and their seconds, global batch, and the median of the
``tracked_stats`` throughput over the epochs after the first (and the first's apart). Per folder:
MLPerf's score, the mean of the runs without the fastest and the slowest (a run that did not
reach the target counting as the slowest), and the scored runs' mean epochs and evaluations.
The planner's published.json takes its MLPerf rows from here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path


def log_events(git_dir: str, path: str) -> list[dict]:
    text = subprocess.run(
        ["git", "--git-dir", git_dir, "show", f"HEAD:{path}"], capture_output=True, text=True
    ).stdout
    events = []
    for line in text.splitlines():
        start = line.find(":::MLLOG ")
        if start >= 0:
            try:
                events.append(json.loads(line[start + len(":::MLLOG "):]))
            except json.JSONDecodeError:
                continue
    return events


def summarise_run(events: list[dict]) -> dict:
    def of(key: str) -> list[dict]:
        return [event for event in events if event["key"] == key]

    if not of("run_start") or not of("run_stop"):
        raise SystemExit("a result file without run_start or run_stop")
    stop = of("run_stop")[0]
    throughput = [event["value"]["throughput"] for event in of("tracked_stats")]
    evals = list(zip(of("eval_start"), of("eval_stop"), strict=False))
    return {
        "minutes": (stop["time_ms"] - of("run_start")[0]["time_ms"]) / 60e3,
        "status": stop["metadata"].get("status"),
        "global_batch": of("global_batch_size")[0]["value"],
        "epochs": max(event["metadata"]["epoch_num"] for event in of("epoch_start")),
        "evaluations": len(evals),
        "evaluation_s": sum(b["time_ms"] - a["time_ms"] for a, b in evals) / 1e3,
        "throughput_median": statistics.median(throughput[1:]) if len(throughput) > 1 else None,
        "throughput_first_epoch": throughput[0] if throughput else None,
    }


def summarise_folder(git_dir: str, folder: str) -> dict:
    listing = subprocess.run(
        ["git", "--git-dir", git_dir, "ls-tree", "--name-only", f"HEAD:{folder}"],
        capture_output=True, text=True,
    ).stdout.split()
    names = sorted(name for name in listing if name.startswith("result_"))
    if not names:
        raise SystemExit(f"no result_*.txt in {folder}")
    runs = {name: summarise_run(log_events(git_dir, f"{folder}/{name}")) for name in names}
    # A run that missed the target counts as the slowest, as MLPerf scores it.
    ordered = sorted(runs.values(), key=lambda run: (run["status"] != "success", run["minutes"]))
    scored = ordered[1:-1] if len(ordered) > 2 else ordered
    return {
        "runs": runs,
        "score_minutes": statistics.mean(run["minutes"] for run in scored),
        "scored_epochs": statistics.mean(run["epochs"] for run in scored),
        "scored_evaluations": statistics.mean(run["evaluations"] for run in scored),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("git_dir")
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--out", type=Path, help="JSON file to write (default: stdout only)")
    args = parser.parse_args()
    if not Path(args.git_dir).exists():
        sys.exit(f"{args.git_dir} does not exist")
    record = {"git_dir": args.git_dir, "folders": {
        folder: summarise_folder(args.git_dir, folder) for folder in args.folders}}
    text = json.dumps(record, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
