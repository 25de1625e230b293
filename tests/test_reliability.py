"""Faults on real processes: SIGKILL and resume, elastic restart, preemption, NaN, torn writes."""

import json
import signal
import subprocess
import sys
import time

import pytest
import torch
from launch import (
    TINY,
    final_state,
    max_relative_difference,
    process_env,
    run_bigbatch,
    summary,
    train_losses,
)

from bigbatch import checkpoint

pytestmark = [
    pytest.mark.slow,
    pytest.mark.fashion_mnist,
]

# 4 global steps per epoch, 2 epochs: checkpoints every 3 steps and at epoch ends.
RESUMABLE = [*TINY, "--checkpoint-every", "3", "--resume", "auto"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    run_bigbatch(["train", *RESUMABLE, "--out", str(out)])
    return out


@pytest.fixture(scope="module")
def uninterrupted_two_processes(tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted2") / "run"
    run_bigbatch(["train", *RESUMABLE, "--out", str(out)], nproc=2)
    return out


def test_sigkill_then_resume_is_bit_identical(uninterrupted, tmp_path):
    out = tmp_path / "run"
    killed = run_bigbatch(
        ["train", *RESUMABLE, "--out", str(out)],
        env={"BIGBATCH_FAULT": "sigkill:step=5"},
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL
    assert not (out / "final.pt").exists()
    assert [p.name for p in checkpoint.list_checkpoints(out / "checkpoints")][
        -1
    ] == checkpoint.checkpoint_name(4)
    run_bigbatch(["train", *RESUMABLE, "--out", str(out)])
    ours, reference = final_state(out), final_state(uninterrupted)
    for key in reference:
        assert torch.equal(ours[key], reference[key]), key
    assert train_losses(out) == train_losses(uninterrupted)  # the log was cut back and redone


def test_elastic_restart_after_a_rank_crash(uninterrupted_two_processes, tmp_path):
    out = tmp_path / "run"
    run_bigbatch(
        ["train", *RESUMABLE, "--out", str(out)],
        nproc=2,
        max_restarts=1,
        env={"BIGBATCH_FAULT": "crash:step=6:rank=1"},
        timeout=600,  # a restart under load once took over 300 s here; see the session notes
    )
    assert (
        max_relative_difference(final_state(out), final_state(uninterrupted_two_processes)) < 1e-6
    )
    assert summary(out)["steps"] == 8


def test_time_based_checkpoints_agree_across_ranks(tmp_path):
    # A checkpoint is a collective; each rank's clock votes and the votes are summed with the
    # step's statistics, so both ranks save after the same steps (here: after every step).
    out = tmp_path / "run"
    every_step = ["--set", "checkpoint.every_minutes=0.0001", "--set", "checkpoint.keep=100"]
    run_bigbatch(["train", *TINY, *every_step, "--out", str(out)], nproc=2, timeout=120)
    saved = [p.name for p in checkpoint.list_checkpoints(out / "checkpoints")]
    assert saved == [checkpoint.checkpoint_name(step) for step in range(1, 9)]


@pytest.mark.parametrize("first, second", [(2, 1), (1, 2)])
def test_resume_on_a_different_number_of_processes(uninterrupted, tmp_path, first, second):
    out = tmp_path / "run"
    stopped = run_bigbatch(
        ["train", *RESUMABLE, "--out", str(out)],
        nproc=first,
        max_restarts=0,
        env={"BIGBATCH_FAULT": "crash:step=5"},
        check=False,
    )
    assert stopped.returncode != 0
    run_bigbatch(["train", *RESUMABLE, "--out", str(out)], nproc=second)
    assert summary(out)["world_size"] == second
    assert max_relative_difference(final_state(out), final_state(uninterrupted)) < 1e-5


def test_sigterm_checkpoints_and_exits_75(tmp_path):
    out = tmp_path / "run"
    long_run = [*TINY, "--epochs", "40", "--out", str(out), "--resume", "auto"]
    process = subprocess.Popen(
        [sys.executable, "-m", "bigbatch", "train", *long_run],
        env=process_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (
        not metrics.exists() or len(metrics.read_text().splitlines()) < 3
    ):
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 75, stderr[-2000:]
    saved = checkpoint.list_checkpoints(out / "checkpoints")
    assert saved, "no checkpoint written on SIGTERM"
    state = checkpoint.load(saved[-1])
    assert 3 <= state["step"] < 160
    assert "resume with --resume auto" in stderr


def test_nan_stops_with_diagnostic_and_keeps_the_last_good_checkpoint(tmp_path):
    out = tmp_path / "run"
    result = run_bigbatch(
        ["train", *RESUMABLE, "--out", str(out)], env={"BIGBATCH_FAULT": "nan:step=5"}, check=False
    )
    assert result.returncode == 3
    diagnostic = json.loads((out / "nonfinite-step000000005.json").read_text())
    assert diagnostic["step"] == 5 and diagnostic["loss"] == "nan"
    assert "conv" in " ".join(diagnostic["layers"]) or diagnostic["layers"]
    saved = checkpoint.list_checkpoints(out / "checkpoints")
    assert [p.name for p in saved][-1] == checkpoint.checkpoint_name(4)
    assert checkpoint.load(saved[-1])["step"] == 4


def test_nan_skip_policy_drops_the_step_and_finishes(tmp_path):
    out = tmp_path / "run"
    run_bigbatch(
        ["train", *TINY, "--out", str(out), "--set", "on_nonfinite=skip"],
        env={"BIGBATCH_FAULT": "nan:step=2"},
    )
    assert summary(out)["skipped_steps"] == 1
    assert all(map(lambda x: x == x, train_losses(out)))  # no NaN reached the log


def test_kill_while_writing_a_checkpoint_leaves_the_previous_one(tmp_path):
    out = tmp_path / "run"
    result = run_bigbatch(
        ["train", *RESUMABLE, "--out", str(out)],
        env={"BIGBATCH_FAULT": "kill-in-checkpoint:step=4"},
        check=False,
    )
    assert result.returncode == -signal.SIGKILL
    saved = checkpoint.list_checkpoints(out / "checkpoints")
    assert [p.name for p in saved] == [checkpoint.checkpoint_name(3)]
    assert checkpoint.load(saved[-1])["step"] == 3
    run_bigbatch(["train", *RESUMABLE, "--out", str(out)])  # resumes from step 3 and finishes
    assert summary(out)["steps"] == 8
    assert not list((out / "checkpoints").glob(".*tmp*"))


def test_explicit_truncated_checkpoint_is_one_line_error(tmp_path):
    out = tmp_path / "run"
    bad = tmp_path / "bad.pt"
    blob = checkpoint.encode({"step": 1})
    bad.write_bytes(blob[:-5])
    result = run_bigbatch(["train", *TINY, "--out", str(out), "--resume", str(bad)], check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("bigbatch: error: checkpoint")
    assert "truncated" in result.stderr and "Traceback" not in result.stderr
