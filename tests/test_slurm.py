"""bigbatch under a real SLURM (one node, started by tests/slurm_cluster.py as root).

- ``srun -n 2 bigbatch train`` (no torchrun) ends with the weights of one process.
- examples/slurm.sbatch, unchanged but for its sizes and options given to sbatch: SLURM's own
  time-limit warning (``--time 3 --signal USR1@60``) stops the run with a checkpoint and exit 75,
  the script requeues the job, and the requeued job resumes and finishes with the weights of an
  uninterrupted run.
- The same job ended mid-run, by ``scancel --signal=KILL`` or by SIGKILL to its tasks, and
  submitted again resumes from its last checkpoint and finishes with the same weights.

Skipped with the reason where the cluster cannot be started (not root, no apt-get); failed
instead when BIGBATCH_REQUIRE_SLURM=1. SLURM holds a requeued job for about two minutes before
it may start again, so the preemption test takes about 6 minutes.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import time
from pathlib import Path

import pytest
import slurm_cluster
from launch import TINY, final_state, max_relative_difference, run_bigbatch, summary

from bigbatch import checkpoint

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.fashion_mnist]

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "slurm.sbatch"

# The preemption job: --time=3 --signal=USR1@60. SLURM sends the warning early (its manual: up
# to 60 s; with SLURM 22.05 here, 23-30 s early), so with 30 s it comes 90-120 s into the job. A
# job whose processes take S seconds to start and T to train is warned while training when
# S + T > 120, and the requeued job (warned at 90 s at the earliest) finishes before its own
# warning when S + (T - (90 - S)) < 90, that is 2S + T < 180. With --time=2 the conditions read
# S + T > 60 and 2S + T < 60, which no run meets: one requeue finished it only when the warnings
# came late (here, with S = 30 s on a shared machine, the requeued job was warned again after one
# step). The run is sized on this machine from the srun test's run (its start-up and evaluation
# O >= S, its median step), aiming at T = 150 - 1.25 O, about 15 s inside both bounds; a second
# requeue (if the warning comes earlier still) costs time, not the test.
TIME_LIMIT_MINUTES = 3
STEPS_PER_EPOCH = 16  # 4096 images in global batches of 256
MAX_EPOCHS = 1000  # 16,000 steps: 150 s even at 0.01 s a step
SIZED = [*TINY, "--train-subset", "4096", "--checkpoint-every", "2"]
# Only sizes and srun's layout differ from the script's own #SBATCH lines.
ONE_NODE_TWO_TASKS = ["--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=0",
                      "--cpus-per-task=1"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    try:
        with slurm_cluster.running(tmp_path_factory.mktemp("slurm")) as running:
            yield running
    except slurm_cluster.Unavailable as why:
        if slurm_cluster.required():
            pytest.fail(f"no SLURM cluster (BIGBATCH_REQUIRE_SLURM=1): {why}", pytrace=False)
        pytest.skip(f"no SLURM cluster: {why}")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one") / "run"
    run_bigbatch(["train", *TINY, "--out", str(out)])
    return out


@pytest.fixture(scope="module")
def srun_tiny(cluster, tmp_path_factory) -> tuple[Path, float]:
    """``srun -n 2 bigbatch train`` on TINY: the run folder and the seconds it took."""
    out = tmp_path_factory.mktemp("srun") / "run"
    started = time.monotonic()
    result = srun_train(cluster, [*TINY, "--out", str(out)])
    assert result.returncode == 0, result.stderr[-3000:]
    return out, time.monotonic() - started


@pytest.fixture(scope="module")
def preemptible(srun_tiny) -> list[str]:
    out, elapsed = srun_tiny
    overhead = elapsed - summary(out)["wall_seconds"]
    per_step = statistics.median(256 / ips for ips in step_rates(out)[1:])
    training = 150 - 1.25 * overhead
    # No small cap: on a quiet machine a step takes 0.06 s, and 40 epochs (640 steps) ended
    # before the warning came.
    epochs = min(max(round(training / per_step / STEPS_PER_EPOCH), 2), MAX_EPOCHS)
    print(f"sized: {per_step:.2f} s a step, {overhead:.0f} s start-up and evaluation "
          f"-> {epochs} epochs ({epochs * STEPS_PER_EPOCH} steps, about {training:.0f} s)")
    return [*SIZED, "--epochs", str(epochs)]


def step_rates(run: Path) -> list[float]:
    records = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    return [r["images_per_second"] for r in records if r.get("kind") == "train"]


@pytest.fixture(scope="module")
def uninterrupted(cluster, preemptible, tmp_path_factory) -> Path:
    """The jobs' run from start to end in one srun (their reference)."""
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    started = time.monotonic()
    result = srun_train(cluster, [*preemptible, "--recipe", "fashion-mnist", "--out", str(out)])
    assert result.returncode == 0, result.stderr[-3000:]
    print(f"uninterrupted run: {time.monotonic() - started:.0f} s")
    return out


def srun_train(cluster, args: list[str], tasks: int = 2):
    # One thread per process, as in the 1-process reference (run_bigbatch): layouts are compared
    # at the same thread count (srun's tasks would otherwise take PyTorch's default, the cores).
    return cluster.run("srun", "-n", str(tasks), "--kill-on-bad-exit=1", "bigbatch", "train",
                       *args, timeout=600, env={"OMP_NUM_THREADS": "1"})


def submit_example(cluster, args: list[str], out: Path, *options: str) -> int:
    """sbatch examples/slurm.sbatch on one node with two tasks, training ``args`` into ``out``."""
    env = {"BIGBATCH_RECIPE": "fashion-mnist", "BIGBATCH_OUT": str(out),
           "BIGBATCH_ARGS": " ".join(args)}
    log = out.parent / "job.out"
    return cluster.submit(SCRIPT, *ONE_NODE_TWO_TASKS, "--job-name=bigbatch-test",
                          f"--output={log}", *options, env=env)


def test_srun_two_tasks_equal_one_process(cluster, srun_tiny, one_process):
    out, elapsed = srun_tiny
    assert summary(out)["world_size"] == 2
    difference = max_relative_difference(final_state(out), final_state(one_process))
    print(f"{cluster.version()}: srun -n 2 took {elapsed:.0f} s, "
          f"max relative difference to 1 process {difference:.2e}")
    assert difference < 1e-5


def test_preempted_by_slurm_requeued_and_resumed(cluster, preemptible, uninterrupted, tmp_path):
    out = tmp_path / "run"
    started = time.monotonic()
    job = submit_example(cluster, preemptible, out, f"--time={TIME_LIMIT_MINUTES}",
                         "--signal=USR1@60")
    info = cluster.wait(job, timeout=1200)  # one requeue takes 4-6 minutes
    log = (tmp_path / "job.out").read_text()
    print(f"job {job}: {info['JobState']} after {time.monotonic() - started:.0f} s, "
          f"Restarts={info['Restarts']}\n{log}")
    assert info["JobState"] == "COMPLETED", log + cluster.log_tail()
    assert int(info["Restarts"]) >= 1, "the job was never requeued"
    assert "stopped by SIGUSR1 after step" in log  # SLURM's warning, not the time-limit kill
    assert "srun exited with 75" in log and "srun exited with 0" in log
    assert "DUE TO TIME LIMIT" not in log
    assert summary(out)["steps"] == summary(uninterrupted)["steps"]
    assert max_relative_difference(final_state(out), final_state(uninterrupted)) < 1e-5


def test_scancel_kill_then_submitted_again_resumes(cluster, preemptible, uninterrupted, tmp_path):
    # `scancel --signal=KILL JOB`: SLURM 22.05 ends the job's steps with its terminate sequence
    # (SIGCONT, SIGTERM, SIGKILL after KillWait), so bigbatch checkpoints on the SIGTERM.
    out = tmp_path / "run"
    job = submit_example(cluster, preemptible, out, "--time=10")
    wait_for_step(out / "metrics.jsonl", step=7, timeout=300)
    killed = cluster.run("scancel", "--signal=KILL", str(job))
    assert killed.returncode == 0, killed.stderr
    info = cluster.wait(job, timeout=120)
    assert info["JobState"] != "COMPLETED" and info["Restarts"] == "0"
    resume_and_compare(cluster, preemptible, uninterrupted, out, job)


def test_tasks_killed_outright_then_submitted_again_resumes(cluster, preemptible, uninterrupted,
                                                            tmp_path):
    # SIGKILL to every task at once, as an out-of-memory kill or a crash would: no checkpoint is
    # written at the kill, srun's status is not 75, the job fails and is not requeued.
    out = tmp_path / "run"
    job = submit_example(cluster, preemptible, out, "--time=10")
    wait_for_step(out / "metrics.jsonl", step=7, timeout=300)
    tasks = task_pids(cluster, job)
    assert len(tasks) == 2, tasks
    for pid in tasks:
        os.kill(pid, signal.SIGKILL)
    info = cluster.wait(job, timeout=120)
    assert info["JobState"] == "FAILED" and info["Restarts"] == "0", info
    log = resume_and_compare(cluster, preemptible, uninterrupted, out, job)
    assert "stopped by" not in log


def resume_and_compare(cluster, args: list[str], reference: Path, out: Path, job: int) -> str:
    """Submit the job again; it must resume from the last checkpoint and end equal."""
    assert not (out / "final.pt").exists()
    saved = checkpoint.list_checkpoints(out / "checkpoints")
    assert saved, "no checkpoint before the kill"
    again = submit_example(cluster, args, out, "--time=10")
    info = cluster.wait(again, timeout=600)
    log = (out.parent / "job.out").read_text()
    print(f"job {job}, submitted again as {again}: {info['JobState']}\n{log}")
    assert info["JobState"] == "COMPLETED", log + cluster.log_tail()
    assert f"resumed from {saved[-1]}" in log
    assert max_relative_difference(final_state(out), final_state(reference)) < 1e-5
    return log


def task_pids(cluster, job: int) -> list[int]:
    """The processes of the job's first srun step that are its tasks (scontrol listpids)."""
    rows = [line.split() for line in cluster.run("scontrol", "listpids", str(job)).stdout
            .splitlines()[1:]]
    return [int(row[0]) for row in rows if len(row) >= 4 and row[2] == "0" and row[3] != "-"]


def wait_for_step(metrics: Path, step: int, timeout: float) -> None:
    """Wait until the run has logged ``step`` (checkpoints come every 2 steps)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        if any(f'"step": {step},' in line for line in lines):
            return
        time.sleep(0.5)
    raise AssertionError(f"the run did not reach step {step} in {timeout} s")
