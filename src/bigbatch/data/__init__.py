"""Data sets, world-size-invariant batching and loaders.

Every data set is map-style and keyed by (example index, epoch); ``__getitems__`` returns a
:class:`Batch`. Data order and augmentation are functions of (seed, epoch, index) only
(so a run is the same at any world size).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from torch.utils.data import Dataset

from bigbatch.data.batch import Batch
from bigbatch.data.fashion_mnist import FashionMNIST, locate_fashion_mnist
from bigbatch.data.imagefolder import ImageFolderData
from bigbatch.data.loader import default_workers, make_loader
from bigbatch.data.pack import PackedImages, pack_imagefolder
from bigbatch.data.sampler import GlobalBatchPlan, TrainBatches, eval_batches, eval_shard
from bigbatch.data.synthetic import SyntheticImages
from bigbatch.data.transforms import eval_resize_size
from bigbatch.data.webdataset import (
    WebDatasetImages,
    label_count,
    refuse_unknown_classes,
    split_shards,
)
from bigbatch.errors import ConfigError, DataError

DATASETS = ("fashion-mnist", "imagefolder", "packed", "synthetic", "webdataset")
ON_BROKEN = ("skip", "error")
DEFAULT_IMAGE_SIZE = 224


def build_datasets(name: str, *, path: str | None, seed: int, image_size: int | None = None,
                   train_subset: int | None = None, val_subset: int | None = None,
                   on_broken: str = "skip",
                   synthetic_examples: int = 10000, synthetic_classes: int = 1000,
                   in_channels: int = 3, fast_decode: bool = True,
                   normalize: bool = True, val_path: str | None = None,
                   num_classes: int | None = None,
                   augment: bool = True) -> tuple[Dataset, Dataset]:
    """(training set, with augmentation unless ``augment`` is False; validation set, without)
    for data set ``name``.

    Args:
        name: one of DATASETS.
        path: data folder (required for imagefolder and packed, the latter written by
            bigbatch.data.pack.pack_imagefolder; optional for fashion-mnist, see
            locate_fashion_mnist; ignored for synthetic); for webdataset the training shards
            (a brace pattern, a folder of shards or a list file, see webdataset.shard_paths).
        seed: run seed for augmentation.
        image_size: output side; default 224 (imagefolder, synthetic); Fashion-MNIST is 28.
        train_subset: use only this many training examples (default all).
        val_subset: evaluate on only this many validation examples (default all).
        on_broken: "skip" or "error" for unreadable images (imagefolder).
        synthetic_examples / synthetic_classes / in_channels: shape of the synthetic set; its
            validation set has a tenth as many examples.
        fast_decode: JPEG draft-mode decoding (imagefolder, packed).
        normalize: False makes imagefolder, packed and webdataset return uint8 images, to be
            normalised on the device with bigbatch.data.transforms.normalize_images.
        val_path / num_classes: webdataset's validation shards (default: a folder's val-*.tar)
            and number of classes (default: the largest label of either split + 1).
        augment: augment the training set (Fashion-MNIST: 2-pixel crop + flip; folders and
            shards: Inception crop + flip); False prepares training images as validation
            images are. The synthetic set has no augmentation either way.
    """
    if on_broken not in ON_BROKEN:
        raise ConfigError(f"on_broken must be one of {', '.join(ON_BROKEN)}, got {on_broken!r}")
    subsets = Subsets(train_subset, val_subset)
    if name == "fashion-mnist":
        return _fashion_mnist(path, seed, image_size, subsets, augment)
    if name == "imagefolder":
        return _imagefolder(path, seed, image_size, subsets, on_broken, fast_decode, normalize,
                            augment)
    if name == "packed":
        return _packed(path, seed, image_size, subsets, on_broken, fast_decode, normalize,
                       augment)
    if name == "webdataset":
        return _webdataset(path, val_path, seed, image_size, subsets, num_classes,
                           on_broken, fast_decode, normalize, augment)
    if name == "synthetic":
        return _synthetic(seed, image_size, subsets, synthetic_examples, synthetic_classes,
                          in_channels)
    raise ConfigError(f"unknown data set {name!r}; choose one of {', '.join(DATASETS)}")


class Subsets(NamedTuple):
    """How many examples of each split to use (None: all)."""
    train: int | None
    val: int | None


def _fashion_mnist(path: str | None, seed: int, image_size: int | None,
                   subsets: Subsets, augment: bool) -> tuple[Dataset, Dataset]:
    if image_size not in (None, FashionMNIST.image_size):
        raise ConfigError(f"Fashion-MNIST images are {FashionMNIST.image_size}x"
                          f"{FashionMNIST.image_size}; set image_size to 28 or leave it unset")
    root = locate_fashion_mnist(path)
    return (FashionMNIST(root, train=True, seed=seed, subset=subsets.train, augment=augment),
            FashionMNIST(root, train=False, seed=seed, subset=subsets.val))


def _imagefolder(path: str | None, seed: int, image_size: int | None, subsets: Subsets,
                 on_broken: str, fast_decode: bool, normalize: bool,
                 augment: bool) -> tuple[Dataset, Dataset]:
    if path is None:
        raise ConfigError("the imagefolder data set needs a folder; pass --data DIR with "
                          "DIR/train/<class>/<images> and DIR/val/<class>/<images>")
    size = image_size or DEFAULT_IMAGE_SIZE
    resize = eval_resize_size(size)
    common = dict(seed=seed, image_size=size, resize_size=resize, on_broken=on_broken,
                  fast_decode=fast_decode, normalize=normalize)
    train = ImageFolderData(Path(path), "train", train=True, augment=augment,
                            subset=subsets.train, **common)
    val = ImageFolderData(Path(path), "val", train=False, class_names=train.classes,
                          subset=subsets.val, **common)
    return train, val


def _packed(path: str | None, seed: int, image_size: int | None, subsets: Subsets,
            on_broken: str, fast_decode: bool, normalize: bool,
            augment: bool) -> tuple[Dataset, Dataset]:
    if path is None:
        raise ConfigError("the packed data set needs a folder; pass --data DIR written by "
                          "bigbatch.data.pack.pack_imagefolder")
    size = image_size or DEFAULT_IMAGE_SIZE
    common = dict(seed=seed, image_size=size, on_broken=on_broken, fast_decode=fast_decode,
                  normalize=normalize)
    train = PackedImages(Path(path), "train", train=True, augment=augment,
                         subset=subsets.train, **common)
    val = PackedImages(Path(path), "val", train=False, subset=subsets.val, **common)
    if val.classes != train.classes:
        raise DataError(f"{path}/val was packed with other classes than {path}/train; pack "
                        "both splits together")
    return train, val


def _webdataset(path: str | None, val_path: str | None, seed: int, image_size: int | None,
                subsets: Subsets, num_classes: int | None, on_broken: str,
                fast_decode: bool, normalize: bool, augment: bool) -> tuple[Dataset, Dataset]:
    if path is None:
        raise ConfigError("the webdataset data set needs shards; pass --data "
                          "'PATH/train-{0000..0099}.tar', a folder of shards or a list file")
    train_shards, val_shards = split_shards(path, val_path)
    common = dict(seed=seed, image_size=image_size or DEFAULT_IMAGE_SIZE, on_broken=on_broken,
                  fast_decode=fast_decode, normalize=normalize)
    # Declared, or counted on both splits: a class that only the validation shards hold counts.
    classes = num_classes or max(label_count(train_shards), label_count(val_shards))
    train = WebDatasetImages(train_shards, train=True, augment=augment, subset=subsets.train,
                             num_classes=classes, **common)
    val = WebDatasetImages(val_shards, train=False, num_classes=classes, subset=subsets.val,
                           **common)
    refuse_unknown_classes(val)
    return train, val


def _synthetic(seed: int, image_size: int | None, subsets: Subsets, examples: int,
               classes: int, in_channels: int) -> tuple[Dataset, Dataset]:
    size = image_size or DEFAULT_IMAGE_SIZE
    count = min(examples, subsets.train) if subsets.train else examples
    val_count = max(1, examples // 10)
    val_count = min(val_count, subsets.val) if subsets.val else val_count
    train = SyntheticImages(count, classes, size, in_channels, seed)
    val = SyntheticImages(val_count, classes, size, in_channels, seed, first_index=examples)
    return train, val


__all__ = [
    "Batch",
    "DATASETS",
    "FashionMNIST",
    "GlobalBatchPlan",
    "ImageFolderData",
    "PackedImages",
    "SyntheticImages",
    "TrainBatches",
    "WebDatasetImages",
    "build_datasets",
    "default_workers",
    "eval_batches",
    "eval_shard",
    "locate_fashion_mnist",
    "make_loader",
    "pack_imagefolder",
]
