"""Synthetic images for throughput benchmarks: deterministic per index and nearly free to make.

Example i's label is ``mix64(seed, first_index + i) % num_classes`` and its image is entry
``label % pool_size`` of a small fixed pool of random tensors, so a model can learn the task up to
pool aliasing (a sanity check that training moves) while loading costs one index_select.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from bigbatch.data.batch import Batch, keys_array, normalize_key
from bigbatch.data.seeding import mix64, mix64_array
from bigbatch.errors import ConfigError

_POOL_BYTES = 64 * 2**20  # bound on the pool's memory, whatever the image size
_LABEL_STREAM = 0x4C41424C  # "LABL"
_POOL_STREAM = 0x504F4F4C  # "POOL"


class SyntheticImages(Dataset):
    """``num_examples`` normalised-looking C x S x S images with labels in [0, num_classes).

    ``first_index`` offsets example identities, so a validation set built with
    ``first_index=len(train)`` holds different examples from the same distribution.
    """

    def __init__(self, num_examples: int, num_classes: int, image_size: int,
                 in_channels: int = 3, seed: int = 0, first_index: int = 0) -> None:
        for name, value in (("synthetic examples", num_examples),
                            ("synthetic classes", num_classes), ("image size", image_size),
                            ("in channels", in_channels)):
            if value < 1:
                raise ConfigError(f"{name} must be at least 1, got {value}")
        self.num_examples = num_examples
        self.num_classes = num_classes
        self.image_size = image_size
        self.in_channels = in_channels
        self.seed = seed
        self.first_index = first_index
        self.classes = [f"class{k}" for k in range(num_classes)]
        image_bytes = 4 * in_channels * image_size * image_size
        pool_size = max(1, min(num_classes, _POOL_BYTES // image_bytes))
        generator = torch.Generator().manual_seed(mix64(_POOL_STREAM, seed))
        self.pool = torch.randn((pool_size, in_channels, image_size, image_size),
                                generator=generator)

    def __len__(self) -> int:
        return self.num_examples

    def labels_of(self, indices: np.ndarray) -> np.ndarray:
        hashes = mix64_array((_LABEL_STREAM, self.seed), np.asarray(indices) + self.first_index)
        return (hashes % np.uint64(self.num_classes)).astype(np.int64)

    def __getitems__(self, keys: list) -> Batch:
        indices = keys_array(keys)[:, 0]
        if len(indices) and (indices.min() < 0 or indices.max() >= self.num_examples):
            raise IndexError(f"index out of range [0, {self.num_examples})")
        labels = torch.from_numpy(self.labels_of(indices))
        images = self.pool.index_select(0, labels % self.pool.shape[0])
        return Batch(images, labels, [])

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, int]:
        batch = self.__getitems__([normalize_key(key)])
        return batch.images[0], int(batch.labels[0])
