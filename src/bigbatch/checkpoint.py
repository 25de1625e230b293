"""Checkpoints that are written atomically, verified on load, and independent of the world size.

File layout: an 8-byte magic, the payload's length (8 bytes) and SHA-256 (32 bytes), then the
payload (a ``torch.save`` of a dict). A file is written to a temporary name in the same folder,
flushed and fsynced, then renamed into place, and the folder is fsynced; a crash at any moment
leaves either the old set of checkpoints or the old set plus the new one, never a torn file
under a checkpoint's name. Truncation or corruption is caught by the length and hash before
unpickling.

Loading never runs code from the file. A pickle names the callables that rebuild its objects,
and an unrestricted unpickler calls them, so a checkpoint or weights file from someone else (or
from a shared folder) could run anything; the SHA-256 proves the file is intact, not who wrote
it. Every file is read with ``torch.load(weights_only=True)``, which rebuilds only tensors and
plain containers, numbers and strings: what bigbatch writes (state dicts, the optimizer state and
the config as a plain dict) and nothing else.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import pickle
import re
import struct
from pathlib import Path
from typing import Any

import torch

from bigbatch.distributed import DistContext, all_gather_object, broadcast_object
from bigbatch.errors import CheckpointError

log = logging.getLogger(__name__)

MAGIC = b"BBCKPT01"
_HEADER = struct.Struct("<8sQ32s")
_NAME = re.compile(r"^checkpoint-step(\d{9})\.pt$")


def checkpoint_name(step: int) -> str:
    return f"checkpoint-step{step:09d}.pt"


def encode(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    return _HEADER.pack(MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload


def decode(blob: bytes, source: str) -> dict[str, Any]:
    """The checkpoint dict, or CheckpointError saying what is wrong with the file."""
    if len(blob) < _HEADER.size:
        raise CheckpointError(f"checkpoint {source} is truncated ({len(blob)} bytes)")
    magic, length, digest = _HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise CheckpointError(f"{source} is not a bigbatch checkpoint")
    payload = blob[_HEADER.size :]
    if len(payload) != length:
        raise CheckpointError(
            f"checkpoint {source} is truncated ({len(payload)} of {length} payload bytes)"
        )
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(f"checkpoint {source} is corrupt (checksum mismatch)")
    return read_state(io.BytesIO(payload), f"checkpoint {source}")


def read_state(file: Any, source: str) -> Any:
    """Unpickle tensors and plain data only; a file that asks for anything else is refused."""
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(
            f"refused to load {source}: {_refused_global(error)}; bigbatch loads only tensors "
            "and plain data (all it ever writes)"
        ) from None
    except Exception as error:  # a damaged zip or pickle surfaces as many exception types
        raise CheckpointError(f"cannot read {source}: {_first_line(error)}") from None


def _refused_global(error: Exception) -> str:
    """What the unpickler would have had to import or call, from torch's long message."""
    match = re.search(r"GLOBAL ([\w.]+)", str(error))
    return f"it would import {match.group(1)}" if match else _first_line(error)


def _first_line(error: Exception) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0][:200] if lines else type(error).__name__


def load_model_state(model: torch.nn.Module, state: dict[str, Any], source: str) -> None:
    """Load a state dict that must fit ``model`` exactly, or say which tensors do not."""
    if not isinstance(state, dict):
        raise CheckpointError(f"{source} holds no model weights (a {type(state).__name__})")
    expected = model.state_dict()
    problems = [f"missing {key}" for key in expected if key not in state]
    problems += [f"unexpected {key}" for key in state if key not in expected]
    problems += [
        f"{key} has shape {tuple(state[key].shape)}, the model {tuple(value.shape)}"
        for key, value in expected.items()
        if key in state and getattr(state[key], "shape", None) != value.shape
    ]
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise CheckpointError(f"{source} does not fit this model: {'; '.join(problems[:3])}{more}")
    model.load_state_dict(state)


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: Any, source: str) -> None:
    """Load optimizer state, or say in one line that it belongs to another set of parameters."""
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(
            f"{source}: its optimizer state does not fit this run ({_first_line(error)})"
        ) from None


def write_atomic(path: Path, data: bytes) -> None:
    """Write bytes so that ``path`` holds either nothing new or all of ``data``."""
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def save(folder: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Write checkpoint ``step`` atomically, then prune all but the newest ``keep``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / checkpoint_name(step)
    write_atomic(path, encode(state))
    for old in list_checkpoints(folder)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def load(path: Path) -> dict[str, Any]:
    if not Path(path).is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    return decode(Path(path).read_bytes(), str(path))


def list_checkpoints(folder: Path) -> list[Path]:
    """Checkpoints in ``folder``, oldest first (by step)."""
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def load_latest_valid(folder: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads, falling back past damaged or refused ones (saying so)."""
    for path in reversed(list_checkpoints(folder)):
        try:
            return path, load(path)
        except CheckpointError as error:
            log.warning("skipping unusable checkpoint: %s; trying the previous one", error)
    return None


def clean_temporaries(folder: Path) -> None:
    """Remove half-written files left by a process killed while saving."""
    if folder.is_dir():
        for stray in folder.glob(".checkpoint-step*.pt.tmp-*"):
            stray.unlink(missing_ok=True)


def digest_of(path: Path) -> bytes:
    """The payload's SHA-256 as stored in the file's header (b"" when there is no header)."""
    with open(path, "rb") as file:
        header = file.read(_HEADER.size)
    return _HEADER.unpack(header)[2] if len(header) == _HEADER.size else b""


def load_agreed_latest(folder: Path, ctx: DistContext) -> tuple[Path, dict[str, Any]] | None:
    """``--resume auto`` on every rank: the checkpoint rank 0 chooses, or None to start afresh.

    Each rank looking for its own latest file would, on a file system that is not shared or
    lags, resume ranks from different steps. So rank 0 alone picks the newest checkpoint that
    loads and broadcasts its name and SHA-256; every other rank loads that file from its own
    view of ``folder`` and checks it holds the same bytes. If any rank cannot, every rank stops
    with the same one-line CheckpointError naming the rank and the file (no rank trains on).
    """
    found, choice = None, None
    if ctx.is_main:
        clean_temporaries(folder)
        found = load_latest_valid(folder)
        choice = None if found is None else (found[0].name, digest_of(found[0]))
    choice = broadcast_object(choice, ctx)
    if choice is None:
        return None
    name, digest = choice
    problem = None
    if not ctx.is_main:
        found, problem = _load_same(folder / name, digest)
    problems = [(rank, text) for rank, text in enumerate(all_gather_object(problem, ctx)) if text]
    if problems:
        rank, text = problems[0]
        raise CheckpointError(f"rank {rank} cannot resume from {name}, the checkpoint rank 0 "
                              f"chose: {text}; every rank must see the same checkpoint folder")
    return found


def _load_same(path: Path, digest: bytes) -> tuple[tuple[Path, dict[str, Any]] | None, str | None]:
    """((path, state), None) if ``path`` loads and has SHA-256 ``digest``, else (None, why)."""
    try:
        state = load(path)
    except CheckpointError as error:
        return None, str(error)
    if digest_of(path) != digest:
        return None, f"its {path} holds other bytes than rank 0's (SHA-256 differs)"
    return (path, state), None
