"""Packed image folders: written atomically, read back with the same augmentation contract."""

from __future__ import annotations

import json
import logging
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from imagegen import FolderInfo, make_image_folder

from bigbatch.data import build_datasets, decode
from bigbatch.data.imagefolder import ImageFolderData
from bigbatch.data.pack import PackedImages, pack_imagefolder, shrunk_size
from bigbatch.data.transforms import normalize_images
from bigbatch.errors import ConfigError, DataError

SIZE = 64
RESIZE = 73


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> FolderInfo:
    """A folder without broken files, so packed and unpacked indices coincide."""
    return make_image_folder(tmp_path_factory.mktemp("clean"), broken=False)


@pytest.fixture(scope="module", params=["jpeg", "raw"])
def packed(request: pytest.FixtureRequest, clean: FolderInfo,
           tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp(f"packed-{request.param}")
    pack_imagefolder(clean.root, target, encoding=request.param, workers=1,
                     shard_bytes=100_000)
    return target


def test_shrunk_size_keeps_aspect_and_small_images() -> None:
    assert shrunk_size(500, 375, 256) == (341, 256)
    assert shrunk_size(375, 500, 256) == (256, 341)
    assert shrunk_size(120, 90, 256) == (120, 90)


def test_pack_writes_shards_and_index(packed: Path, clean: FolderInfo) -> None:
    train = PackedImages(packed, "train", train=False, image_size=SIZE)
    val = PackedImages(packed, "val", train=False, image_size=SIZE)
    assert len(train) == len(clean.train_good) == 18 and len(val) == 6
    assert train.classes == val.classes == ["cat", "dog", "fish"]
    assert train.labels.tolist() == [0] * 6 + [1] * 6 + [2] * 6
    assert len(list((packed / "train").glob("shard-*.bin"))) > 1  # 100 kB shards
    assert not [p for p in packed.iterdir() if p.name.startswith(".")]  # no partial folders
    assert min(train.index.height.min(), train.index.width.min()) > 0
    assert max(np.minimum(train.index.height, train.index.width)) <= 256
    assert train.source(0) == "cat/cat_000.JPEG"


def unpacked(clean: FolderInfo, split: str, train: bool) -> ImageFolderData:
    return ImageFolderData(clean.root, split, train=train, seed=5, image_size=SIZE,
                           resize_size=RESIZE)


@pytest.mark.parametrize("split,train", [("val", False), ("train", False), ("train", True)])
def test_packed_crops_match_the_image_folder(packed: Path, clean: FolderInfo, split: str,
                                             train: bool) -> None:
    reference = unpacked(clean, split, train)
    dataset = PackedImages(packed, split, train=train, seed=5, image_size=SIZE,
                           resize_size=RESIZE)
    keys = [(i, 3) for i in range(len(dataset))]
    ours, theirs = dataset.__getitems__(keys), reference.__getitems__(keys)
    assert ours.images.shape == theirs.images.shape == (len(keys), 3, SIZE, SIZE)
    assert ours.labels.tolist() == theirs.labels.tolist()
    # Per-image mean absolute difference in normalised units (1 unit is about 57 grey levels):
    # re-encoding (worst: a 64x48 CMYK JPEG re-encoded as RGB) and pre-resizing (crop box
    # rounding) only; a different crop of the same image differs by 0.2 or more.
    differences = (ours.images - theirs.images).abs().mean(dim=(1, 2, 3))
    assert differences.median() < 0.04 and differences.max() < 0.2, differences
    if train:
        other_epoch = reference.__getitems__([(i, 4) for i in range(len(dataset))])
        assert (ours.images - other_epoch.images).abs().mean(dim=(1, 2, 3)).median() > 0.2


def test_packed_augmentation_depends_only_on_seed_epoch_index(packed: Path) -> None:
    dataset = PackedImages(packed, "train", train=True, seed=2, image_size=SIZE)
    batch = dataset.__getitems__([(i, 1) for i in range(len(dataset))]).images
    alone = PackedImages(packed, "train", train=True, seed=2, image_size=SIZE)
    assert (alone.__getitems__([(7, 1)]).images[0] == batch[7]).all()
    assert not (dataset.__getitems__([(7, 2)]).images[0] == batch[7]).all()


def test_dataset_pickles_without_its_memory_maps(packed: Path) -> None:
    dataset = PackedImages(packed, "train", train=False, image_size=SIZE)
    first = dataset.__getitems__([(0, 0)]).images
    assert dataset.shards._maps  # opened on use
    clone = pickle.loads(pickle.dumps(dataset))
    assert not clone.shards._maps
    assert (clone.__getitems__([(0, 0)]).images == first).all()


def test_broken_sources_are_skipped_or_fail(tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    info = make_image_folder(tmp_path / "src", per_class=2, val_per_class=1)
    with caplog.at_level(logging.WARNING):
        summary = pack_imagefolder(info.root, tmp_path / "skip", workers=2)
    assert sorted(summary.skipped["train"]) == sorted(str(p) for p in info.train_broken)
    assert summary.images == {"train": 6, "val": 3}
    assert str(info.train_broken[0]) in caplog.text
    with pytest.raises(DataError, match="^cannot read image .*(empty|text|truncated).JPEG"):
        pack_imagefolder(info.root, tmp_path / "strict", on_broken="error", workers=1)
    # Nothing half-written is left behind.
    assert list((tmp_path / "strict").iterdir()) == []


def test_existing_output_needs_overwrite(tmp_path: Path) -> None:
    info = make_image_folder(tmp_path / "src", per_class=1, val_per_class=1, broken=False)
    pack_imagefolder(info.root, tmp_path / "out", workers=1)
    with pytest.raises(DataError, match="already exists; delete it or pack with overwrite=True"):
        pack_imagefolder(info.root, tmp_path / "out", workers=1)
    summary = pack_imagefolder(info.root, tmp_path / "out", workers=1, encoding="raw",
                               overwrite=True)
    assert PackedImages(tmp_path / "out", "train").encoding == "raw"
    assert summary.images["train"] == 3
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["train", "val"]


def test_damaged_packs_give_clear_errors(tmp_path: Path) -> None:
    info = make_image_folder(tmp_path / "src", per_class=2, val_per_class=1, broken=False)
    pack_imagefolder(info.root, tmp_path / "out", workers=1)
    shard = tmp_path / "out" / "train" / "shard-00000.bin"
    dataset = PackedImages(tmp_path / "out", "train", train=False, image_size=SIZE)
    start, size = int(dataset.index.offset[1]), int(dataset.index.size[1])
    data = bytearray(shard.read_bytes())
    data[start:start + size] = bytes(size)  # record 1 zeroed
    shard.write_bytes(bytes(data))
    skipping = PackedImages(tmp_path / "out", "train", train=False, image_size=SIZE)
    batch = skipping.__getitems__([(0, 0), (1, 0), (2, 0)])
    assert len(batch) == 2 and len(batch.skipped) == 1 and "cat_001.JPEG" in batch.skipped[0]
    strict = PackedImages(tmp_path / "out", "train", train=False, on_broken="error")
    with pytest.raises(DataError, match="cannot read packed image .*cat_001.JPEG"):
        strict.__getitems__([(1, 0)])
    shard.write_bytes(bytes(data[:start]))
    with pytest.raises(DataError, match=re.escape(f"{shard} is missing or truncated")):
        PackedImages(tmp_path / "out", "train")
    with pytest.raises(DataError, match="no index.npz in"):
        PackedImages(tmp_path / "out", "test")


def test_build_datasets_packed(packed: Path) -> None:
    train, val = build_datasets("packed", path=str(packed), seed=0, image_size=32,
                                train_subset=9)
    assert len(train) == 9 and sorted(set(train.labels.tolist())) == [0, 1, 2]
    assert train.train and not val.train and val.resize_size == 37
    _, val = build_datasets("packed", path=str(packed), seed=0, image_size=32, val_subset=3)
    assert len(val) == 3 and sorted(val.labels.tolist()) == [0, 1, 2]
    with pytest.raises(ConfigError, match="--val-subset 7 is outside 1..6, the val examples"):
        build_datasets("packed", path=str(packed), seed=0, image_size=32, val_subset=7)
    with pytest.raises(ConfigError, match="needs a folder"):
        build_datasets("packed", path=None, seed=0)
    with pytest.raises(ConfigError, match="encoding must be one of jpeg, raw"):
        pack_imagefolder(packed, packed / "x", encoding="png")


def test_uint8_output_normalised_on_device_matches(packed: Path, clean: FolderInfo) -> None:
    keys = [(i, 2) for i in range(6)]
    for make in (lambda **kw: PackedImages(packed, "train", seed=1, image_size=SIZE, **kw),
                 lambda **kw: ImageFolderData(clean.root, "train", seed=1, image_size=SIZE,
                                              **kw)):
        floats = make().__getitems__(keys).images
        raw = make(normalize=False).__getitems__(keys).images
        assert raw.dtype == torch.uint8 and raw.shape == floats.shape
        torch.testing.assert_close(normalize_images(raw), floats, atol=1e-5, rtol=0)
        assert normalize_images(floats) is floats


def test_packed_jpeg_training_crops_take_the_tensor_decode_route(
        tmp_path: Path, clean: FolderInfo, monkeypatch: pytest.MonkeyPatch) -> None:
    """Training crops of packed JPEGs are decoded like the image folder's (data/decode.py route
    1: libjpeg-turbo into a tensor, torch resize), not through PIL."""
    if decode.turbo_decoder() is None:
        pytest.skip("this torchvision has no JPEG decoder")
    # stored at most 73 pixels high: no crop is big enough for PIL's reduced-scale decoding
    pack_imagefolder(clean.root, tmp_path / "out", encoding="jpeg", workers=1,
                     short_side=RESIZE)
    dataset = PackedImages(tmp_path / "out", "train", train=True, seed=5, image_size=SIZE)
    calls = []
    real = decode.turbo_crop

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(decode, "turbo_crop", counting)
    batch = dataset.__getitems__([(i, 0) for i in range(len(dataset))])
    assert len(batch) == len(dataset) and not batch.skipped
    # every stored image is a 3-component JPEG (packing converts to RGB) and every training
    # box lies on whole pixels
    assert len(calls) == len(dataset)


def rewrite_index(folder: Path, change) -> None:
    """Rewrite ``folder``'s index.npz with ``change(arrays)`` applied to its arrays."""
    with np.load(folder / "index.npz", allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    change(arrays)
    with open(folder / "index.npz", "wb") as handle:
        np.savez(handle, **arrays)


def set_meta(arrays: dict, **values) -> None:
    arrays["meta"] = np.array(json.dumps({**json.loads(str(arrays["meta"])), **values}))


@pytest.fixture
def small_pack(tmp_path: Path) -> Path:
    info = make_image_folder(tmp_path / "src", per_class=2, val_per_class=1, broken=False)
    pack_imagefolder(info.root, tmp_path / "out", workers=1, encoding="raw")
    return tmp_path / "out"


@pytest.mark.parametrize("damage, words", [
    (lambda index: index.write_bytes(index.read_bytes()[:200]), r"cannot read .*index.npz \("),
    (lambda index: index.write_bytes(b""), r"cannot read .*index.npz \("),
    (lambda index: rewrite_index(index.parent, lambda a: a.pop("label")), "lacks label"),
    (lambda index: rewrite_index(index.parent, lambda a: a.pop("meta")), r"\(no metadata\)"),
    (lambda index: rewrite_index(index.parent, lambda a: a.update(size=a["size"][:-1])),
     "columns of unequal length"),
])
def test_damaged_index_is_a_data_error_naming_the_file(small_pack: Path, damage, words) -> None:
    index = small_pack / "train" / "index.npz"
    damage(index)
    with pytest.raises(DataError, match=words) as caught:
        PackedImages(small_pack, "train")
    assert str(index) in str(caught.value) and "\n" not in str(caught.value)


def test_index_without_metadata_keys_is_a_data_error(small_pack: Path) -> None:
    def drop_shards(arrays):
        meta = json.loads(str(arrays["meta"]))
        del meta["shards"]
        arrays["meta"] = np.array(json.dumps(meta))
    rewrite_index(small_pack / "train", drop_shards)
    with pytest.raises(DataError, match="index.npz lacks meta.shards"):
        PackedImages(small_pack, "train")


def test_damaged_index_through_the_cli_is_one_line_and_exit_2(small_pack: Path) -> None:
    index = small_pack / "val" / "index.npz"
    index.write_bytes(index.read_bytes()[:100])
    run = subprocess.run([sys.executable, "-m", "bigbatch", "inspect", "--model", "small_cnn",
                          "--dataset", "packed", "--data", str(small_pack), "--batch", "2"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"bigbatch: error: cannot read {index} (File is not a zip file); pack the split again"]


def test_raw_record_with_a_flipped_byte_fails_its_checksum(small_pack: Path,
                                                          caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    dataset = PackedImages(small_pack, "train", train=False, image_size=SIZE)
    shard = small_pack / "train" / f"shard-{int(dataset.index.shard[2]):05d}.bin"
    middle = int(dataset.index.offset[2] + dataset.index.size[2] // 2)
    data = bytearray(shard.read_bytes())
    data[middle] ^= 0x01  # one pixel one level off: decodes fine, wrong all the same
    shard.write_bytes(bytes(data))
    skipping = PackedImages(small_pack, "train", train=False, image_size=SIZE)
    with caplog.at_level(logging.WARNING):
        batch = skipping.__getitems__([(1, 0), (2, 0), (3, 0)])
    assert len(batch) == 2 and len(batch.skipped) == 1
    assert "CRC-32" in caplog.text and str(shard) in caplog.text
    strict = PackedImages(small_pack, "train", train=False, image_size=SIZE, on_broken="error")
    with pytest.raises(DataError, match=f"{re.escape(str(shard))} fails its CRC-32 check"):
        strict.__getitems__([(2, 0)])
    assert len(strict.__getitems__([(1, 0), (3, 0)])) == 2  # the others still check out


def test_format_1_packs_are_read_without_checksums(small_pack: Path) -> None:
    def as_format_1(arrays):
        arrays.pop("crc32")
        set_meta(arrays, version=1)
    rewrite_index(small_pack / "train", as_format_1)
    dataset = PackedImages(small_pack, "train", train=False, image_size=SIZE)
    assert dataset.index.crc32 is None and len(dataset.__getitems__([(0, 0), (1, 0)])) == 2
