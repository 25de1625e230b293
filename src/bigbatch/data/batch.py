"""The unit a dataset hands to the training loop (images, labels, the files it had to skip and
the JPEGs it left for the device to decode), and how image datasets assemble it example by
example."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils.data import get_worker_info

from bigbatch.data.transforms import (
    DECODE_ERRORS,
    IMAGENET_MEAN,
    IMAGENET_STD,
    Box,
    normalization_affine,
)


@dataclass(frozen=True)
class JpegCrop:
    """What the training device does with one RGB JPEG it decodes (data/device_decode.py): the
    file's frame size, the whole-pixel box to crop, the flip, and how messages name the file."""

    height: int
    width: int
    box: Box
    flip: bool
    name: str


@dataclass(frozen=True)
class DeferredJpeg:
    """An example a loader worker left undecoded: the file's bytes and its crop."""

    data: bytes
    crop: JpegCrop


@dataclass
class PendingJpegs:
    """The JPEGs of one batch left for the device, and the batch rows they fill. Their bytes
    lie end to end in one uint8 tensor, so a loader worker sends one block of shared memory
    rather than one per file."""

    rows: list[int]
    data: torch.Tensor
    ends: list[int]
    crops: list[JpegCrop]

    @classmethod
    def pack(cls, rows: list[int], files: list[DeferredJpeg]) -> PendingJpegs | None:
        """The pending JPEGs of a batch, or None if there are none."""
        if not files:
            return None
        ends = np.cumsum([len(file.data) for file in files]).tolist()
        data = batch_tensor((ends[-1],), torch.uint8)
        packed = data.numpy()
        for start, end, file in zip([0, *ends[:-1]], ends, files, strict=True):
            packed[start:end] = np.frombuffer(file.data, dtype=np.uint8)
        return cls(rows, data, ends, [file.crop for file in files])

    def encoded(self) -> list[torch.Tensor]:
        """Each file's bytes, as uint8 views of ``data``."""
        starts = [0, *self.ends[:-1]]
        return [self.data[start:end] for start, end in zip(starts, self.ends, strict=True)]


@dataclass
class Batch:
    """A loaded micro-batch.

    images: N x C x H x W, float32 normalised or uint8 (normalised later on the device, see
    transforms.normalize_images). labels: int64 N. skipped: paths of broken files
    left out of this batch (so N can be smaller than the number of keys requested).
    pending: JPEGs whose rows of ``images`` the training device fills in
    (device_decode.decode_pending); None when the loader decoded everything.
    """

    images: torch.Tensor
    labels: torch.Tensor
    skipped: list[str] = field(default_factory=list)
    pending: PendingJpegs | None = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def pin_memory(self) -> Batch:
        """Called by DataLoader(pin_memory=True) on custom batch types."""
        return Batch(self.images.pin_memory(), self.labels.pin_memory(), self.skipped,
                     self.pending)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(self.images.to(device, non_blocking=non_blocking),
                     self.labels.to(device, non_blocking=non_blocking), self.skipped,
                     self.pending)


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


def batch_tensor(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised tensor for a batch; in a DataLoader worker it lives in shared memory
    from the start (as default_collate does), so sending it to the training process costs no
    extra copy."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    storage = torch.UntypedStorage._new_shared(math.prod(shape) * itemsize)
    strides = torch.empty(shape, device="meta").stride()
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape, strides)


class BatchImages:
    """Images written one by one into a preallocated N x C x S x S batch tensor.

    uint8 images are copied as they are; with ``normalize`` they are converted to float32
    (x/255 - mean)/std while each is in cache, bitwise equal to transforms.normalize_images.
    Examples that fail to load are simply not added, so the batch has no gaps.
    """

    def __init__(self, capacity: int, size: int, channels: int = 3, normalize: bool = True,
                 mean: Sequence[float] = IMAGENET_MEAN,
                 std: Sequence[float] = IMAGENET_STD) -> None:
        dtype = torch.float32 if normalize else torch.uint8
        self._out = batch_tensor((capacity, channels, size, size), dtype)
        self._affine = normalization_affine(mean, std, torch.device("cpu")) if normalize else None
        self._count = 0

    def add(self, image: torch.Tensor) -> None:
        """Append a C x S x S uint8 image (any strides)."""
        slot = self._out[self._count]
        if self._affine is None:
            slot.copy_(image)
        else:
            scale, shift = self._affine
            torch.addcmul(shift[0], image, scale[0], out=slot)
        self._count += 1

    def reserve(self) -> int:
        """Append a blank image (filled in later, on the device) and return its row."""
        self._out[self._count].zero_()
        self._count += 1
        return self._count - 1

    def images(self) -> torch.Tensor:
        return self._out[: self._count]


def load_batch(keys: list, load_image: Callable[[int, int], torch.Tensor | DeferredJpeg],
               broken: Callable[[int, Exception], str], labels: np.ndarray, image_size: int,
               normalize: bool) -> Batch:
    """The Batch of ``keys`` ((index, epoch) pairs or bare indices): ``load_image(index,
    epoch)`` gives each 3 x S x S uint8 image, or a DeferredJpeg for the device to decode (only
    into uint8 batches); examples whose loading raises one of DECODE_ERRORS are left out and
    ``broken(index, error)`` names them in Batch.skipped."""
    pairs = keys_array(keys).tolist()
    images = BatchImages(len(pairs), image_size, normalize=normalize)
    kept: list[int] = []
    skipped: list[str] = []
    pending_rows: list[int] = []
    pending: list[DeferredJpeg] = []
    for index, epoch in pairs:
        try:
            image = load_image(index, epoch)
        except DECODE_ERRORS as error:
            skipped.append(broken(index, error))
            continue
        if isinstance(image, DeferredJpeg):
            pending_rows.append(images.reserve())
            pending.append(image)
        else:
            images.add(image)
        kept.append(int(labels[index]))
    return Batch(images.images(), torch.tensor(kept, dtype=torch.int64), skipped,
                 PendingJpegs.pack(pending_rows, pending))
