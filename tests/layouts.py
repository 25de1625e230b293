"""What the optimizer kernels' tests share: running a test on the compiled kernel and on the
eager fallback, and tensor layouts (the same values freshly allocated or as views into one flat
buffer at odd offsets, as DDP's gradient_as_bucket_view buckets place them)."""

from __future__ import annotations

import shutil
import sys
from types import ModuleType

import pytest
import torch


def kernel_or_eager(path: str, kernel: ModuleType, monkeypatch, source: str) -> str:
    """For an autouse fixture parametrised over ["kernel", "eager"]: the eager path with the
    kernel unloaded, or the kernel, which must have been built where a C compiler exists."""
    if path == "eager":
        monkeypatch.setattr(kernel, "_KERNELS", None)
    elif not kernel.available():
        if sys.platform.startswith("linux") and shutil.which("gcc"):
            pytest.fail(f"pip install -e . did not build the kernel ({source})")
        pytest.skip(f"the kernel ({source}) is not built on this platform")
    return path

# Tensors of one chunk of the kernels (16384 values) and of several, 527 thousand values in all.
LAYOUT_SHAPES = [(10, 10), (8, 5, 5, 5), (25,), (1000,), (64, 3, 7, 7), (120_001,),
                 (256, 128, 3, 3), (7,), (333, 301)]


def odd_offset_views(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of ``tensors`` as views into one flat buffer, each at an offset that is not a
    multiple of 16 values (as DDP's gradient_as_bucket_view buckets place gradients)."""
    gaps = [1, 3, 5, 7, 9, 11, 13]
    total = sum(t.numel() for t in tensors) + 32 * len(tensors)
    flat = torch.full((total,), float("nan"), dtype=tensors[0].dtype)
    views, offset = [], 0
    for i, t in enumerate(tensors):
        offset += -offset % 16 + gaps[i % len(gaps)]  # the next multiple of 16, then odd
        views.append(flat[offset:offset + t.numel()].view(t.shape).copy_(t))
        offset += t.numel()
    return views


def assert_column_major_gradients_step_alike(opt, ref, params, reference, grads) -> None:
    """Step ``opt`` with column-major copies of ``grads`` (which a kernel does not take) and
    ``ref`` with contiguous ones: the weights must come out the same."""
    for p, q, g in zip(params, reference, grads, strict=True):
        p.grad = g.t().contiguous().t() if g.ndim == 2 else g  # column-major copy
        q.grad = g.clone()
    opt.step()
    ref.step()
    for p, q in zip(params, reference, strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-12, atol=1e-12)
