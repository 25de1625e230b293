"""The number of intra-op CPU threads a piece of work runs with."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def intra_op_threads(threads: int | None):
    """Run with ``threads`` intra-op CPU threads (None: leave PyTorch's setting), then restore.

    On a CPU shared with other work, fewer threads than cores can be several times faster:
    OpenMP threads spin while waiting for each other, and a descheduled one stalls the rest
    (docs/PERFORMANCE.md).
    """
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
