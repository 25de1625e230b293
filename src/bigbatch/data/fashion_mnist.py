"""Fashion-MNIST (Xiao, Rasul & Vollgraf 2017): 28x28 grayscale, 10 classes, 60000/10000 images.

The whole set lives in memory as uint8 (55 MB) and training augmentation (2-pixel zero-padded
random crop + horizontal flip) runs vectorised over a batch, with each example's choices drawn
from (seed, epoch, index) so that they do not depend on the batch it lands in.

Checksums: the Debian package dataset-fashion-mnist ships the official files re-gzipped without
the original file name in the gzip header, so the .gz MD5s differ from the official ones while the
decompressed IDX bytes are identical. We therefore verify the MD5 of the decompressed IDX payload
(the values torchvision and others publish as the "raw" checksums), which accepts any correct
copy, compressed or not; downloads are additionally checked against the official .gz MD5s.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from bigbatch.data.batch import Batch, keys_array
from bigbatch.data.seeding import example_uniforms
from bigbatch.errors import ConfigError, DataError

log = logging.getLogger(__name__)

CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Ankle boot"]
MEAN = 0.2860
STD = 0.3530
IMAGE_SIZE = 28
PADDING = 2

ENV_VAR = "BIGBATCH_DATA"
SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian package dataset-fashion-mnist
OFFICIAL_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"

_IMAGES_MAGIC = 0x00000803  # IDX: unsigned byte, 3 dimensions
_LABELS_MAGIC = 0x00000801  # IDX: unsigned byte, 1 dimension


@dataclass(frozen=True)
class IdxFile:
    """One of the four files: its name, expected shape and checksums."""

    name: str
    shape: tuple[int, ...]
    payload_md5: str  # MD5 of the decompressed IDX bytes
    official_gz_md5: str  # MD5 of the .gz served by the official site


FILES = {
    "train-images": IdxFile("train-images-idx3-ubyte", (60000, 28, 28),
                            "f4a8712d7a061bf5bd6d2ca38dc4d50a", "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
    "train-labels": IdxFile("train-labels-idx1-ubyte", (60000,),
                            "9018921c3c673c538a1fc5bad174d6f9", "25c81989df183df01b3e8a0aad5dffbe"),
    "test-images": IdxFile("t10k-images-idx3-ubyte", (10000, 28, 28),
                           "8181f5470baa50b63fa0f6fddb340f0a", "bef4ecab320f06d8554ea6380940ec79"),
    "test-labels": IdxFile("t10k-labels-idx1-ubyte", (10000,),
                           "15d484375f8d13e6eb1aabb0c3f46965", "bb300cfdad3c16e7a12a480ee83cd310"),
}


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "bigbatch" / "fashion-mnist"


def find_idx_file(folder: Path, spec: IdxFile) -> Path | None:
    """The uncompressed file if present (no decompression needed), else the .gz, else None."""
    for candidate in (folder / spec.name, folder / f"{spec.name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def has_fashion_mnist(folder: Path) -> bool:
    return all(find_idx_file(folder, spec) is not None for spec in FILES.values())


def locate_fashion_mnist(path: str | os.PathLike | None = None, *,
                         system_dir: Path = SYSTEM_DIR, cache_dir: Path | None = None,
                         base_url: str = OFFICIAL_URL, timeout: float = 30.0) -> Path:
    """The folder holding the four Fashion-MNIST IDX files (.gz or uncompressed).

    Looks, in order, at: ``path`` (if given it must hold the files), $BIGBATCH_DATA (the folder
    itself or its fashion-mnist/ subfolder), ``system_dir`` (Debian's dataset-fashion-mnist),
    the download cache (~/.cache/bigbatch/fashion-mnist); then downloads the official files into
    the cache. Raises DataError listing the places tried when nothing works.
    """
    if path is not None:
        folder = Path(path).expanduser()
        if not has_fashion_mnist(folder):
            missing = [s.name for s in FILES.values() if find_idx_file(folder, s) is None]
            raise DataError(f"no Fashion-MNIST in {folder}: missing {', '.join(missing)} "
                            "(.gz or uncompressed); point --data at the folder holding all four")
        return folder
    tried: list[str] = []
    env_value = os.environ.get(ENV_VAR)
    if env_value:
        for folder in (Path(env_value), Path(env_value) / "fashion-mnist"):
            tried.append(f"{folder} (${ENV_VAR})")
            if has_fashion_mnist(folder):
                return folder
    cache = cache_dir if cache_dir is not None else default_cache_dir()
    for folder, why in ((system_dir, "package dataset-fashion-mnist"), (cache, "cache")):
        tried.append(f"{folder} ({why})")
        if has_fashion_mnist(folder):
            return folder
    try:
        download_fashion_mnist(cache, base_url, timeout)
    except (OSError, urllib.error.URLError, DataError) as error:
        raise DataError(
            f"Fashion-MNIST not found (looked in {'; '.join(tried)}) and the download from "
            f"{base_url} failed ({error}); install it with `apt-get install "
            "dataset-fashion-mnist` or pass --data DIR with the four IDX files") from error
    return cache


def download_fashion_mnist(cache: Path, base_url: str, timeout: float) -> None:
    """Fetch the official .gz files into ``cache``, each checked and renamed into place."""
    cache.mkdir(parents=True, exist_ok=True)
    for spec in FILES.values():
        target = cache / f"{spec.name}.gz"
        if target.is_file():
            continue
        partial = target.with_name(target.name + ".part")
        url = f"{base_url}{spec.name}.gz"
        log.info("downloading %s", url)
        with urllib.request.urlopen(url, timeout=timeout) as response:
            data = response.read()
        digest = hashlib.md5(data).hexdigest()
        if digest != spec.official_gz_md5:
            raise DataError(f"download of {url} has MD5 {digest}, expected {spec.official_gz_md5}")
        partial.write_bytes(data)
        os.replace(partial, target)


def read_idx(path: Path, spec: IdxFile) -> np.ndarray:
    """Parse one IDX file (.gz or not), checking its header, size and payload MD5."""
    try:
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as error:
        raise DataError(f"cannot read {path}: {error}; the file is corrupt, replace it with the "
                        "official one") from error
    magic = _IMAGES_MAGIC if len(spec.shape) == 3 else _LABELS_MAGIC
    header_size = 4 + 4 * len(spec.shape)
    if len(data) < header_size:
        raise DataError(f"{path} is too short for an IDX file ({len(data)} bytes)")
    found_magic = int.from_bytes(data[:4], "big")
    shape = tuple(int.from_bytes(data[4 + 4 * d:8 + 4 * d], "big") for d in range(len(spec.shape)))
    if found_magic != magic or shape != spec.shape:
        raise DataError(f"{path} has IDX header {found_magic:#010x} {shape}, expected "
                        f"{magic:#010x} {spec.shape}; is it the right Fashion-MNIST file?")
    if len(data) != header_size + int(np.prod(spec.shape)):
        raise DataError(f"{path} has {len(data) - header_size} data bytes, expected "
                        f"{int(np.prod(spec.shape))}; the file is truncated or padded")
    digest = hashlib.md5(data).hexdigest()
    if digest != spec.payload_md5:
        raise DataError(f"checksum mismatch for {path}: MD5 of its IDX data is {digest}, "
                        f"expected {spec.payload_md5}; the file is corrupt, replace it with the "
                        "official one")
    return np.frombuffer(data, dtype=np.uint8, offset=header_size).reshape(spec.shape).copy()


def load_split(root: Path, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images (N, 28, 28) and int64 labels (N,) of the training or test split."""
    prefix = "train" if train else "test"
    arrays = []
    for kind in ("images", "labels"):
        spec = FILES[f"{prefix}-{kind}"]
        path = find_idx_file(root, spec)
        if path is None:
            raise DataError(f"{spec.name}[.gz] is missing from {root}")
        arrays.append(read_idx(path, spec))
    images, labels = arrays
    if labels.max() >= len(CLASSES):
        raise DataError(f"labels in {root} go up to {labels.max()}, expected 0..9")
    return torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))


def padded_images(images: torch.Tensor) -> np.ndarray:
    """The images with a PADDING-pixel zero border, (N, 32, 32), made once so that each
    augmented batch is a single gather from a sliding-window view."""
    size = images.shape[-1]
    padded = np.zeros((images.shape[0], size + 2 * PADDING, size + 2 * PADDING), dtype=np.uint8)
    padded[:, PADDING:PADDING + size, PADDING:PADDING + size] = images.numpy()
    return padded


def augmented_pixels(padded: np.ndarray, seed: int, epochs: np.ndarray,
                     indices: np.ndarray) -> np.ndarray:
    """Random crop of the zero-padded images, then horizontal flip, vectorised over a batch.

    Example n's offsets and flip come from example_uniforms(seed, epochs[n], indices[n]) only.
    Returns uint8 (N, 28, 28).
    """
    size = padded.shape[-1] - 2 * PADDING
    uniforms = np.empty((len(indices), 3))
    for epoch in np.unique(epochs):
        chosen = epochs == epoch
        uniforms[chosen] = example_uniforms(seed, int(epoch), indices[chosen], 3)
    positions = 2 * PADDING + 1
    left = np.minimum((uniforms[:, 1] * positions).astype(np.int64), positions - 1)
    top = np.minimum((uniforms[:, 2] * positions).astype(np.int64), positions - 1)
    # windows[i, y, x] is the crop of image i at (top y, left x): a view, nothing copied yet.
    windows = np.lib.stride_tricks.sliding_window_view(padded, (size, size), axis=(1, 2))
    crops = windows[indices, top, left]
    flipped = np.flatnonzero(uniforms[:, 0] < 0.5)
    crops[flipped] = crops[flipped, :, ::-1]
    return crops


class FashionMNIST(Dataset):
    """Map-style Fashion-MNIST keyed by (index, epoch); ``__getitems__`` returns a Batch.

    Args:
        root: folder from locate_fashion_mnist.
        train: training split (60000) if True, test split (10000) if False.
        seed: run seed for augmentation.
        subset: use only the first ``subset`` examples (default: all).
        augment: apply crop + flip; defaults to ``train``.
    """

    num_classes = len(CLASSES)
    in_channels = 1
    image_size = IMAGE_SIZE
    classes = CLASSES

    def __init__(self, root: str | os.PathLike, train: bool, seed: int = 0,
                 subset: int | None = None, augment: bool | None = None) -> None:
        images, labels = load_split(Path(root), train)
        if subset is not None:
            if not 1 <= subset <= len(labels):
                flag, split = ("train", "training") if train else ("val", "test")
                raise ConfigError(f"--{flag}-subset {subset} is outside 1..{len(labels)} for "
                                  f"Fashion-MNIST's {split} set; pick a smaller subset or none")
            images, labels = images[:subset].clone(), labels[:subset].clone()
        self.images = images
        self.labels = labels
        self.train = train
        self.augment = train if augment is None else augment
        self.seed = seed
        self._padded = padded_images(images) if self.augment else None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __getitems__(self, keys: list) -> Batch:
        pairs = keys_array(keys)
        indices, epochs = pairs[:, 0], pairs[:, 1]
        index_tensor = torch.from_numpy(indices)
        if self._padded is not None:
            pixels = torch.from_numpy(augmented_pixels(self._padded, self.seed, epochs, indices))
        else:
            pixels = self.images.index_select(0, index_tensor)
        images = pixels.unsqueeze(1).float().mul_(1.0 / (255.0 * STD)).sub_(MEAN / STD)
        return Batch(images, self.labels.index_select(0, index_tensor), [])

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, int]:
        """One (image 1x28x28, label) pair; a bare index means epoch 0."""
        batch = self.__getitems__([key])
        return batch.images[0], int(batch.labels[0])
