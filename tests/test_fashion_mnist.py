"""Fashion-MNIST: location order, checksums, and augmentation as a function of (seed, epoch, i)."""

from __future__ import annotations

import gzip
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bigbatch.data import build_datasets
from bigbatch.data.fashion_mnist import (
    FILES,
    MEAN,
    STD,
    SYSTEM_DIR,
    FashionMNIST,
    locate_fashion_mnist,
)
from bigbatch.errors import ConfigError, DataError

needs_data = pytest.mark.fashion_mnist  # skipped or failed without the data: conftest.py


@pytest.fixture(scope="module")
def train_set() -> FashionMNIST:
    return FashionMNIST(SYSTEM_DIR, train=True, seed=4)


@pytest.fixture(scope="module")
def test_set() -> FashionMNIST:
    return FashionMNIST(SYSTEM_DIR, train=False, seed=4)


def pixels_of(images: torch.Tensor) -> np.ndarray:
    """Undo the normalisation: uint8 pixels."""
    return (images * STD + MEAN).mul(255).round().to(torch.uint8).numpy()


def shifted_and_flipped(image: np.ndarray) -> list[np.ndarray]:
    """All 50 images a 2-pixel padded crop + optional flip can produce from ``image``."""
    padded = np.pad(image, 2)
    crops = [padded[top:top + 28, left:left + 28] for top in range(5) for left in range(5)]
    return crops + [crop[:, ::-1] for crop in crops]


@needs_data
def test_shapes_labels_and_checksums(train_set: FashionMNIST, test_set: FashionMNIST) -> None:
    # Loading verified the IDX headers and the MD5 of every file's decompressed data.
    assert len(train_set) == 60000 and len(test_set) == 10000
    assert train_set.images.shape == (60000, 28, 28) and train_set.images.dtype == torch.uint8
    assert torch.equal(torch.bincount(train_set.labels), torch.full((10,), 6000))
    assert torch.equal(torch.bincount(test_set.labels), torch.full((10,), 1000))
    assert (train_set.num_classes, train_set.in_channels, train_set.image_size) == (10, 1, 28)
    assert train_set.classes[0] == "T-shirt/top" and len(train_set.classes) == 10


@needs_data
def test_eval_batch_is_the_normalised_image(test_set: FashionMNIST) -> None:
    batch = test_set.__getitems__([(3, 0), (9999, 5)])
    assert batch.images.shape == (2, 1, 28, 28) and batch.images.dtype == torch.float32
    assert batch.labels.dtype == torch.int64 and batch.skipped == []
    np.testing.assert_array_equal(pixels_of(batch.images[:, 0]),
                                  test_set.images[[3, 9999]].numpy())
    whole = test_set.__getitems__(list(range(2000))).images
    assert abs(whole.mean().item()) < 0.05 and abs(whole.std().item() - 1) < 0.05


@needs_data
def test_augmentation_does_not_depend_on_the_batch(train_set: FashionMNIST) -> None:
    rng = np.random.default_rng(0)
    indices = rng.choice(60000, size=512, replace=False)
    big = train_set.__getitems__([(int(i), 2) for i in indices])
    for n in (0, 17, 511):
        alone = train_set.__getitems__([(int(indices[n]), 2)])
        assert torch.equal(alone.images[0], big.images[n])
        assert alone.labels[0] == big.labels[n]
    # Mixed epochs in one batch: each example gets its own epoch's augmentation.
    mixed = train_set.__getitems__([(int(indices[0]), 2), (int(indices[1]), 3)])
    assert torch.equal(mixed.images[0], big.images[0])
    assert torch.equal(mixed.images[1], train_set.__getitems__([(int(indices[1]), 3)]).images[0])


@needs_data
def test_augmentation_is_a_crop_and_flip_that_changes_with_epoch(
        train_set: FashionMNIST) -> None:
    indices = list(range(200))
    epoch0 = pixels_of(train_set.__getitems__([(i, 0) for i in indices]).images[:, 0])
    epoch1 = pixels_of(train_set.__getitems__([(i, 1) for i in indices]).images[:, 0])
    assert np.mean([not np.array_equal(a, b) for a, b in zip(epoch0, epoch1, strict=True)]) > 0.8
    flips = 0
    for i in indices[:60]:
        original = train_set.images[i].numpy()
        candidates = shifted_and_flipped(original)
        matches = [k for k, c in enumerate(candidates) if np.array_equal(c, epoch0[i])]
        assert matches, f"example {i} is not a padded crop or flip of the original"
        flips += min(matches) >= 25
    assert 15 <= flips <= 45  # about half flipped
    reseeded = FashionMNIST(SYSTEM_DIR, train=True, seed=5, subset=200)
    other = pixels_of(reseeded.__getitems__([(i, 0) for i in indices]).images[:, 0])
    assert np.mean([not np.array_equal(a, b) for a, b in zip(epoch0, other, strict=True)]) > 0.8


@needs_data
def test_a_batch_of_4096_is_fast(train_set: FashionMNIST) -> None:
    keys = [(i, 1) for i in range(0, 60000, 14)][:4096]
    timings = []
    for _ in range(3):
        start = time.perf_counter()
        train_set.__getitems__(keys)
        timings.append(time.perf_counter() - start)
    assert sorted(timings)[1] < 0.25  # about 5 ms measured on one core; generous for CI noise


@needs_data
def test_subset_and_build_datasets() -> None:
    train, val = build_datasets("fashion-mnist", path=str(SYSTEM_DIR), seed=0, train_subset=500)
    assert len(train) == 500 and len(val) == 10000
    assert train.augment and not val.augment
    with pytest.raises(ConfigError, match="image_size to 28"):
        build_datasets("fashion-mnist", path=str(SYSTEM_DIR), seed=0, image_size=224)
    with pytest.raises(ConfigError, match="--train-subset 60001 is outside 1..60000 for "
                                          "Fashion-MNIST's training set"):
        FashionMNIST(SYSTEM_DIR, train=True, subset=60001)
    _, val = build_datasets("fashion-mnist", path=str(SYSTEM_DIR), seed=0, val_subset=300)
    full = FashionMNIST(SYSTEM_DIR, train=False)
    assert len(val) == 300 and torch.equal(val.labels, full.labels[:300])
    with pytest.raises(ConfigError, match="--val-subset 10001 is outside 1..10000 for "
                                          "Fashion-MNIST's test set"):
        build_datasets("fashion-mnist", path=str(SYSTEM_DIR), seed=0, val_subset=10001)


@needs_data
def test_training_set_without_augmentation_gives_the_images_as_they_are() -> None:
    train, _ = build_datasets("fashion-mnist", path=str(SYSTEM_DIR), seed=0, train_subset=64,
                              augment=False)
    assert train.train and not train.augment
    keys = [(index, epoch) for epoch in (0, 7) for index in (0, 5, 63)]
    pixels = pixels_of(train.__getitems__(keys).images[:, 0])
    np.testing.assert_array_equal(pixels, train.images[[0, 5, 63] * 2].numpy())
    augmented, _ = build_datasets("fashion-mnist", path=str(SYSTEM_DIR), seed=0, train_subset=64)
    moved = pixels_of(augmented.__getitems__(keys).images[:, 0])
    assert sum(not np.array_equal(a, b) for a, b in zip(moved, pixels, strict=True)) >= 3


def copy_test_split(source: Path, target: Path) -> None:
    """Copy the four files (only the test split is read, so the train files are links)."""
    target.mkdir()
    for spec in FILES.values():
        name = f"{spec.name}.gz"
        if spec.name.startswith("t10k"):
            shutil.copy(source / name, target / name)
        else:
            (target / name).symlink_to(source / name)


def flip_byte(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


@needs_data
def test_corrupted_gzip_fails_naming_the_file(tmp_path: Path) -> None:
    copy_test_split(SYSTEM_DIR, tmp_path / "copy")
    broken = tmp_path / "copy" / "t10k-labels-idx1-ubyte.gz"
    flip_byte(broken, broken.stat().st_size // 2)
    with pytest.raises(DataError, match=re.escape(str(broken))):
        FashionMNIST(tmp_path / "copy", train=False)


@needs_data
def test_corrupted_uncompressed_file_fails_naming_the_file(tmp_path: Path) -> None:
    copy_test_split(SYSTEM_DIR, tmp_path / "copy")
    packed = tmp_path / "copy" / "t10k-labels-idx1-ubyte.gz"
    raw = tmp_path / "copy" / "t10k-labels-idx1-ubyte"
    raw.write_bytes(gzip.decompress(packed.read_bytes()))
    packed.unlink()
    assert len(FashionMNIST(tmp_path / "copy", train=False)) == 10000  # uncompressed is fine
    flip_byte(raw, 5000)
    with pytest.raises(DataError, match=re.escape(f"checksum mismatch for {raw}")):
        FashionMNIST(tmp_path / "copy", train=False)
    raw.write_bytes(raw.read_bytes()[:-10])
    with pytest.raises(DataError, match=re.escape(f"{raw} has 9990 data bytes")):
        FashionMNIST(tmp_path / "copy", train=False)
    flip_byte(raw, 3)
    with pytest.raises(DataError, match=re.escape(f"{raw} has IDX header")):
        FashionMNIST(tmp_path / "copy", train=False)


def fake_folder(folder: Path) -> Path:
    """A folder with the four file names present (contents are not read by locate)."""
    folder.mkdir(parents=True)
    for spec in FILES.values():
        (folder / f"{spec.name}.gz").write_bytes(b"")
    return folder


def test_locate_prefers_path_then_environment(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    explicit = fake_folder(tmp_path / "explicit")
    from_env = fake_folder(tmp_path / "env")
    system = fake_folder(tmp_path / "system")
    monkeypatch.setenv("BIGBATCH_DATA", str(from_env))
    assert locate_fashion_mnist(str(explicit), system_dir=system) == explicit
    assert locate_fashion_mnist(None, system_dir=system) == from_env
    monkeypatch.setenv("BIGBATCH_DATA", str(tmp_path))  # a data root holding fashion-mnist/
    fake_folder(tmp_path / "fashion-mnist")
    assert locate_fashion_mnist(None, system_dir=system) == tmp_path / "fashion-mnist"
    monkeypatch.delenv("BIGBATCH_DATA")
    assert locate_fashion_mnist(None, system_dir=system) == system
    with pytest.raises(DataError, match="missing train-images-idx3-ubyte"):
        locate_fashion_mnist(str(tmp_path / "nothing"), system_dir=system)


def test_failed_download_lists_places_and_fixes(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BIGBATCH_DATA", str(tmp_path / "env"))
    with pytest.raises(DataError) as caught:
        # Port 9 (discard) on localhost refuses the connection at once: no network needed.
        locate_fashion_mnist(None, system_dir=tmp_path / "absent", cache_dir=tmp_path / "cache",
                             base_url="http://127.0.0.1:9/", timeout=5)
    message = str(caught.value)
    for expected in (str(tmp_path / "env"), str(tmp_path / "absent"), str(tmp_path / "cache"),
                     "http://127.0.0.1:9/", "apt-get install dataset-fashion-mnist", "--data"):
        assert expected in message
    assert not list((tmp_path / "cache").glob("*.gz"))
