"""Files from elsewhere: loading a weights file or checkpoint never runs code it carries.

Each crafted file holds a real run's weights plus one object whose pickle reduce calls
``os.system`` or ``builtins.exec`` to create a marker file. The tests check that bigbatch refuses
the file (one line, exit 2, or for ``--resume auto`` a fallback to the previous checkpoint) and
that the marker was never created; one test first shows that the payload does run under an
unrestricted ``torch.load``.
"""

from __future__ import annotations

import builtins
import os
import signal
from pathlib import Path

import pytest
import torch
from launch import TINY, final_state, max_relative_difference, run_bigbatch, summary

from bigbatch import checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.fashion_mnist]

# 4 global steps per epoch, 2 epochs: checkpoints at steps 3, 4, 6, 8 (the last 2 kept).
RESUMABLE = [*TINY, "--checkpoint-every", "3", "--resume", "auto"]


class SystemPayload:
    """Unpickling this calls os.system (pickle's GLOBAL posix.system) to touch ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class ExecPayload:
    """Unpickling this calls builtins.exec on code that creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (builtins.exec, (f"open({str(self.marker)!r}, 'w').close()",))


PAYLOADS = {"os.system": SystemPayload, "builtins.exec": ExecPayload}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    run_bigbatch(["train", *RESUMABLE, "--out", str(out)])
    return out


def crafted(state: dict, payload: str, marker: Path) -> dict:
    """A genuine state dict with one extra entry that would run code when unpickled."""
    return {**state, "note": PAYLOADS[payload](marker)}


def write_crafted_final(run: Path, path: Path, payload: str, marker: Path) -> Path:
    genuine = torch.load(run / "final.pt", map_location="cpu", weights_only=True)
    torch.save(crafted(genuine, payload, marker), path)
    return path


def write_crafted_checkpoint(run: Path, path: Path, payload: str, marker: Path) -> Path:
    """A checkpoint in bigbatch's own format (magic, length, valid SHA-256) around the payload."""
    genuine = checkpoint.load(checkpoint.list_checkpoints(run / "checkpoints")[-1])
    path.write_bytes(checkpoint.encode(crafted(genuine, payload, marker)))
    return path


def assert_refused(result, marker: Path) -> None:
    assert not marker.exists(), "the file's code ran"
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("bigbatch: error: refused to load"), last
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("payload", PAYLOADS)
def test_the_payload_runs_under_an_unrestricted_load(finished_run, tmp_path, payload):
    # The control: without weights_only the same file does run its code.
    marker = tmp_path / "marker"
    path = write_crafted_final(finished_run, tmp_path / "final.pt", payload, marker)
    torch.load(path, map_location="cpu", weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("payload", PAYLOADS)
def test_eval_refuses_a_crafted_final_pt(finished_run, tmp_path, payload):
    marker = tmp_path / "marker"
    path = write_crafted_final(finished_run, tmp_path / "final.pt", payload, marker)
    result = run_bigbatch(["eval", "--weights", str(path)], check=False)
    assert_refused(result, marker)
    assert "it would import" in result.stderr


@pytest.mark.parametrize("payload", PAYLOADS)
def test_eval_refuses_a_crafted_checkpoint_with_a_valid_checksum(finished_run, tmp_path, payload):
    marker = tmp_path / "marker"
    name = checkpoint.checkpoint_name(8)
    path = write_crafted_checkpoint(finished_run, tmp_path / name, payload, marker)
    result = run_bigbatch(["eval", "--weights", str(path)], check=False)
    assert_refused(result, marker)


@pytest.mark.parametrize("payload", PAYLOADS)
def test_resume_refuses_a_crafted_checkpoint(finished_run, tmp_path, payload):
    marker = tmp_path / "marker"
    name = checkpoint.checkpoint_name(8)
    path = write_crafted_checkpoint(finished_run, tmp_path / name, payload, marker)
    out = tmp_path / "run"
    result = run_bigbatch(["train", *TINY, "--out", str(out), "--resume", str(path)], check=False)
    assert_refused(result, marker)
    assert not (out / "final.pt").exists()


def test_resume_auto_falls_back_past_a_crafted_checkpoint(finished_run, tmp_path):
    out, marker = tmp_path / "run", tmp_path / "marker"
    killed = run_bigbatch(
        ["train", *RESUMABLE, "--out", str(out)],
        env={"BIGBATCH_FAULT": "sigkill:step=5"},
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL
    planted = out / "checkpoints" / checkpoint.checkpoint_name(5)  # newer than the good step 4
    write_crafted_checkpoint(out, planted, "os.system", marker)
    resumed = run_bigbatch(["train", *RESUMABLE, "--out", str(out)])
    assert not marker.exists(), "the file's code ran"
    assert f"skipping unusable checkpoint: refused to load checkpoint {planted}" in resumed.stderr
    assert f"resumed from {out / 'checkpoints' / checkpoint.checkpoint_name(4)}" in resumed.stderr
    assert summary(out)["steps"] == 8
    assert max_relative_difference(final_state(out), final_state(finished_run)) < 1e-5


def test_what_bigbatch_writes_loads_weights_only(finished_run):
    # final.pt and checkpoints as written by the training run (the same torch.save calls as
    # before loading was restricted): plain dicts, lists, numbers, strings and tensors.
    final = torch.load(finished_run / "final.pt", map_location="cpu", weights_only=True)
    assert set(final) == {"model", "classes", "config"}
    assert final["config"]["model"]["options"] == {"width": 8}
    state = checkpoint.load(checkpoint.list_checkpoints(finished_run / "checkpoints")[-1])
    assert state["step"] == 8 and state["optimizer"]["state"]


def test_weights_of_another_model_are_one_line_and_exit_2(finished_run, tmp_path):
    genuine = torch.load(finished_run / "final.pt", map_location="cpu", weights_only=True)
    model = dict(genuine["model"])
    first = next(iter(model))
    model[first] = torch.zeros(3, 3)
    model["extra.weight"] = model.pop(list(model)[-1])
    path = tmp_path / "final.pt"
    torch.save({**genuine, "model": model}, path)
    result = run_bigbatch(["eval", "--weights", str(path)], check=False)
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"bigbatch: error: weights file {path} does not fit this model: ")
    assert "missing" in last and "unexpected extra.weight" in last and "has shape (3, 3)" in last
    assert "Traceback" not in result.stderr


def test_resume_from_another_model_is_one_line_and_exit_2(finished_run, tmp_path):
    saved = checkpoint.list_checkpoints(finished_run / "checkpoints")[-1]
    wider = ["--set", "model.options.width=16"]
    result = run_bigbatch(
        ["train", *TINY, *wider, "--out", str(tmp_path / "run"), "--resume", str(saved)],
        check=False,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"bigbatch: error: checkpoint {saved} does not fit this model: ")
    assert "has shape" in last and "more)" in last
    assert "Traceback" not in result.stderr
