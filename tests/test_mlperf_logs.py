"""benchmarks/mlperf_logs.py: MLPerf's score, epochs and evaluations from result logs in a clone."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "mlperf_logs.py"
FOLDER = "NVIDIA/results/box/resnet"


def mllog(time_ms, key, value=None, **metadata):
    event = {"time_ms": time_ms, "key": key, "value": value, "metadata": metadata}
    return ":::MLLOG " + json.dumps(event)


def result_file(minutes, epochs, status="success"):
    """A log: run_start at 0, one epoch_start and tracked_stats per epoch, an eval every 4."""
    lines = [mllog(0, "global_batch_size", 3200), mllog(0, "run_start")]
    for epoch in range(1, epochs + 1):
        lines.append(mllog(epoch, "epoch_start", epoch_num=epoch))
        lines.append(mllog(epoch, "tracked_stats", {"throughput": 100.0 if epoch == 1 else 500.0}))
        if epoch % 4 == 0:
            lines += [mllog(epoch * 10, "eval_start"), mllog(epoch * 10 + 250, "eval_stop")]
    lines.append(mllog(minutes * 60e3, "run_stop", status=status))
    return "noise before the log\n" + "\n".join(lines) + "\n"


def make_clone(tmp_path, results):
    repo = tmp_path / "clone"
    (repo / FOLDER).mkdir(parents=True)
    for name, text in results.items():
        (repo / FOLDER / name).write_text(text)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "logs"], check=True)
    return repo / ".git"


def test_score_drops_the_fastest_and_the_slowest_counting_a_miss_as_slowest(tmp_path):
    results = {
        "result_0.txt": result_file(10.0, 8),
        "result_1.txt": result_file(9.0, 8),
        "result_2.txt": result_file(8.5, 12, status="aborted"),  # fastest, but missed the target
        "result_3.txt": result_file(11.0, 8),
        "result_4.txt": result_file(12.0, 4),
    }
    git_dir = make_clone(tmp_path, results)
    out = tmp_path / "logs.json"
    done = subprocess.run([sys.executable, str(SCRIPT), str(git_dir), FOLDER, "--out", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    folder = json.loads(out.read_text())["folders"][FOLDER]
    # Ordered 9, 10, 11, 12, aborted: the scored runs are 10, 11 and 12 minutes.
    assert folder["score_minutes"] == 11.0
    assert folder["scored_epochs"] == (8 + 8 + 4) / 3
    run = folder["runs"]["result_0.txt"]
    assert run["epochs"] == 8 and run["evaluations"] == 2 and run["evaluation_s"] == 0.5
    assert run["throughput_median"] == 500.0 and run["throughput_first_epoch"] == 100.0
    assert run["global_batch"] == 3200 and run["status"] == "success"


def test_a_folder_without_results_is_a_one_line_error(tmp_path):
    git_dir = make_clone(tmp_path, {"result_0.txt": result_file(1.0, 4)})
    done = subprocess.run([sys.executable, str(SCRIPT), str(git_dir), "NVIDIA/results/none"],
                          capture_output=True, text=True)
    assert done.returncode != 0
    assert done.stderr.strip() == "no result_*.txt in NVIDIA/results/none"
