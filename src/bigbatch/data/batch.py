"""The unit a dataset hands to the training loop: images, labels and the files it had to skip."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class Batch:
    """A loaded micro-batch.

    images: float32 N x C x H x W, normalised. labels: int64 N. skipped: paths of broken files
    left out of this batch (so N can be smaller than the number of keys requested).
    """

    images: torch.Tensor
    labels: torch.Tensor
    skipped: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def pin_memory(self) -> Batch:
        """Called by DataLoader(pin_memory=True) on custom batch types."""
        return Batch(self.images.pin_memory(), self.labels.pin_memory(), self.skipped)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(self.images.to(device, non_blocking=non_blocking),
                     self.labels.to(device, non_blocking=non_blocking), self.skipped)


def normalize_key(key: int | tuple[int, int]) -> tuple[int, int]:
    """(index, epoch) from a key; a bare index means epoch 0 (handy interactively)."""
    if isinstance(key, (tuple, list)):
        index, epoch = key
        return int(index), int(epoch)
    return int(key), 0


def keys_array(keys: list) -> np.ndarray:
    """Keys as an int64 array of shape (N, 2): columns example index and epoch."""
    try:
        pairs = np.asarray(keys, dtype=np.int64)
    except ValueError:  # a mix of bare indices and pairs
        pairs = np.array([normalize_key(key) for key in keys], dtype=np.int64)
    if pairs.ndim == 1:
        pairs = np.stack([pairs, np.zeros_like(pairs)], axis=1)
    return pairs.reshape(-1, 2)
