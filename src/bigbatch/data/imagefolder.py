"""ImageNet-style folders: root/train/<class>/<image> and root/val/<class>/<image>.

Decoding is libjpeg-turbo (torchvision.io) or PIL with JPEG draft mode (DCT scaling) when that
loses no output resolution, and crop + resize is one resampling of the crop box (data/decode.py).
Augmentation parameters are drawn from example_generator(seed, epoch, index), so an example's
crop does not depend on the worker, the batch or the number of processes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from bigbatch.data.base import IndexedImages
from bigbatch.errors import ConfigError, DataError

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".ppm", ".pgm", ".bmp", ".tif", ".tiff",
                              ".webp"})
SPLITS = ("train", "val")
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


def strided_subset(total: int, subset: int, train: bool) -> np.ndarray:
    """``subset`` indices spread evenly over a class-sorted list, so every class keeps examples.
    ``train`` says which split's flag the error names."""
    split = "train" if train else "val"
    if not 1 <= subset <= total:
        raise ConfigError(f"--{split}-subset {subset} is outside 1..{total}, the {split} "
                          "examples there; pick a smaller subset or none")
    return (np.arange(subset, dtype=np.int64) * total) // subset


class ImageFolderData(IndexedImages):
    """Map-style image folder keyed by (index, epoch); ``__getitems__`` returns a Batch.

    Args:
        root: folder with train/ and val/ sub-folders of class folders.
        split: "train" or "val".
        train: the training split (augmented unless ``augment`` says otherwise) if True.
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
        augment: Inception crop + flip if True, else resize + center crop (default: ``train``).
    """

    remedy = "replace or delete the file, or use on_broken=skip to skip broken images"

    def __init__(self, root: str | os.PathLike, split: str = "train", train: bool = True,
                 seed: int = 0, image_size: int = 224, resize_size: int = 256,
                 on_broken: str = "skip", class_names: list[str] | None = None,
                 fast_decode: bool = True, subset: int | None = None,
                 normalize: bool = True, augment: bool | None = None) -> None:
        if split not in SPLITS:
            raise ConfigError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        super().__init__(train=train, seed=seed, image_size=image_size, resize_size=resize_size,
                         on_broken=on_broken, fast_decode=fast_decode, normalize=normalize,
                         augment=augment)
        self.root = Path(root)
        self.split_dir = check_data_root(self.root, split)
        files, labels, classes, ignored = scan_split(self.split_dir, class_names)
        if ignored:
            log.warning("ignored %d files without an image extension under %s, e.g. %s",
                        len(ignored), self.split_dir, ", ".join(ignored[:_IGNORED_EXAMPLES]))
        if subset is not None:
            chosen = strided_subset(len(files), subset, train)
            files, labels = files[chosen], labels[chosen]
        self.files = files
        self.labels = labels
        self.classes = classes
        self.num_classes = len(classes)
        self.ignored_count = len(ignored)

    def path(self, index: int) -> Path:
        return self.split_dir / os.fsdecode(self.files[index])

    def describe(self, index: int) -> str:
        return str(self.path(index))

    def encoded(self, index: int) -> bytes:
        return self.path(index).read_bytes()
