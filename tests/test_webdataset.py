"""WebDataset shards: naming, the cached member index, broken members, the same pixels as the
image-folder route, and world-size-invariant, resumable batches."""

from __future__ import annotations

import io
import json
import logging
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from imagegen import GOOD_SPECS, encode_image, make_image_folder, smooth_pixels
from launch import run_bigbatch, summary

from bigbatch.commands import main as cli_main
from bigbatch.data import build_datasets, webdataset
from bigbatch.data.device_decode import decode_pending
from bigbatch.data.imagefolder import ImageFolderData
from bigbatch.data.loader import make_loader
from bigbatch.data.sampler import GlobalBatchPlan, TrainBatches
from bigbatch.data.webdataset import (
    WebDatasetImages,
    expand_braces,
    shard_paths,
    split_member_name,
    split_shards,
)
from bigbatch.errors import ConfigError, DataError
from bigbatch.geometry import BatchGeometry

SIZE = 48
CLASSES = 3


def write_shard(path: Path, samples: list[tuple[str, dict[str, bytes]]]) -> Path:
    """A tar shard of ``samples`` (key, {extension: bytes}), members in the given order."""
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for key, members in samples:
            for extension, data in members.items():
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def good_samples(first: int, count: int, rng: np.random.Generator
                 ) -> list[tuple[str, dict[str, bytes]]]:
    """Varied sizes, modes and formats; labels cycle through the classes, half as .cls and
    half as .json."""
    samples = []
    for k in range(first, first + count):
        width, height, mode, fmt = GOOD_SPECS[k % len(GOOD_SPECS)]
        image = encode_image(smooth_pixels(width, height, rng), mode, fmt)
        label = k % CLASSES
        members = {"png" if fmt == "PNG" else "jpg": image}
        if k % 2:
            members["json"] = json.dumps({"label": label, "name": f"s{k}"}).encode()
        else:
            members["cls"] = str(label).encode()
        samples.append((f"sample{k:04d}", members))
    return samples


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """train-0000..0002.tar (8 good samples each, the middle one with five broken samples
    appended) and val-0000.tar (6 good samples)."""
    root = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(0)
    jpeg = encode_image(smooth_pixels(200, 150, rng), "RGB", "JPEG")
    broken = [
        ("cut", {"jpg": jpeg[: len(jpeg) // 2], "cls": b"1"}),  # truncated JPEG
        ("nolabel", {"jpg": jpeg}),
        ("outofrange", {"jpg": jpeg, "cls": b"-4"}),
        ("badlabel", {"jpg": jpeg, "cls": b"cat"}),
        ("noimage", {"cls": b"2"}),
    ]
    for shard in range(3):
        samples = good_samples(8 * shard, 8, rng)
        write_shard(root / f"train-{shard:04d}.tar", samples + (broken if shard == 1 else []))
    write_shard(root / "val-0000.tar", good_samples(100, 6, rng))
    return root


def fresh(tmp_path: Path, shards: Path) -> Path:
    """A private copy of the shards (tests that look at the index cache)."""
    for shard in shards.glob("*.tar"):
        (tmp_path / shard.name).write_bytes(shard.read_bytes())
    return tmp_path


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep indexes that cannot go beside their shards out of the real ~/.cache."""
    cache = tmp_path / "cache"
    monkeypatch.setattr(webdataset, "default_cache_dir", lambda: cache)
    return cache


def test_brace_patterns_expand_in_order_with_padding() -> None:
    assert expand_braces("d/train-{0000..0002}.tar") == [
        "d/train-0000.tar", "d/train-0001.tar", "d/train-0002.tar"]
    assert expand_braces("{8..11}") == ["8", "9", "10", "11"]
    assert expand_braces("{a,b}-{0..1}") == ["a-0", "a-1", "b-0", "b-1"]
    assert expand_braces("plain.tar") == ["plain.tar"]


def test_member_names_split_at_the_first_dot_of_the_base_name() -> None:
    assert split_member_name("n0144/img_1.seg.PNG") == ("n0144/img_1", "seg.png")
    assert split_member_name("a.b/c.jpg") == ("a.b/c", "jpg")
    assert split_member_name("README") is None


def test_pattern_folder_and_list_file_name_the_same_shards(shards: Path, tmp_path: Path) -> None:
    expected = [shards / f"train-{k:04d}.tar" for k in range(3)]
    assert shard_paths(f"{shards}/train-{{0000..0002}}.tar") == expected
    assert shard_paths(shards, prefix="train") == expected
    listing = tmp_path / "train.txt"
    listing.write_text(f"# training shards\n{shards}/train-0000.tar\n\n"
                       f"{shards}/train-{{0001..0002}}.tar\n")
    assert shard_paths(listing) == expected
    relative = shards / "list.txt"
    relative.write_text("train-0000.tar\ntrain-0001.tar\ntrain-0002.tar\n")
    assert shard_paths(relative) == expected
    relative.unlink()
    with pytest.raises(DataError, match="train-0003.tar"):
        shard_paths(f"{shards}/train-{{0000..0003}}.tar")


def test_validation_shards_found_beside_or_named(shards: Path, tmp_path: Path) -> None:
    train, val = split_shards(str(shards), None)
    assert [p.name for p in train] == ["train-0000.tar", "train-0001.tar", "train-0002.tar"]
    assert [p.name for p in val] == ["val-0000.tar"]
    _, named = split_shards(f"{shards}/train-{{0000..0001}}.tar", f"{shards}/val-0000.tar")
    assert named == val
    with pytest.raises(DataError, match="data.val_path"):
        split_shards(f"{shards}/train-{{0000..0001}}.tar", None)


def test_samples_labels_and_broken_members(shards: Path, caplog) -> None:
    train, val = build_datasets("webdataset", path=str(shards), seed=0, image_size=SIZE)
    assert len(train) == 29 and len(val) == 6  # 24 good + 5 broken; no sample lost
    assert train.num_classes == val.num_classes == CLASSES
    good = np.r_[0:16, 21:29]
    assert train.labels[good].tolist() == [k % CLASSES for k in range(24)]
    with caplog.at_level(logging.WARNING):
        batch = train.__getitems__([(i, 0) for i in range(len(train))])
    assert batch.images.shape == (24, 3, SIZE, SIZE) and batch.labels.tolist() == [
        k % CLASSES for k in range(24)]
    shard = shards / "train-0001.tar"
    assert batch.skipped == [f"{shard}:{key}" for key in
                             ("cut", "nolabel", "outofrange", "badlabel", "noimage")]
    for reason in ("no label member", "label -4 outside 0..2", "unreadable label",
                   "no image member"):
        assert reason in caplog.text


def test_label_outside_num_classes_and_error_mode(shards: Path) -> None:
    pattern = f"{shards}/train-{{0000..0002}}.tar"
    two = WebDatasetImages(shard_paths(pattern), image_size=SIZE, num_classes=2)
    labels = two.__getitems__([(i, 0) for i in range(8)]).labels.tolist()
    assert labels == [0, 1, 0, 1, 0, 1]  # the class-2 samples are out of range
    strict = WebDatasetImages(shard_paths(pattern), image_size=SIZE, on_broken="error")
    with pytest.raises(DataError, match="train-0001.tar:cut"):
        strict.__getitems__([(16, 0)])
    with pytest.raises(DataError, match="train-0001.tar:noimage"):
        strict[20]


def test_same_pixels_as_the_image_folder_of_the_same_files(tmp_path: Path) -> None:
    info = make_image_folder(tmp_path / "images", broken=False)
    samples = [(f"{k:05d}", {"jpg": path.read_bytes(), "cls": str(k // 6).encode()})
               for k, path in enumerate(info.train_good)]
    write_shard(tmp_path / "a.tar", samples[:7])
    write_shard(tmp_path / "b.tar", samples[7:])
    for train in (True, False):
        folder = ImageFolderData(info.root, "train", train=train, seed=3, image_size=SIZE,
                                 resize_size=55, normalize=False)
        shards = WebDatasetImages([tmp_path / "a.tar", tmp_path / "b.tar"], train=train, seed=3,
                                  image_size=SIZE, resize_size=55, normalize=False)
        keys = [(i, epoch) for epoch in (0, 1) for i in range(len(folder))]
        expected, got = folder.__getitems__(keys), shards.__getitems__(keys)
        assert got.images.dtype == torch.uint8
        assert torch.equal(got.images, expected.images)
        assert torch.equal(got.labels, expected.labels)


def test_index_is_cached_beside_the_shards_and_rebuilt_when_a_shard_changes(
        shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "copy").mkdir()
    folder = fresh(tmp_path / "copy", shards)
    scans: list[str] = []
    real_scan = webdataset.scan_shard
    monkeypatch.setattr(webdataset, "scan_shard",
                        lambda path: scans.append(path.name) or real_scan(path))
    first = WebDatasetImages(shard_paths(folder, "train"), image_size=SIZE)
    assert sorted(scans) == ["train-0000.tar", "train-0001.tar", "train-0002.tar"]
    assert sorted(p.name for p in folder.glob("*.index.npz")) == [
        f"train-000{k}.tar.index.npz" for k in range(3)]
    again = WebDatasetImages(shard_paths(folder, "train"), image_size=SIZE)
    assert len(scans) == 3  # all three read from the cache
    assert np.array_equal(again.offsets, first.offsets) and np.array_equal(again.keys, first.keys)
    write_shard(folder / "train-0002.tar", good_samples(50, 3, np.random.default_rng(1)))
    changed = WebDatasetImages(shard_paths(folder, "train"), image_size=SIZE)
    assert scans[3:] == ["train-0002.tar"] and len(changed) == len(first) - 5
    damaged = folder / "train-0001.tar.index.npz"
    damaged.write_bytes(damaged.read_bytes()[:100])  # e.g. a writer killed mid-way
    repaired = WebDatasetImages(shard_paths(folder, "train"), image_size=SIZE)
    assert scans[4:] == ["train-0001.tar"] and np.array_equal(repaired.keys, changed.keys)
    assert not list(folder.glob(".*partial"))


def test_read_only_shards_keep_their_index_in_the_cache_folder(
        shards: Path, tmp_path: Path, private_cache: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "readonly"
    folder.mkdir()
    fresh(folder, shards)
    real_write = webdataset.write_index

    def refuse_beside_shards(path: Path, *args) -> None:
        if path.parent == folder:  # as on a read-only mount (root ignores chmod)
            raise PermissionError(13, "Permission denied", str(path))
        real_write(path, *args)

    monkeypatch.setattr(webdataset, "write_index", refuse_beside_shards)
    folder.chmod(0o555)
    try:
        first = WebDatasetImages(shard_paths(folder, "train"), image_size=SIZE)
        assert not list(folder.glob("*.index.npz"))
        cached = sorted(p.name.split("-", 1)[1] for p in private_cache.glob("*.index.npz"))
        assert cached == [f"train-000{k}.tar.index.npz" for k in range(3)]
        monkeypatch.setattr(webdataset, "scan_shard", lambda path: pytest.fail("rescanned"))
        again = WebDatasetImages(shard_paths(folder, "train"), image_size=SIZE)
        assert np.array_equal(again.offsets, first.offsets)
    finally:
        folder.chmod(0o755)


def test_a_key_on_both_sides_of_a_shard_boundary_is_two_samples(tmp_path: Path) -> None:
    jpeg = encode_image(smooth_pixels(64, 64, np.random.default_rng(2)), "RGB", "JPEG")
    write_shard(tmp_path / "s-0.tar", [("a", {"jpg": jpeg, "cls": b"0"}), ("x", {"jpg": jpeg})])
    write_shard(tmp_path / "s-1.tar", [("x", {"cls": b"1"}), ("b", {"jpg": jpeg, "cls": b"1"})])
    data = WebDatasetImages([tmp_path / "s-0.tar", tmp_path / "s-1.tar"], image_size=SIZE)
    assert [data.describe(i).rsplit(":", 1)[1] for i in range(4)] == ["a", "x", "x", "b"]
    assert [data.problem(i) for i in range(4)] == [
        None, "no label member (.cls or .json)", "no image member", None]


def test_a_truncated_shard_keeps_its_complete_samples(shards: Path, tmp_path: Path) -> None:
    whole = (shards / "val-0000.tar").read_bytes()
    cut = tmp_path / "cut.tar"
    complete = WebDatasetImages([shards / "val-0000.tar"], train=False, image_size=SIZE)
    last = int(complete.offsets[-1])
    cut.write_bytes(whole[: last + 100])  # inside the last image's data
    data = WebDatasetImages([cut], train=False, image_size=SIZE)
    assert len(data) == 6 and data.problem(5) == "image member cut off by the end of the shard"
    assert len(data.__getitems__(list(range(6)))) == 5


def test_subset_pickling_and_uint8(shards: Path) -> None:
    train, _ = build_datasets("webdataset", path=str(shards), seed=1, image_size=SIZE,
                              train_subset=10, normalize=False)
    assert len(train) == 10 and train.rows.tolist() == [0, 2, 5, 8, 11, 14, 17, 20, 23, 26]
    _, val = build_datasets("webdataset", path=str(shards), seed=1, image_size=SIZE,
                            val_subset=3)
    assert len(val) == 3 and val.rows.tolist() == [0, 2, 4]  # spread over the 6
    before = train.__getitems__(list(range(10)))
    clone = pickle.loads(pickle.dumps(train))
    assert not clone.files._maps
    after = clone.__getitems__(list(range(10)))
    assert before.images.dtype == torch.uint8 and torch.equal(before.images, after.images)


def collect(dataset, plan: GlobalBatchPlan, epochs: int, start: tuple[int, int] = (0, 0),
            workers: int = 0) -> dict[tuple[int, int, int], torch.Tensor]:
    """{(epoch, step, micro-batch j): images} loaded for one rank through its DataLoader."""
    batches = TrainBatches(plan, start[0], start[1], epochs)
    order = [(epoch, step, plan.geometry.micro_index(a, plan.rank))
             for epoch, step in batches.steps() for a in range(plan.accumulation_steps)]
    loader = make_loader(dataset, batches, workers)
    return {slot: batch.images for slot, batch in zip(order, loader, strict=True)}


def test_batches_are_the_same_at_any_world_size_and_on_resume(shards: Path) -> None:
    train, _ = build_datasets("webdataset", path=str(shards), seed=4, image_size=SIZE,
                              normalize=False)
    runs = []
    for world in (1, 2, 4):
        loaded: dict = {}
        for rank in range(world):
            plan = GlobalBatchPlan(BatchGeometry(8, 2, world, len(train)), rank, seed=4)
            loaded.update(collect(train, plan, epochs=2, workers=1 if world == 2 else 0))
        runs.append(loaded)
    assert len(runs[0]) == 2 * 3 * 4  # 2 epochs x 3 steps x 4 micro-batches
    for other in runs[1:]:
        assert other.keys() == runs[0].keys()
        assert all(torch.equal(other[slot], runs[0][slot]) for slot in runs[0])
    plan = GlobalBatchPlan(BatchGeometry(8, 2, num_examples=len(train)), seed=4)
    resumed = collect(train, plan, epochs=2, start=(1, 1))
    assert resumed and all(torch.equal(images, runs[0][slot]) for slot, images in resumed.items())
    assert min(resumed) == (1, 1, 0)


def test_data_pack_writes_shards_the_data_set_reads(tmp_path: Path, capsys) -> None:
    info = make_image_folder(tmp_path / "images", per_class=4, val_per_class=2)
    out = tmp_path / "wds"
    code = cli_main(["data", "pack", str(info.root), str(out), "--format", "webdataset",
                     "--short-side", "64", "--workers", "1"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["images"] == {"train": 12, "val": 6}
    assert len(summary["skipped"]["train"]) == len(info.train_broken)
    assert sorted(p.name for p in out.iterdir()) == ["train-0000.tar", "val-0000.tar"]
    train, val = build_datasets("webdataset", path=str(out), seed=0, image_size=32)
    assert train.labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert val.labels.tolist() == [0, 0, 1, 1, 2, 2] and val.num_classes == 3
    with tarfile.open(out / "train-0000.tar") as tar:
        first = tar.extractfile("00000000.jpg").read()
    from PIL import Image
    with Image.open(io.BytesIO(first)) as image:
        assert image.format == "JPEG" and min(image.size) <= 64
    assert cli_main(["data", "pack", str(info.root), str(out), "--format", "webdataset"]) == 2
    assert "already holds train-*.tar" in capsys.readouterr().err


def test_config_needs_shards(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs shards"):
        build_datasets("webdataset", path=None, seed=0)
    with pytest.raises(DataError, match="does not exist"):
        build_datasets("webdataset", path=str(tmp_path / "none"), seed=0)
    empty = tmp_path / "empty.tar"
    write_shard(empty, [])
    with pytest.raises(DataError, match="no samples"):
        WebDatasetImages([empty])


@pytest.mark.slow
def test_train_on_shards_named_by_pattern_with_validation_shards(shards: Path,
                                                                   tmp_path: Path) -> None:
    out = tmp_path / "run"
    run = run_bigbatch([
        "train", "--dataset", "webdataset", "--data", f"{shards}/train-{{0000..0002}}.tar",
        "--set", f"data.val_path={shards}/val-0000.tar", "--model", "small_cnn",
        "--batch-size", "8", "--micro-batch", "4", "--epochs", "1", "--warmup-epochs", "0",
        "--lr", "0.1", "--set", "data.image_size=32", "--set", "data.workers=1",
        "--set", "precision=fp32", "--out", str(out)])
    result = summary(out)
    assert result["steps"] == 3 and result["top1"] is not None
    assert 1 <= result["skipped_images"] <= 5
    assert "train-0001.tar:" in run.stderr


def test_class_count_covers_both_splits_and_no_validation_sample_is_dropped(
        tmp_path: Path) -> None:
    """Training shards without the top class: the count comes from both splits, and every
    validation sample is kept; a declared count below a validation label is refused."""
    rng = np.random.default_rng(3)
    samples = good_samples(0, 9, rng)  # labels 0, 1, 2, 0, 1, 2, ...
    write_shard(tmp_path / "train-0000.tar", [s for s in samples if not s[0].endswith(("2",
                                                                                       "5", "8"))])
    write_shard(tmp_path / "val-0000.tar", samples[::-1])  # unsorted, the top class first
    train, val = build_datasets("webdataset", path=str(tmp_path), seed=0, image_size=SIZE)
    assert train.num_classes == val.num_classes == CLASSES
    assert val.labels.tolist() == [k % CLASSES for k in range(8, -1, -1)]
    assert sorted(set(train.labels.tolist())) == [0, 1]
    with pytest.raises(DataError, match=r"^3 validation samples have labels outside 0\.\.1 "
                                        r"\(the first: .*val-0000.tar:sample0008, label 2\); "
                                        r"set data.num_classes to 3 or more$"):
        build_datasets("webdataset", path=str(tmp_path), seed=0, image_size=SIZE,
                       num_classes=2)


def test_device_decoding_of_shards_keeps_the_samples_and_finds_the_cut_one(shards: Path) -> None:
    """data.decode_on_device on shards: the same labels and skip list as the workers' decoding,
    the truncated JPEG (whose header is whole) found broken only when the device decodes it."""
    keys = [(i, 0) for i in range(29)]
    settings = dict(path=str(shards), seed=0, image_size=SIZE, normalize=False,
                    fast_decode=False)  # the device decodes at full scale, never drafted
    workers, _ = build_datasets("webdataset", **settings)
    device, _ = build_datasets("webdataset", **settings)
    device.defer_jpegs_to_device()
    expected, batch = workers.__getitems__(keys), device.__getitems__(keys)
    cut = f"{shards / 'train-0001.tar'}:cut"
    assert batch.pending is not None and cut not in batch.skipped
    images, labels, broken = decode_pending(batch.images, batch.labels, batch.pending,
                                            device.report_broken)
    assert broken == [cut]
    assert sorted([*batch.skipped, *broken]) == sorted(expected.skipped)
    assert torch.equal(labels, expected.labels)
    assert int((images.int() - expected.images.int()).abs().max()) <= 1
