"""JPEGs decoded by the training device (data.decode_on_device), here the CPU: the same crops as
the loader's decoding, broken files skipped or named, batches intact through loader workers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from imagegen import FolderInfo, make_image_folder, make_jpeg_folder, smooth_pixels

from bigbatch.config import RunConfig, validate
from bigbatch.data import ImageFolderData, device_decode, make_loader
from bigbatch.data.batch import Batch
from bigbatch.data.decode import resize_box
from bigbatch.data.device_decode import decode_pending, resample_rounding
from bigbatch.data.transforms import Box
from bigbatch.errors import ConfigError, DataError

SIZE = 48


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> FolderInfo:
    return make_image_folder(tmp_path_factory.mktemp("images"), per_class=5)


def uint8_set(info: FolderInfo, defer: bool, **options) -> ImageFolderData:
    dataset = ImageFolderData(info.root, "train", seed=3, image_size=SIZE, normalize=False,
                              fast_decode=False, **options)
    if defer:
        dataset.defer_jpegs_to_device()
    return dataset


def keys(dataset: ImageFolderData, epoch: int = 1) -> list[tuple[int, int]]:
    return [(index, epoch) for index in range(len(dataset))]


def finish(dataset: ImageFolderData, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, list]:
    """What the training loop does with a batch on its device (the CPU here)."""
    if batch.pending is None:
        return batch.images, batch.labels, batch.skipped
    images, labels, broken = decode_pending(batch.images.clone(), batch.labels, batch.pending,
                                            dataset.report_broken)
    return images, labels, [*batch.skipped, *broken]


def test_device_decoded_crops_are_the_loaders(folder: FolderInfo) -> None:
    loader_set, device_set = uint8_set(folder, False), uint8_set(folder, True)
    expected = loader_set.__getitems__(keys(loader_set))
    deferred = device_set.__getitems__(keys(device_set))
    assert deferred.pending is not None
    pending_rows = set(deferred.pending.rows)
    # Every RGB JPEG waits for the device (its rows blank), the other files come decoded.
    assert 0 < len(pending_rows) < len(deferred)
    assert all(int(deferred.images[row].abs().sum()) == 0 for row in pending_rows)
    images, labels, skipped = finish(device_set, deferred)
    assert skipped == expected.skipped
    assert torch.equal(labels, expected.labels)
    assert torch.equal(images, expected.images)  # the same decoder and resampler on the CPU


def test_the_float_resampler_rounds_to_within_one_level_of_the_uint8_one() -> None:
    """What a GPU runs (no uint8 antialiased kernel there), checked on the CPU."""
    pixels = smooth_pixels(400, 300, np.random.default_rng(0))
    image = torch.from_numpy(pixels).permute(2, 0, 1).contiguous()
    for box in (Box(0, 0, 400, 300), Box(13, 7, 211, 170), Box(100, 50, 40, 30)):
        rows = torch.empty(3, SIZE, SIZE, dtype=torch.uint8)
        rows.copy_(resample_rounding(image, box, SIZE))
        difference = (rows.int() - resize_box(image, box, SIZE).int()).abs()
        assert int(difference.max()) <= 1
        assert float((difference == 0).float().mean()) > 0.7  # upsampling differs most


def failing_device(monkeypatch: pytest.MonkeyPatch, fails: Callable[[int], bool]) -> None:
    """A device whose decoder fails on the files for which ``fails(position)`` holds."""
    real = device_decode.decode_all

    def decode_all(encoded, device):
        decoded = real(encoded, device)
        return [RuntimeError("no decoder here") if fails(k) else image
                for k, image in enumerate(decoded)]

    monkeypatch.setattr(device_decode, "decode_all", decode_all)


def test_files_the_device_cannot_decode_are_decoded_on_the_cpu(
        folder: FolderInfo, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    failing_device(monkeypatch, lambda position: True)  # fewer files than a whole batch
    monkeypatch.setattr(device_decode, "_warned_fallback", False)
    loader_set, device_set = uint8_set(folder, False), uint8_set(folder, True)
    expected = loader_set.__getitems__(keys(loader_set))
    deferred = device_set.__getitems__(keys(device_set))
    assert len(deferred.pending.rows) < device_decode.WHOLE_BATCH_FAILURE
    images, labels, skipped = finish(device_set, deferred)
    assert torch.equal(images, expected.images) and torch.equal(labels, expected.labels)
    assert skipped == expected.skipped
    assert caplog.text.count("could not decode") == 1  # once per process


def test_a_device_that_decodes_nothing_stops_the_run(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    failing_device(monkeypatch, lambda position: True)
    make_jpeg_folder(tmp_path, device_decode.WHOLE_BATCH_FAILURE, size=(120, 90))
    dataset = ImageFolderData(tmp_path, "train", image_size=SIZE, normalize=False)
    dataset.defer_jpegs_to_device()
    batch = dataset.__getitems__(keys(dataset))
    assert len(batch.pending.rows) >= device_decode.WHOLE_BATCH_FAILURE
    with pytest.raises(DataError, match="cannot decode JPEGs .*decode_on_device=false"):
        finish(dataset, batch)


def test_a_file_decoded_to_another_size_than_its_header_says_goes_to_the_cpu(
        folder: FolderInfo, monkeypatch: pytest.MonkeyPatch) -> None:
    real = device_decode.decode_all
    monkeypatch.setattr(device_decode, "decode_all", lambda encoded, device: [
        image[:, 1:] if k == 0 and isinstance(image, torch.Tensor) else image
        for k, image in enumerate(real(encoded, device))])
    loader_set, device_set = uint8_set(folder, False), uint8_set(folder, True)
    expected = loader_set.__getitems__(keys(loader_set))
    images, _, _ = finish(device_set, device_set.__getitems__(keys(device_set)))
    assert torch.equal(images, expected.images)


def test_a_jpeg_the_device_cannot_decode_is_skipped_and_reported(
        folder: FolderInfo, caplog: pytest.LogCaptureFixture) -> None:
    truncated = next(path for path in folder.train_broken if path.name == "truncated.JPEG")
    dataset = uint8_set(folder, True)
    batch = dataset.__getitems__(keys(dataset))
    assert batch.pending is not None
    # The truncated file's header is whole, so the worker left it for the device.
    assert any(crop.name == str(truncated) for crop in batch.pending.crops)
    assert str(truncated) not in batch.skipped
    images, labels, skipped = finish(dataset, batch)
    assert str(truncated) in skipped
    assert len(images) == len(labels) == len(batch) - 1
    assert str(truncated) in caplog.text
    reference = uint8_set(folder, False).__getitems__(keys(dataset))
    assert sorted(skipped) == sorted(reference.skipped)
    assert torch.equal(labels, reference.labels)


def test_error_mode_names_the_file_the_device_cannot_decode(folder: FolderInfo) -> None:
    truncated = next(path for path in folder.train_broken if path.name == "truncated.JPEG")
    dataset = uint8_set(folder, True, on_broken="error")
    index = next(i for i in range(len(dataset)) if dataset.path(i) == truncated)
    batch = dataset.__getitems__([(index, 0)])  # the header is whole: the worker cannot tell
    with pytest.raises(DataError, match="cannot read image .*truncated.JPEG"):
        finish(dataset, batch)


def test_pending_jpegs_travel_through_a_loader_worker(folder: FolderInfo) -> None:
    dataset = uint8_set(folder, True)
    direct = finish(dataset, dataset.__getitems__(keys(dataset)))
    loader = make_loader(dataset, [keys(dataset)], workers=1)
    through_worker = finish(dataset, next(iter(loader)))
    assert torch.equal(through_worker[0], direct[0])
    assert torch.equal(through_worker[1], direct[1])
    assert through_worker[2] == direct[2]


def test_a_single_example_is_decoded_in_place(folder: FolderInfo) -> None:
    dataset = uint8_set(folder, True)
    image, label = dataset[(0, 1)]
    expected, expected_label = uint8_set(folder, False)[(0, 1)]
    assert label == expected_label
    assert torch.equal(image, expected)


def test_device_decoding_needs_uint8_batches(folder: FolderInfo) -> None:
    dataset = ImageFolderData(folder.root, "train", image_size=SIZE)
    with pytest.raises(ConfigError, match="normalize_on_device"):
        dataset.defer_jpegs_to_device()


@pytest.mark.parametrize(("settings", "message"), [
    ({"name": "fashion-mnist"}, "has none"),
    ({"name": "imagefolder", "path": "/data", "normalize_on_device": False},
     "normalize_on_device=true"),
])
def test_config_refuses_device_decoding_where_it_cannot_work(settings: dict,
                                                            message: str) -> None:
    cfg = RunConfig()
    cfg.data.decode_on_device = True
    for key, value in settings.items():
        setattr(cfg.data, key, value)
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


def test_packed_raw_records_are_resampled_by_the_loader(folder: FolderInfo,
                                                        tmp_path: Path) -> None:
    from bigbatch.data import PackedImages, pack_imagefolder

    pack_imagefolder(folder.root, tmp_path / "packed", encoding="raw", short_side=64)
    packed = PackedImages(tmp_path / "packed", "train", image_size=SIZE, normalize=False)
    assert not packed.defer_jpegs_to_device()
    batch = packed.__getitems__(keys(packed))
    assert batch.pending is None
    assert int(batch.images.abs().sum()) > 0


def test_pinning_and_moving_a_batch_keep_its_pending_jpegs(folder: FolderInfo,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    dataset = uint8_set(folder, True)
    batch = dataset.__getitems__(keys(dataset))
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda tensor: tensor)  # no CUDA here
    for moved in (batch.pin_memory(), batch.to("cpu")):
        assert moved.pending is batch.pending
        assert moved.skipped == batch.skipped


def test_recomputed_batchnorm_statistics_see_the_decoded_images(tmp_path: Path) -> None:
    """eval.bn_recompute runs training micro-batches through the model: with the JPEGs left to
    the device they must be decoded first, giving the statistics of the workers' decoding."""
    from torch import nn

    from bigbatch.distributed import DistContext
    from bigbatch.geometry import BatchGeometry
    from bigbatch.precise_bn import PreciseBN

    cpu = DistContext(rank=0, world_size=1, local_rank=0, backend=None,
                      device=torch.device("cpu"))
    make_jpeg_folder(tmp_path, 16, size=(120, 90))
    statistics = []
    for defer in (False, True):
        dataset = ImageFolderData(tmp_path, "train", image_size=SIZE, normalize=False)
        if defer:
            assert dataset.defer_jpegs_to_device()
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
        geometry = BatchGeometry(8, 4, 1, len(dataset))
        PreciseBN(2, dataset, geometry, seed=0, ctx=cpu).apply(model, 0)
        statistics.append(model[1].running_mean.clone())
    assert torch.equal(statistics[0], statistics[1])
    assert float(statistics[0].abs().sum()) > 0


def test_running_out_of_device_memory_in_the_decoder_is_raised(folder: FolderInfo,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """torchvision reports it as a plain RuntimeError; it must not pass for a broken file."""
    def decoder(*args, **kwargs):
        raise RuntimeError("Error while decoding JPEG images: CUDA out of memory")

    monkeypatch.setattr(device_decode, "turbo_decoder", lambda: decoder)
    dataset = uint8_set(folder, True)
    batch = dataset.__getitems__(keys(dataset))
    with pytest.raises(RuntimeError, match="out of memory"):
        finish(dataset, batch)
