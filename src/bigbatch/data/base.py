"""What image data sets keyed by (example index, epoch) share: the crop of an example, batch
assembly with broken examples left out and reported, and lazily memory-mapped files.

A subclass sets ``labels`` (one int64 per example) and implements ``encoded(index)`` (the
example's encoded image bytes) and ``describe(index)`` (how messages name the example); it may
override ``load_image`` when its examples are not encoded images. Augmentation comes from
``transforms.example_crop``, so an example's pixels are a function of (seed, epoch, index) only,
whatever the worker, batch or number of processes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from bigbatch.data.batch import Batch, DeferredJpeg, load_batch, normalize_key
from bigbatch.data.decode import crop_planes
from bigbatch.data.device_decode import deferred_jpeg
from bigbatch.data.transforms import BoxForSize, eval_resize_size, example_crop
from bigbatch.errors import ConfigError, DataError

log = logging.getLogger(__name__)

ON_BROKEN = ("skip", "error")


class BrokenExample(ValueError):
    """An example that cannot be loaded for a reason known before decoding (e.g. no label);
    a ValueError, so batch assembly skips and reports it like an undecodable image."""


class IndexedImages(Dataset):
    """Map-style image data set keyed by (index, epoch); ``__getitems__`` returns a Batch.

    Args (keyword-only):
        train: the training split (augmented unless ``augment`` says otherwise) if True.
        augment: Inception crop + flip if True, else resize + center crop (default: ``train``).
        seed: run seed for augmentation.
        image_size: output side.
        resize_size: evaluation resize of the shorter side before the center crop (default:
            the usual 256/224 ratio, transforms.eval_resize_size).
        on_broken: "skip" (leave unreadable examples out of the batch, named in Batch.skipped)
            or "error" (raise DataError naming the example).
        fast_decode: decode JPEGs at reduced scale when that loses no output resolution.
        normalize: float32 normalised images if True, else uint8 (transforms.normalize_images).

    ``defer_jpegs`` (set by ``defer_jpegs_to_device``) leaves RGB JPEGs undecoded in the
    batches, for the training device (data/device_decode.py).
    """

    in_channels = 3
    noun = "image"  # how messages call one example
    remedy = "replace or delete it, or use on_broken=skip to skip broken examples"

    def __init__(self, *, train: bool, seed: int, image_size: int, resize_size: int | None,
                 on_broken: str, fast_decode: bool, normalize: bool,
                 augment: bool | None = None) -> None:
        resize_size = eval_resize_size(image_size) if resize_size is None else resize_size
        if on_broken not in ON_BROKEN:
            raise ConfigError(f"on_broken must be one of {', '.join(ON_BROKEN)}, got "
                              f"{on_broken!r}")
        if not 0 < image_size <= resize_size:
            raise ConfigError(f"image size {image_size} must be positive and at most the resize "
                              f"size {resize_size}")
        self.train = train
        self.augment = train if augment is None else augment
        self.seed = seed
        self.image_size = image_size
        self.resize_size = resize_size
        self.on_broken = on_broken
        self.fast_decode = fast_decode
        self.normalize = normalize
        self.labels = np.zeros(0, dtype=np.int64)
        self.defer_jpegs = False
        self._warned: set[str] = set()

    def __len__(self) -> int:
        return len(self.labels)

    def encoded(self, index: int) -> bytes:
        """The encoded image of example ``index`` (raises DECODE_ERRORS if unreadable)."""
        raise NotImplementedError

    def describe(self, index: int) -> str:
        """The name of example ``index`` in messages and Batch.skipped."""
        raise NotImplementedError

    def crop_plan(self, index: int, epoch: int) -> tuple[BoxForSize, bool]:
        """(box for a width x height image, flip) of one example; see example_crop."""
        return example_crop(self.augment, self.seed, epoch, index, self.image_size,
                            self.resize_size)

    def load_image(self, index: int, epoch: int) -> torch.Tensor:
        """One example as a 3 x image_size x image_size uint8 tensor (raises DECODE_ERRORS)."""
        box_for_size, flip = self.crop_plan(index, epoch)
        return crop_planes(self.encoded(index), box_for_size, self.image_size, self.fast_decode,
                           flip)

    def load_or_defer(self, index: int, epoch: int) -> torch.Tensor | DeferredJpeg:
        """load_image, or the example's file left undecoded where the device can take it."""
        box_for_size, flip = self.crop_plan(index, epoch)
        data = self.encoded(index)
        deferred = deferred_jpeg(data, box_for_size, self.image_size, flip, self.describe(index))
        if deferred is not None:
            return deferred
        return crop_planes(data, box_for_size, self.image_size, self.fast_decode, flip)

    def defer_jpegs_to_device(self) -> bool:
        """Leave RGB JPEGs for the training device to decode (uint8 batches only); returns
        whether the data set has JPEGs to leave."""
        if self.normalize:
            raise ConfigError("decoding JPEGs on the device needs uint8 batches; set "
                              "data.normalize_on_device=true")
        self.defer_jpegs = True
        return True

    def load_pixels(self, index: int, epoch: int) -> np.ndarray:
        """load_image as an image_size x image_size x 3 uint8 array (for inspection)."""
        return self.load_image(index, epoch).permute(1, 2, 0).numpy()

    def broken(self, index: int, error: Exception) -> str:
        """Report example ``index`` as unreadable (once per process) and return its name, or
        raise DataError with on_broken="error"."""
        return self.report_broken(self.describe(index), error)

    def report_broken(self, name: str, error: Exception) -> str:
        """broken() for an example known by its name (a file the device could not decode)."""
        reason = f"{type(error).__name__}: {error}"
        if self.on_broken == "error":
            raise DataError(f"cannot read {self.noun} {name}: {reason}; {self.remedy}") from error
        if name not in self._warned:
            self._warned.add(name)
            log.warning("skipping unreadable %s %s: %s", self.noun, name, reason)
        return name

    def __getitems__(self, keys: list) -> Batch:
        load = self.load_or_defer if self.defer_jpegs else self.load_image
        return load_batch(keys, load, self.broken, self.labels, self.image_size, self.normalize)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, int]:
        """One (image 3xSxS, label) pair, decoded here; a bare index means epoch 0. A broken
        example raises DataError whatever on_broken says, since there is nothing to return."""
        batch = load_batch([normalize_key(key)], self.load_image, self.broken, self.labels,
                           self.image_size, self.normalize)
        if not len(batch):
            raise DataError(f"cannot read {self.noun} {batch.skipped[0]} (see the warning above)")
        return batch.images[0], int(batch.labels[0])


class MappedFiles:
    """Read-only memory maps of a list of files, each opened on first use, once per process.

    Forked DataLoader workers share the parent's maps and the page cache; pickling (workers
    started by spawn) drops the maps, which are reopened on first use instead of copied.
    """

    def __init__(self, paths: Sequence[str | os.PathLike]) -> None:
        self.paths = [Path(path) for path in paths]
        self._maps: dict[int, np.memmap] = {}

    def __getstate__(self) -> dict:
        return {"paths": self.paths, "_maps": {}}

    def read(self, file: int, offset: int, size: int) -> np.ndarray:
        """``size`` bytes at ``offset`` of file number ``file`` (a view; shorter past the end)."""
        mapped = self._maps.get(file)
        if mapped is None:
            mapped = np.memmap(self.paths[file], dtype=np.uint8, mode="r")
            self._maps[file] = mapped
        return mapped[offset:offset + size]
