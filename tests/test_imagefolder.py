"""Image folders: layout errors, broken files, every PIL mode to RGB, seeded augmentation."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from imagegen import FolderInfo, make_image_folder
from PIL import Image, ImageFile

from bigbatch.data import build_datasets, make_loader
from bigbatch.data.imagefolder import ImageFolderData
from bigbatch.data.sampler import GlobalBatchPlan, TrainBatches
from bigbatch.data.synthetic import SyntheticImages
from bigbatch.data.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    center_crop_box,
    draft_factor,
    random_resized_crop_box,
)
from bigbatch.errors import ConfigError, DataError
from bigbatch.geometry import BatchGeometry

SIZE = 64


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> FolderInfo:
    return make_image_folder(tmp_path_factory.mktemp("images"))


def train_set(info: FolderInfo, **options) -> ImageFolderData:
    settings = dict(seed=1, image_size=SIZE, resize_size=SIZE * 8 // 7)
    settings.update(options)
    return ImageFolderData(info.root, "train", train=settings.pop("train", True), **settings)


def all_keys(dataset: ImageFolderData, epoch: int = 0) -> list[tuple[int, int]]:
    return [(i, epoch) for i in range(len(dataset))]


def pixels_of(images: torch.Tensor) -> np.ndarray:
    """Undo the ImageNet normalisation: N x H x W x 3 floats on the 0..255 scale."""
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return ((images * std + mean) * 255).permute(0, 2, 3, 1).numpy()


def test_scan_is_sorted_and_ignores_other_extensions(folder: FolderInfo,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        dataset = train_set(folder)
    assert dataset.classes == ["cat", "dog", "fish"] and dataset.num_classes == 3
    assert len(dataset) == len(folder.train_good) + len(folder.train_broken) == 21
    paths = [dataset.path(i) for i in range(len(dataset))]
    assert paths == sorted(paths)
    assert dataset.ignored_count == 1
    assert "ignored 1 files" in caplog.text and "README.txt" in caplog.text
    assert [dataset.labels[paths.index(p)] for p in folder.train_good[:6]] == [0] * 6


def test_broken_files_are_skipped_and_reported(folder: FolderInfo,
                                               caplog: pytest.LogCaptureFixture) -> None:
    dataset = train_set(folder)
    with caplog.at_level(logging.WARNING):
        batch = dataset.__getitems__(all_keys(dataset))
    assert sorted(batch.skipped) == sorted(str(p) for p in folder.train_broken)
    assert batch.images.shape == (18, 3, SIZE, SIZE) and batch.images.dtype == torch.float32
    assert batch.labels.tolist() == [0] * 6 + [1] * 6 + [2] * 6
    assert torch.isfinite(batch.images).all()
    for path in folder.train_broken:
        assert str(path) in caplog.text


@pytest.mark.parametrize("fast_decode", [True, False])
def test_error_mode_names_the_broken_file(folder: FolderInfo, fast_decode: bool) -> None:
    dataset = train_set(folder, on_broken="error", fast_decode=fast_decode, train=False,
                        image_size=32, resize_size=36)
    paths = [dataset.path(i) for i in range(len(dataset))]
    for broken in folder.train_broken:
        key = (paths.index(broken), 0)
        with pytest.raises(DataError, match=f"^cannot read image {re.escape(str(broken))}: "):
            dataset.__getitems__([key])
    # The truncated JPEG fails even when draft mode decodes it at 1/8 scale.
    with Image.open(folder.train_broken[0]) as image:
        box = center_crop_box(*image.size, 32, 36)
    assert draft_factor(box, 32) == 8
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


def test_every_mode_loads_as_rgb(folder: FolderInfo) -> None:
    dataset = train_set(folder, train=False)
    paths = [dataset.path(i) for i in range(len(dataset))]
    modes = {}
    for path in folder.train_good[:6]:
        with Image.open(path) as image:
            modes[(image.format, image.mode)] = paths.index(path)
    assert set(modes) == {("JPEG", "RGB"), ("JPEG", "L"), ("JPEG", "CMYK"), ("PNG", "P"),
                          ("PNG", "RGBA")}
    batch = dataset.__getitems__([(i, 0) for i in modes.values()])
    assert batch.images.shape == (5, 3, SIZE, SIZE) and not batch.skipped
    pixels = pixels_of(batch.images)
    gray = pixels[list(modes).index(("JPEG", "L"))]
    np.testing.assert_allclose(gray[..., 0], gray[..., 1], atol=1e-3)
    np.testing.assert_allclose(gray[..., 0], gray[..., 2], atol=1e-3)
    assert pixels.min() > -0.5 and pixels.max() < 255.5
    assert all(pixels[k].std() > 10 for k in range(5))  # real content, not a blank fill


def test_augmentation_is_a_function_of_seed_epoch_index(folder: FolderInfo) -> None:
    dataset = train_set(folder)
    good = [i for i in range(len(dataset)) if dataset.path(i) in set(folder.train_good)]
    forward = dataset.__getitems__([(i, 3) for i in good]).images
    backward = train_set(folder).__getitems__([(i, 3) for i in reversed(good)]).images
    assert torch.equal(forward, backward.flip(0))
    alone = dataset.__getitems__([(good[4], 3)]).images[0]
    assert torch.equal(alone, forward[4])
    next_epoch = dataset.__getitems__([(i, 4) for i in good]).images
    other_seed = train_set(folder, seed=2).__getitems__([(i, 3) for i in good]).images
    for other in (next_epoch, other_seed):
        differs = [(a - b).abs().mean() > 0.05 for a, b in zip(forward, other, strict=True)]
        assert sum(differs) >= len(good) - 2
    evaluation = train_set(folder, train=False)
    assert torch.equal(evaluation.__getitems__([(good[0], 0)]).images,
                       evaluation.__getitems__([(good[0], 9)]).images)


def test_fast_decode_gives_the_same_crop(folder: FolderInfo) -> None:
    reduced = 0
    for train in (True, False):
        fast = train_set(folder, train=train, image_size=48, resize_size=55)
        slow = train_set(folder, train=train, image_size=48, resize_size=55, fast_decode=False)
        for index in range(len(fast)):
            if fast.path(index) not in set(folder.train_good):
                continue
            a = fast.load_pixels(index, 2).astype(np.float64)
            b = slow.load_pixels(index, 2).astype(np.float64)
            assert np.abs(a - b).mean() < 4.0, fast.path(index)  # resampling differences only
            if train:  # a different crop of the same image differs far more
                assert np.abs(a - slow.load_pixels(index, 3)).mean() > 8.0
            with Image.open(fast.path(index)) as image:
                box = fast.crop_plan(index, 2)[0](*image.size)
                reduced += image.format == "JPEG" and draft_factor(box, 48) > 1
    assert reduced >= 6  # draft mode was exercised


def test_crop_box_sampling() -> None:
    rng = np.random.default_rng(0)
    fractions, ratios = [], []
    for _ in range(2000):
        box = random_resized_crop_box(500, 375, rng.random((10, 4)))
        assert 0 <= box.left and box.left + box.width <= 500
        assert 0 <= box.top and box.top + box.height <= 375
        fractions.append(box.width * box.height / (500 * 375))
        ratios.append(box.width / box.height)
    assert 0.075 < min(fractions) and max(fractions) <= 1.0
    assert 0.74 < min(ratios) and max(ratios) < 1.35
    # Accepted areas are uniform in [0.08, 1] minus the ones that do not fit: mean about 0.5.
    assert 0.42 < np.mean(fractions) < 0.56
    # No attempt fits a 1000 x 10 strip: the fallback is the central crop at ratio 4/3.
    strip = random_resized_crop_box(1000, 10, rng.random((10, 4)))
    assert (strip.width, strip.height, strip.left, strip.top) == (13, 10, 493, 0)
    center = center_crop_box(500, 375, 224, 256)
    assert center.width == center.height == pytest.approx(328.125)
    assert center.left == pytest.approx((500 - 328.125) / 2)


@pytest.mark.parametrize("damage,message", [
    ("no_root", "data folder {root} does not exist"),
    ("no_val", "no val/ folder in {root}; expected {root}/val/<class>/<images>"),
    ("empty_class", "class folder {root}/train/empty has no images"),
    ("extra_val_class", "class 'zebra' in {root}/val is not among the training classes"),
    ("no_classes", "no class folders in {root}/train"),
])
def test_layout_errors(tmp_path: Path, damage: str, message: str) -> None:
    root = tmp_path / "data"
    make_image_folder(root, per_class=1, val_per_class=1, broken=False)
    if damage == "no_root":
        root = tmp_path / "missing"
    elif damage == "no_val":
        shutil.rmtree(root / "val")
    elif damage == "empty_class":
        (root / "train" / "empty").mkdir()
        (root / "train" / "empty" / "notes.txt").write_text("no images here")
    elif damage == "extra_val_class":
        shutil.copytree(root / "val" / "cat", root / "val" / "zebra")
    elif damage == "no_classes":
        for child in (root / "train").iterdir():
            shutil.rmtree(child)
    with pytest.raises(DataError, match="^" + re.escape(message.format(root=root))):
        build_datasets("imagefolder", path=str(root), seed=0, image_size=32)


def test_build_datasets_imagefolder(folder: FolderInfo) -> None:
    train, val = build_datasets("imagefolder", path=str(folder.root), seed=0, image_size=32,
                                train_subset=9)
    assert len(train) == 9 and sorted(set(train.labels.tolist())) == [0, 1, 2]
    assert val.classes == train.classes and len(val) == 6 and not val.train
    assert val.resize_size == 37 and val.image_size == 32
    _, val = build_datasets("imagefolder", path=str(folder.root), seed=0, image_size=32,
                            val_subset=3)
    assert len(val) == 3 and sorted(val.labels.tolist()) == [0, 1, 2]  # one of each class
    with pytest.raises(ConfigError, match="needs a folder"):
        build_datasets("imagefolder", path=None, seed=0)
    choices = "choose one of fashion-mnist, imagefolder, packed, synthetic"
    with pytest.raises(ConfigError, match=choices):
        build_datasets("cifar", path=None, seed=0)
    with pytest.raises(ConfigError, match="on_broken must be one of skip, error"):
        build_datasets("imagefolder", path=str(folder.root), seed=0, on_broken="ignore")


def test_training_set_without_augmentation_is_prepared_as_validation(folder: FolderInfo) -> None:
    train, _ = build_datasets("imagefolder", path=str(folder.root), seed=0, image_size=32,
                              augment=False)
    assert train.train and not train.augment
    center = ImageFolderData(folder.root, "train", train=False, seed=0, image_size=32,
                             resize_size=train.resize_size)
    good = [i for i in range(len(train)) if train.path(i) in set(folder.train_good)][:6]
    for epoch in (0, 5):
        keys = [(index, epoch) for index in good]
        assert torch.equal(train.__getitems__(keys).images, center.__getitems__(keys).images)
    augmented, _ = build_datasets("imagefolder", path=str(folder.root), seed=0, image_size=32)
    keys = [(index, 5) for index in good]
    assert not torch.equal(augmented.__getitems__(keys).images, center.__getitems__(keys).images)


def test_loader_with_a_worker_gives_the_direct_batches(folder: FolderInfo) -> None:
    dataset = train_set(folder)
    plan = GlobalBatchPlan(BatchGeometry(8, 4, num_examples=len(dataset)), seed=3)
    batches = TrainBatches(plan, 0, 0, epochs=2)
    loader = make_loader(dataset, batches, workers=1)
    assert len(loader) == 2 * 2 * 2
    loaded = list(loader)
    direct = [dataset.__getitems__(keys) for keys in batches]
    assert len(loaded) == len(direct) == 8
    for got, want in zip(loaded, direct, strict=True):
        assert torch.equal(got.images, want.images) and torch.equal(got.labels, want.labels)
        assert got.skipped == want.skipped
    assert any(batch.skipped for batch in loaded)  # the broken files showed up somewhere


def test_synthetic_images_are_deterministic() -> None:
    train, val = build_datasets("synthetic", path=None, seed=3, image_size=16,
                                synthetic_examples=100, synthetic_classes=10)
    assert isinstance(train, SyntheticImages) and len(train) == 100 and len(val) == 10
    _, fewer = build_datasets("synthetic", path=None, seed=3, image_size=16,
                              synthetic_examples=100, synthetic_classes=10, val_subset=4)
    assert len(fewer) == 4 and torch.equal(fewer.__getitems__([(0, 0)]).images,
                                           val.__getitems__([(0, 0)]).images)  # the first 4
    batch = train.__getitems__([(i, 0) for i in range(100)])
    assert batch.images.shape == (100, 3, 16, 16) and batch.labels.max() < 10
    assert len(set(batch.labels.tolist())) == 10
    again = SyntheticImages(100, 10, 16, seed=3).__getitems__([(7, 5)])
    assert torch.equal(again.images[0], batch.images[7]) and again.labels[0] == batch.labels[7]
    same_label = [i for i in range(100) if batch.labels[i] == batch.labels[0]]
    assert torch.equal(batch.images[same_label[-1]], batch.images[0])  # learnable: image = label
    other_seed = SyntheticImages(100, 10, 16, seed=4).__getitems__([(i, 0) for i in range(100)])
    assert not torch.equal(other_seed.labels, batch.labels)
