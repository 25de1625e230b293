"""JPEG decoding on the training device (data.decode_on_device) checked and timed against the
loader workers' decoding, on generated files.

    python benchmarks/device_decode_check.py --device cuda            # appends a record
    python benchmarks/device_decode_check.py --device cpu --images 16 --out FILE

A folder of ImageNet-like JPEGs (500x375, quality 90, as benchmarks/input_pipeline.py makes
them) plus two JPEGs cut short (their headers whole, so only decoding finds them broken):

* pixels (before the broken files are added): the device's crops against the workers'
  (full-scale decoding on both sides): largest and mean absolute difference, the share of
  equal values;
* the device's own share, on the same files: images/s of decode_pending (decode, crop, resize,
  synchronised) over the folder's batches, per round, after a warm-up round;
* broken (after): the files the device's path skips against those the workers skip (must be
  the same).

Appends to docs/results/device_decode.jsonl unless --out names another file.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, spread, with_machine  # noqa: E402
from input_pipeline import deferring, make_folder  # noqa: E402

from bigbatch.data.batch import Batch  # noqa: E402
from bigbatch.data.device_decode import decode_pending  # noqa: E402
from bigbatch.data.imagefolder import ImageFolderData  # noqa: E402

CUT_AT = (0.5, 0.9)  # the two broken files keep these fractions of a good file's bytes


def add_cut_files(root: Path) -> list[str]:
    """Two JPEGs of the folder's first class cut short; their paths."""
    good = sorted((root / "train" / "class00").glob("*.JPEG"))[0].read_bytes()
    paths = []
    for fraction in CUT_AT:
        path = root / "train" / "class00" / f"cut{round(100 * fraction):02d}.JPEG"
        path.write_bytes(good[: int(len(good) * fraction)])
        paths.append(str(path))
    return paths


def batches(dataset: ImageFolderData, batch: int, epoch: int) -> list[Batch]:
    keys = [(index, epoch) for index in range(len(dataset))]
    return [dataset.__getitems__(keys[start:start + batch])
            for start in range(0, len(keys), batch)]


def on_device(dataset: ImageFolderData, loaded: list[Batch],
              device: torch.device) -> tuple[torch.Tensor, list[str], float]:
    """(the crops, the files skipped, seconds) of decode_pending over ``loaded`` on ``device``;
    the host-to-device copies are made before the clock starts."""
    moved = [(b.images.to(device), b.labels.to(device), b.pending) for b in loaded]
    synchronize(device)
    started = time.perf_counter()
    results = [decode_pending(images, labels, pending, dataset.report_broken)
               for images, labels, pending in moved]
    synchronize(device)
    seconds = time.perf_counter() - started
    crops = torch.cat([images for images, _, _ in results]).cpu()
    return crops, [name for _, _, names in results for name in names], seconds


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def uint8_folder(root: Path) -> ImageFolderData:
    """The folder's training set as the check reads it: uint8 batches, full-scale decoding."""
    return ImageFolderData(root, "train", normalize=False, fast_decode=False)


def pixels_and_rate(root: Path, device: torch.device, batch: int, rounds: int) -> dict:
    """On the folder without broken files: the device's crops against the workers', and its
    decode rate per round after a warm-up round (no file takes the fallback path)."""
    device_set = deferring(uint8_folder(root))
    reference = torch.cat([b.images for b in batches(uint8_folder(root), batch, 0)])
    crops = on_device(device_set, batches(device_set, batch, 0), device)[0]
    difference = (crops.int() - reference.int()).abs()
    rates = []
    for round_index in range(rounds + 1):
        loaded = batches(device_set, batch, round_index)
        count = sum(len(b.pending.rows) for b in loaded if b.pending is not None)
        seconds = on_device(device_set, loaded, device)[2]
        if round_index:
            rates.append(round(count / seconds, 1))
    return {"pixels": {"max_abs": int(difference.max()),
                       "mean_abs": round(float(difference.float().mean()), 4),
                       "equal_share": round(float((difference == 0).float().mean()), 4)},
            "device_images_per_second": spread(rates)}


def broken_files(root: Path, device: torch.device, batch: int) -> dict:
    """The files the device's path skips against those the workers skip."""
    workers_skipped = [name for b in batches(uint8_folder(root), batch, 0) for name in b.skipped]
    device_set = deferring(uint8_folder(root))
    device_skipped = on_device(device_set, batches(device_set, batch, 0), device)[1]
    mine = sorted(Path(name).name for name in device_skipped)
    theirs = sorted(Path(name).name for name in workers_skipped)
    return {"device_skipped": mine, "workers_skipped": theirs, "same": mine == theirs}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "device_decode.jsonl")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_folder(root, args.images)
        result = pixels_and_rate(root, device, args.batch, args.rounds)
        cut = add_cut_files(root)
        result["broken"] = broken_files(root, device, args.batch)
    record = with_machine({
        "benchmark": "device_decode", "device": str(device),
        "setup": {"images": args.images, "source": "500x375 JPEG quality 90",
                  "cut_files": [Path(path).name for path in cut], "batch": args.batch,
                  "rounds": args.rounds, "output": "224x224"},
        **result, "machine": {"device": device.type}})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as file:
        file.write(json.dumps(record) + "\n")
    print(json.dumps({key: record[key] for key in ("broken", "pixels",
                                                   "device_images_per_second")}, indent=1))
    return record


if __name__ == "__main__":
    main()
