"""Input-pipeline throughput in training images/s per core (one process, one thread).

Compares, on a generated folder of quality-90 JPEGs, by default 500x375 (about ImageNet's
typical size and file size, ~110 kB, from 1/f "natural image" noise; --source-size 1000x750
shows larger photos):

* torchvision: datasets.ImageFolder + RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor
  + Normalize, batched with default_collate (what a DataLoader worker does),
* bigbatch ImageFolderData with fast_decode on and off,
* bigbatch PackedImages of the same folder, JPEG and raw encodings,
* bigbatch WebDatasetImages of the same folder written as WebDataset shards of reduced-size
  JPEGs (``bigbatch data pack --format webdataset``: the same shrinking and JPEG quality as the
  packed JPEG encoding),
* the _uint8 variants: the same, returning uint8 images to be normalised on the device,
* the _device_decode variants: a folder and shards whose RGB JPEGs are left for the training
  device to decode (data.decode_on_device), so the figure is the loader workers' share only
  (reading each file, parsing its header, choosing its crop).

Methods run interleaved, one pass over all images each per round, after one warm-up round, so
machine noise hits them alike; we report medians and the median of per-round ratios to
torchvision. JSON goes to stdout and is appended to docs/results/input_pipeline.jsonl.

    python benchmarks/input_pipeline.py [--images 256] [--rounds 5] [--batch 64]
        [--source-size 500x375] [--no-save]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import PIL
import torch
import torchvision
from PIL import Image, features
from torch.utils.data import default_collate
from torchvision import transforms

from bigbatch.data.imagefolder import ImageFolderData
from bigbatch.data.pack import PackedImages, pack_imagefolder
from bigbatch.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from bigbatch.data.webdataset import WebDatasetImages, shard_paths
from bigbatch.data.webdataset_write import write_webdataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import append_result  # noqa: E402
from common import machine_info as common_machine_info  # noqa: E402

IMAGE_SIZE = 224


def natural_pixels(width: int, height: int, rng: np.random.Generator) -> np.ndarray:
    """height x width x 3 uint8 noise with a 1/f amplitude spectrum, like photographs, so
    JPEG sizes and decode times are realistic (smooth test patterns compress far too well)."""
    fy = np.fft.fftfreq(height)[:, None]
    fx = np.fft.fftfreq(width)[None, :]
    amplitude = 1.0 / np.maximum(np.hypot(fx, fy), 1.0 / max(width, height))
    amplitude[0, 0] = 0.0
    channels = []
    for _ in range(3):
        spectrum = rng.standard_normal((height, width)) + 1j * rng.standard_normal((height, width))
        channels.append(np.fft.ifft2(spectrum * amplitude).real)
    pixels = np.stack(channels, axis=-1)
    pixels = (pixels - pixels.mean()) / pixels.std()
    colour = np.array([[1.0, 0.8, 0.6], [0.0, 0.5, 0.3], [0.0, 0.0, 0.4]])  # correlated channels
    return np.clip(128 + 45 * pixels @ colour, 0, 255).astype(np.uint8)


def make_folder(root: Path, count: int, size: tuple[int, int] = (500, 375), classes: int = 8,
                seed: int = 0) -> float:
    """root/{train,val}/classNN/*.JPEG (val: one image a class); returns mean train file size."""
    rng = np.random.default_rng(seed)
    sizes = []
    for split, total in (("train", count), ("val", classes)):
        for k in range(total):
            folder = root / split / f"class{k % classes:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            buffer = io.BytesIO()
            Image.fromarray(natural_pixels(*size, rng)).save(buffer, "JPEG", quality=90)
            (folder / f"img{k:05d}.JPEG").write_bytes(buffer.getvalue())
            if split == "train":
                sizes.append(len(buffer.getvalue()))
    return float(np.mean(sizes))


def chunks(count: int, batch: int) -> list[range]:
    return [range(start, min(start + batch, count)) for start in range(0, count, batch)]


def torchvision_pass(root: Path, batch: int) -> Callable[[int], int]:
    dataset = torchvision.datasets.ImageFolder(str(root / "train"), transform=transforms.Compose([
        transforms.RandomResizedCrop(IMAGE_SIZE),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ]))

    def run(epoch: int) -> int:
        torch.manual_seed(epoch)
        for part in chunks(len(dataset), batch):
            images, _ = default_collate([dataset[i] for i in part])
        return len(dataset)
    return run


def bigbatch_pass(dataset, batch: int) -> Callable[[int], int]:
    def run(epoch: int) -> int:
        for part in chunks(len(dataset), batch):
            dataset.__getitems__([(i, epoch) for i in part])
        return len(dataset)
    return run


def deferring(dataset):
    """``dataset`` set to leave its RGB JPEGs for the training device to decode."""
    dataset.defer_jpegs_to_device()
    return dataset


def machine_info() -> dict:
    """The machine as common.machine_info gives it, with the image libraries the decoders use."""
    return {**common_machine_info(), "pillow": PIL.__version__,
            "libjpeg_turbo": features.version("jpg")}


def measure(methods: dict[str, Callable[[int], int]], rounds: int) -> dict[str, list[float]]:
    """images/s of each method per round, interleaved; round 0 is a warm-up and is dropped."""
    rates: dict[str, list[float]] = {name: [] for name in methods}
    for round_index in range(rounds + 1):
        for name, run in methods.items():
            start = time.perf_counter()
            count = run(round_index)
            elapsed = time.perf_counter() - start
            if round_index:
                rates[name].append(count / elapsed)
    return rates


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--source-size", default="500x375",
                        help="WIDTHxHEIGHT of the generated JPEGs (ImageNet's typical size)")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    width, height = (int(v) for v in args.source_size.lower().split("x"))
    torch.set_num_threads(1)  # per-core numbers: one process, one thread
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        mean_bytes = make_folder(work / "src", args.images, (width, height))
        pack_rates = {}
        for encoding in ("jpeg", "raw"):
            start = time.perf_counter()
            pack_imagefolder(work / "src", work / encoding, encoding=encoding, workers=1)
            pack_rates[encoding] = (args.images + 8) / (time.perf_counter() - start)
        start = time.perf_counter()
        write_webdataset(work / "src", work / "wds", workers=1)
        pack_rates["webdataset"] = (args.images + 8) / (time.perf_counter() - start)
        wds_train = shard_paths(work / "wds", prefix="train")
        methods = {
            "torchvision_imagefolder": torchvision_pass(work / "src", args.batch),
            "imagefolder_fast_decode": bigbatch_pass(
                ImageFolderData(work / "src", "train", train=True), args.batch),
            "imagefolder_full_decode": bigbatch_pass(
                ImageFolderData(work / "src", "train", train=True, fast_decode=False), args.batch),
            "packed_jpeg": bigbatch_pass(PackedImages(work / "jpeg", "train"), args.batch),
            "packed_raw": bigbatch_pass(PackedImages(work / "raw", "train"), args.batch),
            "webdataset_jpeg": bigbatch_pass(
                WebDatasetImages(wds_train, cache_dir=work / "cache"), args.batch),
            # uint8 output, normalised later on the device (transforms.normalize_images)
            "imagefolder_fast_decode_uint8": bigbatch_pass(
                ImageFolderData(work / "src", "train", train=True, normalize=False), args.batch),
            "packed_jpeg_uint8": bigbatch_pass(
                PackedImages(work / "jpeg", "train", normalize=False), args.batch),
            "packed_raw_uint8": bigbatch_pass(
                PackedImages(work / "raw", "train", normalize=False), args.batch),
            "webdataset_jpeg_uint8": bigbatch_pass(
                WebDatasetImages(wds_train, normalize=False, cache_dir=work / "cache"),
                args.batch),
            # the workers' share when the device decodes the JPEGs (data.decode_on_device)
            "imagefolder_device_decode": bigbatch_pass(deferring(
                ImageFolderData(work / "src", "train", train=True, normalize=False)), args.batch),
            "webdataset_device_decode": bigbatch_pass(deferring(
                WebDatasetImages(wds_train, normalize=False, cache_dir=work / "cache")),
                args.batch),
        }
        packed_bytes = {enc: sum(p.stat().st_size for p in (work / enc / "train").glob("*.bin"))
                        / args.images for enc in ("jpeg", "raw")}
        packed_bytes["webdataset"] = sum(p.stat().st_size for p in wds_train) / args.images
        load_before = os.getloadavg()[0]
        rates = measure(methods, args.rounds)
    baseline = rates["torchvision_imagefolder"]
    result = {
        "benchmark": "input_pipeline",
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "setup": {"images": args.images, "source": f"{width}x{height} JPEG quality 90",
                  "mean_source_bytes": round(mean_bytes), "output": f"{IMAGE_SIZE}x{IMAGE_SIZE}",
                  "augmentation": "RandomResizedCrop(0.08-1, 3/4-4/3) + flip + normalise",
                  "batch": args.batch, "rounds": args.rounds, "threads": 1},
        "images_per_s_per_core": {name: round(statistics.median(r), 1)
                                  for name, r in rates.items()},
        "images_per_s_range": {name: [round(min(r), 1), round(max(r), 1)]
                               for name, r in rates.items()},
        "images_per_s_rounds": {name: [round(v, 1) for v in r] for name, r in rates.items()},
        "speedup_vs_torchvision": {
            name: round(statistics.median(a / b for a, b in zip(r, baseline, strict=True)), 2)
            for name, r in rates.items()},
        "packed_bytes_per_image": {k: round(v) for k, v in packed_bytes.items()},
        "pack_images_per_s_per_core": {k: round(v, 1) for k, v in pack_rates.items()},
        "machine": {**machine_info(), "load_average_1min_at_start": load_before},
    }
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    if not args.no_save:
        append_result("input_pipeline", result)
    return result


if __name__ == "__main__":
    main()
