"""ImageNet-style folders: root/train/<class>/<image> and root/val/<class>/<image>.

Decoding is libjpeg-turbo (torchvision.io) or PIL with JPEG draft mode (DCT scaling) when that
loses no output resolution, and crop + resize is one resampling of the crop box (data/decode.py).
Augmentation parameters are drawn from example_generator(seed, epoch, index), so an example's
crop does not depend on the worker, the batch or the number of processes (docs/design.md,
principle 1).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from bigbatch.data.batch import Batch, load_batch, normalize_key
from bigbatch.data.decode import decode_crop_planes
from bigbatch.data.transforms import BoxForSize, example_crop
from bigbatch.errors import ConfigError, DataError

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".ppm", ".pgm", ".bmp", ".tif", ".tiff",
                              ".webp"})
SPLITS = ("train", "val")
ON_BROKEN = ("skip", "error")
_IGNORED_EXAMPLES = 5


def check_data_root(root: Path, split: str) -> Path:
    """root/split, or a DataError saying which folder is missing and what layout is expected."""
    if not root.is_dir():
        raise DataError(f"data folder {root} does not exist; pass --data pointing to a folder "
                        "with train/ and val/ subfolders")
    split_dir = root / split
    if not split_dir.is_dir():
        raise DataError(f"no {split}/ folder in {root}; expected {split_dir}/<class>/<images>")
    return split_dir


def class_folders(split_dir: Path) -> list[str]:
    """Sorted names of the class sub-folders (hidden ones skipped)."""
    names = sorted(entry.name for entry in os.scandir(split_dir)
                   if entry.is_dir() and not entry.name.startswith("."))
    if not names:
        raise DataError(f"no class folders in {split_dir}; expected {split_dir}/<class>/<images>")
    return names


def class_files(class_dir: Path) -> tuple[list[str], list[str]]:
    """Image files (relative to the split folder, sorted, sub-folders included) and the paths
    of files ignored for their extension."""
    images: list[str] = []
    ignored: list[str] = []
    for folder, subdirs, files in os.walk(class_dir):
        subdirs.sort()
        for name in sorted(files):
            path = os.path.join(folder, name)
            if os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS:
                images.append(os.path.relpath(path, class_dir.parent))
            else:
                ignored.append(path)
    return images, ignored


def scan_split(split_dir: Path, class_names: list[str] | None
               ) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    """(relative paths as bytes, labels, class names, ignored paths) of one split, sorted.

    Paths are kept in one numpy bytes array rather than a list of str so that forked DataLoader
    workers share them instead of copying pages touched by reference counting.
    """
    folders = class_folders(split_dir)
    classes = list(folders) if class_names is None else list(class_names)
    label_of = {name: label for label, name in enumerate(classes)}
    for name in folders:
        if name not in label_of:
            raise DataError(f"class {name!r} in {split_dir} is not among the training classes; "
                            "remove it or add it to train/")
    paths: list[str] = []
    labels: list[int] = []
    ignored: list[str] = []
    for name in folders:
        images, skipped = class_files(split_dir / name)
        ignored.extend(skipped)
        if not images:
            raise DataError(f"class folder {split_dir / name} has no images; add images or "
                            "remove the folder")
        paths.extend(images)
        labels.extend([label_of[name]] * len(images))
    encoded = np.array([os.fsencode(path) for path in paths], dtype=np.bytes_)
    return encoded, np.array(labels, dtype=np.int64), classes, ignored


def strided_subset(total: int, subset: int) -> np.ndarray:
    """``subset`` indices spread evenly over a class-sorted list, so every class keeps examples."""
    if not 1 <= subset <= total:
        raise ConfigError(f"train subset {subset} is outside 1..{total}; pick a smaller subset")
    return (np.arange(subset, dtype=np.int64) * total) // subset


class ImageFolderData(Dataset):
    """Map-style image folder keyed by (index, epoch); ``__getitems__`` returns a Batch.

    Args:
        root: folder with train/ and val/ sub-folders of class folders.
        split: "train" or "val".
        train: augment (Inception crop + flip) if True, else resize + center crop.
        seed: run seed for augmentation.
        image_size: output side (default 224).
        resize_size: evaluation resize of the shorter side before the center crop (default 256).
        on_broken: "skip" (leave unreadable files out of the batch, list them in Batch.skipped)
            or "error" (raise DataError naming the file) (default "skip").
        class_names: class list to label with (val uses train's); default: the folder names.
        fast_decode: decode JPEGs at reduced scale when that loses no output resolution.
        subset: keep only this many examples, spread evenly over the classes (default all).
        normalize: return normalised float32 images (default); False returns uint8 images to
            be normalised on the device with transforms.normalize_images (cheaper loading).
    """

    in_channels = 3

    def __init__(self, root: str | os.PathLike, split: str = "train", train: bool = True,
                 seed: int = 0, image_size: int = 224, resize_size: int = 256,
                 on_broken: str = "skip", class_names: list[str] | None = None,
                 fast_decode: bool = True, subset: int | None = None,
                 normalize: bool = True) -> None:
        if split not in SPLITS:
            raise ConfigError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        if on_broken not in ON_BROKEN:
            raise ConfigError(f"on_broken must be one of {', '.join(ON_BROKEN)}, got "
                              f"{on_broken!r}")
        if not 0 < image_size <= resize_size:
            raise ConfigError(f"image size {image_size} must be positive and at most the resize "
                              f"size {resize_size}")
        self.root = Path(root)
        self.split_dir = check_data_root(self.root, split)
        files, labels, classes, ignored = scan_split(self.split_dir, class_names)
        if ignored:
            log.warning("ignored %d files without an image extension under %s, e.g. %s",
                        len(ignored), self.split_dir, ", ".join(ignored[:_IGNORED_EXAMPLES]))
        if subset is not None:
            chosen = strided_subset(len(files), subset)
            files, labels = files[chosen], labels[chosen]
        self.files = files
        self.labels = labels
        self.classes = classes
        self.num_classes = len(classes)
        self.ignored_count = len(ignored)
        self.train = train
        self.seed = seed
        self.image_size = image_size
        self.resize_size = resize_size
        self.on_broken = on_broken
        self.fast_decode = fast_decode
        self.normalize = normalize
        self._warned: set[str] = set()

    def __len__(self) -> int:
        return len(self.files)

    def path(self, index: int) -> Path:
        return self.split_dir / os.fsdecode(self.files[index])

    def crop_plan(self, index: int, epoch: int) -> tuple[BoxForSize, bool]:
        """(box for a width x height image, flip) of one example; see example_crop."""
        return example_crop(self.train, self.seed, epoch, index, self.image_size,
                            self.resize_size)

    def load_image(self, index: int, epoch: int) -> torch.Tensor:
        """One example as a 3 x image_size x image_size uint8 tensor (raises DECODE_ERRORS)."""
        box_for_size, flip = self.crop_plan(index, epoch)
        return decode_crop_planes(self.path(index), box_for_size, self.image_size,
                                  self.fast_decode, flip)

    def load_pixels(self, index: int, epoch: int) -> np.ndarray:
        """load_image as an image_size x image_size x 3 uint8 array (for inspection)."""
        return self.load_image(index, epoch).permute(1, 2, 0).numpy()

    def _broken(self, index: int, error: Exception) -> str:
        path = str(self.path(index))
        reason = f"{type(error).__name__}: {error}"
        if self.on_broken == "error":
            raise DataError(f"cannot read image {path}: {reason}; replace or delete the file, "
                            "or use on_broken=skip to skip broken images") from error
        if path not in self._warned:
            self._warned.add(path)
            log.warning("skipping unreadable image %s: %s", path, reason)
        return path

    def __getitems__(self, keys: list) -> Batch:
        return load_batch(keys, self.load_image, self._broken, self.labels, self.image_size,
                          self.normalize)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, int]:
        """One (image 3xSxS, label) pair; a bare index means epoch 0. A broken file raises
        DataError whatever on_broken says, since there is nothing to return."""
        batch = self.__getitems__([normalize_key(key)])
        if not len(batch):
            raise DataError(f"cannot read image {batch.skipped[0]} (see the warning above)")
        return batch.images[0], int(batch.labels[0])

