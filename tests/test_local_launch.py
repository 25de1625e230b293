"""local_processes: `bigbatch train` starting its own data-parallel ranks on one machine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from launch import final_state, process_env, run_bigbatch, summary, train_losses

from bigbatch import local_launch
from bigbatch.config import resolve_config
from bigbatch.errors import ConfigError
from bigbatch.local_launch import local_processes
from bigbatch.train.faults import CRASH_EXIT_CODE

# Synthetic 16x16 images, steps of 64 in micro-batches of 16 (4 per step), sums in fixed point:
# the same bits for any number of ranks.
SMALL = ["--dataset", "synthetic", "--set", "data.synthetic_examples=256",
         "--set", "data.synthetic_classes=10", "--set", "data.image_size=16",
         "--batch-size", "64", "--micro-batch", "16", "--lr", "1", "--model", "small_resnet",
         "--set", "model.options.width=4", "--set", "exact_reduction=true",
         "--set", "eval_every=100"]


@pytest.mark.parametrize(("cores", "expected"), [(1, 1), (2, 2), (3, 2), (5, 4), (64, 8)])
def test_auto_is_the_cores_lowered_to_a_divisor_of_the_micro_batches_per_step(
        monkeypatch, cores, expected):
    monkeypatch.setattr(local_launch, "available_cores", lambda: cores)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = resolve_config(overrides=["local_processes=auto"])  # B 4096 / b 512: 8 per step
    assert local_processes(cfg, environ={}) == expected


def test_a_launcher_or_a_gpu_leaves_one_process(monkeypatch):
    monkeypatch.setattr(local_launch, "available_cores", lambda: 8)
    cfg = resolve_config(overrides=["local_processes=auto"])
    torchrun = {"RANK": "0", "WORLD_SIZE": "1"}
    one_task_slurm_job = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    assert local_processes(cfg, environ=torchrun) == 1
    assert local_processes(cfg, environ=one_task_slurm_job) == 1
    assert local_processes(resolve_config(overrides=["local_processes=4"]),
                           environ=torchrun) == 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert local_processes(cfg, environ={}) == 8
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert local_processes(cfg, environ={}) == 1
    assert local_processes(resolve_config(overrides=["local_processes=2"]), environ={}) == 2


@pytest.mark.parametrize(("value", "message"), [
    ("3", "global batch 4096 is not a multiple of micro-batch 512 x 3 processes"),
    ("two", "'local_processes' must be 'auto' or a positive number, got 'two'"),
    ("0", "'local_processes' must be 'auto' or a positive number, got '0'"),
])
def test_a_count_that_cannot_split_the_batch_is_a_one_line_error(value, message):
    with pytest.raises(ConfigError, match=message):
        resolve_config(overrides=[f"local_processes={value}"])


@pytest.mark.slow
def test_two_local_ranks_give_the_bits_of_one_process(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    run_bigbatch(["train", *SMALL, "--epochs", "2", "--out", str(one),
                  "--set", "local_processes=1"])
    result = run_bigbatch(["train", *SMALL, "--epochs", "2", "--out", str(two),
                           "--set", "local_processes=2"])
    assert "starting 2 training processes on this machine" in result.stderr
    assert summary(two)["world_size"] == 2 and summary(one)["world_size"] == 1
    assert json.loads(result.stdout)["steps"] == 8  # rank 0 prints the summary, once
    ours, theirs = final_state(two), final_state(one)
    assert [name for name in ours if not torch.equal(ours[name], theirs[name])] == []
    assert train_losses(two) == train_losses(one)


def processes_writing_to(run_dir: Path) -> list[int]:
    """The processes whose command line names ``run_dir`` (the command and its ranks)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(run_dir) in (entry / "cmdline").read_text():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def wait_for_train_records(run_dir: Path, count: int, command: subprocess.Popen) -> None:
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and command.poll() is None:
        if metrics.exists() and metrics.read_text().count('"kind": "train"') >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"no {count} steps in {metrics} (exit code {command.poll()})")


@pytest.mark.slow
def test_a_signal_to_the_command_alone_stops_every_rank_with_a_checkpoint(tmp_path):
    out = tmp_path / "run"
    args = ["train", *SMALL, "--epochs", "40", "--out", str(out), "--set", "local_processes=2"]
    log = tmp_path / "stderr.txt"
    with log.open("w") as stderr:  # a file, not a pipe: the ranks' ends are not waited for here
        command = subprocess.Popen([sys.executable, "-m", "bigbatch", *args],
                                   env=process_env(), stdout=subprocess.DEVNULL, stderr=stderr)
    wait_for_train_records(out, 2, command)
    os.kill(command.pid, signal.SIGTERM)  # rank 0 only, as `kill PID` would
    assert command.wait(timeout=120) == 75, log.read_text()
    assert processes_writing_to(out) == []  # the command waited for its rank
    assert "stopped by SIGTERM" in log.read_text()
    assert list((out / "checkpoints").glob("checkpoint-step*.pt"))


@pytest.mark.slow
def test_a_crashed_rank_fails_the_command_with_its_code_and_leaves_no_process_behind(tmp_path):
    out = tmp_path / "run"
    started = time.monotonic()
    result = run_bigbatch(["train", *SMALL, "--epochs", "4", "--out", str(out),
                           "--set", "local_processes=2"],
                          env={"BIGBATCH_FAULT": "crash:step=3:rank=1"}, check=False)
    assert result.returncode == CRASH_EXIT_CODE  # rank 1's, not rank 0's error that followed
    assert time.monotonic() - started < 60  # not the process group's 30-minute timeout
    assert processes_writing_to(out) == []


def test_the_flag_sets_the_key():
    from bigbatch.commands import build_parser
    from bigbatch.commands.train import values_from_flags

    args = build_parser().parse_args(["train", "--local-processes", "2"])
    assert resolve_config(values=values_from_flags(args)).local_processes == "2"
    assert resolve_config().local_processes == "auto"  # the default recipe's


@pytest.mark.parametrize(("overrides", "environ", "expected"), [
    # local_processes auto: cores / ranks, in place of an OMP_NUM_THREADS set for one process
    (["local_processes=auto"], {"OMP_NUM_THREADS": "2"}, (1, ["OMP_NUM_THREADS=2 from the "
     "environment replaced by 1 per rank (2 ranks on 2 cores, local_processes: auto)"])),
    (["local_processes=auto"], {}, (1, [])),
    # a count: the environment's OMP_NUM_THREADS holds, and oversubscription is said
    (["local_processes=2"], {"OMP_NUM_THREADS": "2,1"}, (2, ["2 training processes x 2 "
     "intra-op threads on 2 cores oversubscribe them (steps can be several times slower): "
     "set threads=1 or local_processes=auto"])),
    (["local_processes=2"], {"OMP_NUM_THREADS": "junk"}, (1, [])),
    # threads: what each rank runs with, whatever the environment says
    (["local_processes=auto", "threads=3"], {"OMP_NUM_THREADS": "1"}, (3, ["2 training "
     "processes x 3 intra-op threads on 2 cores oversubscribe them (steps can be several times "
     "slower): set threads=1 or local_processes=auto"])),
])
def test_threads_per_rank_fill_the_cores_and_oversubscription_is_said(overrides, environ,
                                                                      expected):
    cfg = resolve_config(overrides=overrides)
    assert local_launch.threads_per_rank(cfg, 2, environ=environ, cores=2) == expected


def test_a_crash_outranks_the_peer_lost_code_of_the_rank_that_saw_it():
    """Rank 0 can notice a crashed peer (and end with EXIT_PEER_LOST) before the crashed
    process has ended: the job's code is still the crash's."""
    from bigbatch.errors import EXIT_PEER_LOST
    from bigbatch.local_launch import finish_local_ranks

    still_ending = subprocess.Popen([sys.executable, "-c",
                                     "import sys, time; time.sleep(0.5); sys.exit(13)"])
    assert finish_local_ranks([still_ending], code=EXIT_PEER_LOST) == 13
    peer_lost_only = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({EXIT_PEER_LOST})"])
    assert finish_local_ranks([peer_lost_only], code=0) == EXIT_PEER_LOST
    preempted = subprocess.Popen([sys.executable, "-c", "raise SystemExit(75)"])
    preempted.wait()  # had ended before rank 0: its code, not rank 0's
    assert finish_local_ranks([preempted], code=1) == 75
