"""Tensor layouts for the optimizer kernels' tests: the same values freshly allocated or as views
into one flat buffer at odd offsets (as DDP's gradient_as_bucket_view buckets place them)."""

from __future__ import annotations

import torch

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
