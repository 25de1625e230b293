"""Checkpoint files: atomic writes, verification, fallback to the previous good one, pruning."""

import pytest
import torch

from bigbatch import checkpoint
from bigbatch.errors import CheckpointError


def state(step):
    return {"step": step, "model": {"w": torch.full((4,), float(step))}}


def test_save_load_round_trip_and_keep_last_k(tmp_path):
    for step in (10, 20, 30, 40):
        checkpoint.save(tmp_path, step, state(step), keep=2)
    names = [p.name for p in checkpoint.list_checkpoints(tmp_path)]
    assert names == [checkpoint.checkpoint_name(30), checkpoint.checkpoint_name(40)]
    loaded = checkpoint.load(tmp_path / checkpoint.checkpoint_name(40))
    assert loaded["step"] == 40 and torch.equal(loaded["model"]["w"], torch.full((4,), 40.0))


def test_truncated_checkpoint_is_rejected_with_a_clear_message(tmp_path):
    path = checkpoint.save(tmp_path, 5, state(5), keep=3)
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        checkpoint.load(path)


def test_flipped_byte_is_detected(tmp_path):
    path = checkpoint.save(tmp_path, 5, state(5), keep=3)
    blob = bytearray(path.read_bytes())
    blob[-10] ^= 0xFF
    path.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="corrupt"):
        checkpoint.load(path)


def test_not_a_checkpoint(tmp_path):
    path = tmp_path / checkpoint.checkpoint_name(1)
    path.write_bytes(b"hello world, this is not a checkpoint at all" * 3)
    with pytest.raises(CheckpointError, match="not a bigbatch checkpoint"):
        checkpoint.load(path)


def test_latest_valid_falls_back_past_a_damaged_one(tmp_path, caplog):
    checkpoint.save(tmp_path, 1, state(1), keep=3)
    newest = checkpoint.save(tmp_path, 2, state(2), keep=3)
    newest.write_bytes(newest.read_bytes()[:100])
    path, loaded = checkpoint.load_latest_valid(tmp_path)
    assert loaded["step"] == 1 and path.name == checkpoint.checkpoint_name(1)
    assert "skipping unusable checkpoint" in caplog.text and "truncated" in caplog.text


def test_no_valid_checkpoint_gives_none(tmp_path):
    assert checkpoint.load_latest_valid(tmp_path) is None
    (tmp_path / checkpoint.checkpoint_name(3)).write_bytes(b"")
    assert checkpoint.load_latest_valid(tmp_path) is None


def test_temporaries_are_not_checkpoints_and_get_cleaned(tmp_path):
    checkpoint.save(tmp_path, 1, state(1), keep=3)
    stray = tmp_path / f".{checkpoint.checkpoint_name(2)}.tmp-123"
    stray.write_bytes(b"half")
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == [
        checkpoint.checkpoint_name(1)
    ]
    checkpoint.clean_temporaries(tmp_path)
    assert not stray.exists()


def test_missing_file():
    with pytest.raises(CheckpointError, match="does not exist"):
        checkpoint.load("/no/such/checkpoint.pt")
