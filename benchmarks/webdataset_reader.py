"""Random access into WebDataset shards: bigbatch's tarfile index vs the webdataset project's wids.

bigbatch reads example i of epoch e wherever the global batch plan puts it, so what counts is
(1) building the index of a shard and (2) fetching the image bytes of samples in a random order
over all shards (one epoch of the sampler's permutation). On generated shards (SHARDS x
SAMPLES samples, each a JPEG-sized member of random bytes and a .cls label; page cache warm):

* bigbatch: ``webdataset.scan_shard`` (tarfile headers) once, the index cached as .npz; reads
  by offset from memory-mapped shards (``WebDatasetImages.encoded``),
* wids (``pip install webdataset==0.2.111``; wids is not in webdataset 1.0):
  ``MMIndexedTar`` indexes a shard each time it opens it (its mmap reader keeps no index file),
  and ``ShardListDataset`` keeps ``lru_size`` shards open (default 10), read with and without
  enough room for every shard; shards are given as local paths with an identity ``localname``
  (wids would otherwise copy each shard into its download cache first).

Methods run interleaved for ``--rounds`` rounds; medians and ranges go to stdout and are
appended to docs/results/webdataset_reader.jsonl.

    python benchmarks/webdataset_reader.py [--shards 32] [--samples 64] [--rounds 5]
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from bigbatch.data import webdataset
from bigbatch.data.webdataset import WebDatasetImages, read_cached_index, scan_shard

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import append_result  # noqa: E402
from input_pipeline import machine_info  # noqa: E402

MEMBER_BYTES = 110_000  # about an ImageNet JPEG


def write_shards(folder: Path, shards: int, samples: int, seed: int = 0) -> list[Path]:
    rng = np.random.default_rng(seed)
    paths = []
    for shard in range(shards):
        path = folder / f"train-{shard:04d}.tar"
        with tarfile.open(path, "w") as tar:
            for k in range(samples):
                key = f"{shard:04d}_{k:05d}"
                size = int(rng.integers(MEMBER_BYTES // 2, MEMBER_BYTES * 3 // 2))
                for extension, data in (("jpg", rng.bytes(size)),
                                        ("cls", str(k % 1000).encode())):
                    info = tarfile.TarInfo(f"{key}.{extension}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def timed(run: Callable[[], int]) -> float:
    """Seconds per item of one call of ``run`` (which returns its item count)."""
    start = time.perf_counter()
    count = run()
    return (time.perf_counter() - start) / count


def index_methods(paths: list[Path], cache: Path) -> dict[str, Callable[[], int]]:
    from wids.wids_mmtar import MMIndexedTar

    for path in paths:
        webdataset.shard_index(path, cache)  # writes the cached index beside the shard
    stamps = [webdataset._stamp(path) for path in paths]
    cached = [webdataset.index_locations(path, cache)[0] for path in paths]

    def bigbatch_scan() -> int:
        for path in paths:
            scan_shard(path)
        return len(paths)

    def bigbatch_cached() -> int:
        for path, stamp in zip(cached, stamps, strict=True):
            assert read_cached_index(path, stamp) is not None
        return len(paths)

    def wids_open() -> int:
        for path in paths:
            MMIndexedTar(str(path)).close()
        return len(paths)

    return {"bigbatch_tarfile_scan": bigbatch_scan, "bigbatch_cached_index": bigbatch_cached,
            "wids_mmindexedtar_open": wids_open}


def read_methods(paths: list[Path], order: np.ndarray, cache: Path
                 ) -> dict[str, Callable[[], int]]:
    from wids import ShardListDataset

    ours = WebDatasetImages(paths, cache_dir=cache)
    samples = len(ours) // len(paths)
    described = [{"url": str(path), "nsamples": samples} for path in paths]

    def wids_dataset(lru_size: int) -> ShardListDataset:
        return ShardListDataset(described, lru_size=lru_size, localname=lambda url: url,
                                transformations=[lambda sample: sample])

    few, every = wids_dataset(10), wids_dataset(len(paths) + 1)

    def bigbatch_read() -> int:
        for index in order:
            ours.encoded(int(index))
        return len(order)

    def wids_read(dataset: ShardListDataset) -> Callable[[], int]:
        def run() -> int:
            for index in order:
                dataset[int(index)][".jpg"].getvalue()
            return len(order)
        return run

    return {"bigbatch_mmap_by_offset": bigbatch_read, "wids_lru10": wids_read(few),
            f"wids_lru{len(paths) + 1}": wids_read(every)}


def measure(methods: dict[str, Callable[[], int]], rounds: int) -> dict[str, list[float]]:
    """Seconds per item of each method per round, interleaved; a warm-up round first."""
    times: dict[str, list[float]] = {name: [] for name in methods}
    for round_index in range(rounds + 1):
        for name, run in methods.items():
            seconds = timed(run)
            if round_index:
                times[name].append(seconds)
    return times


def summary(times: dict[str, list[float]], unit: float) -> dict:
    return {name: {"median": round(statistics.median(t) / unit, 2),
                   "range": [round(min(t) / unit, 2), round(max(t) / unit, 2)]}
            for name, t in times.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--samples", type=int, default=64, help="samples per shard")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        paths = write_shards(work, args.shards, args.samples)
        order = np.random.default_rng(1).permutation(args.shards * args.samples)
        index_times = measure(index_methods(paths, work / "cache"), args.rounds)
        read_times = measure(read_methods(paths, order, work / "cache"), args.rounds)
    result = {
        "benchmark": "webdataset_reader",
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "setup": {"shards": args.shards, "samples_per_shard": args.samples,
                  "member_bytes": f"{MEMBER_BYTES // 2}-{MEMBER_BYTES * 3 // 2} random + .cls",
                  "rounds": args.rounds, "page_cache": "warm",
                  "read_order": "one random permutation of all samples"},
        "index_ms_per_shard": summary(index_times, 1e-3),
        "read_us_per_sample": summary(read_times, 1e-6),
        "machine": machine_info(),
    }
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    if not args.no_save:
        append_result("webdataset_reader", result)
    return result


if __name__ == "__main__":
    main()
