"""Packed image folders: each split pre-resized into a few memory-mappable shard files.

Decoding a full-size ImageNet JPEG is most of the input pipeline's cost, and reading a million
small files is slow on network file systems. ``pack_imagefolder`` decodes every image once,
shrinks its shorter side to at most ``short_side`` (256: the training crop and the evaluation
resize for 224 outputs both fit), and appends it to shard files as either

* ``"jpeg"``: re-encoded JPEG (quality 90), about 2.5x smaller than ImageNet's originals and about
  2x faster to decode; ImageNet needs about 40 GB, or
* ``"raw"``: uint8 RGB pixels, no decoding at all (the fastest; about 250 KB an image, so
  ImageNet needs about 330 GB of disk, best with page cache to match).

The aspect ratio is kept, so ``PackedImages`` applies the same augmentation contract as
ImageFolderData: crops are drawn from example_generator(seed, epoch, index) on the stored image
(the Inception crop is scale-invariant, so the crop distribution is unchanged; small crops are
upsampled from fewer pixels, the usual price of pre-resizing).

Layout: ``dst/<split>/shard-00000.bin ...`` plus ``dst/<split>/index.npz`` (per-image shard,
offset, size, height, width, label, CRC-32 of the record, source path; JSON metadata with class
names and format). Each split is built in a temporary folder and renamed into place when complete.

Damage is caught on read: an index that is not a readable .npz, lacks a column or has columns of
unequal length, or a shard shorter than its records, is a DataError naming the file; a record
whose CRC-32 differs from the index's (a flipped or zeroed byte in a shard) is an unreadable image,
skipped or an error as ``on_broken`` says. JPEG decoding would miss most such damage (the decoder
draws whatever the bytes say) and raw pixels have no structure to check at all; CRC-32 costs
about 0.1 ms for a 256x341 raw record, a tenth of its crop (format 1 packs, written before the
checksums, are still read, unchecked).
"""

from __future__ import annotations

import io
import json
import logging
import multiprocessing
import os
import shutil
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from bigbatch.data.base import ON_BROKEN, IndexedImages, MappedFiles
from bigbatch.data.imagefolder import check_data_root, scan_split, strided_subset
from bigbatch.data.transforms import (
    DECODE_ERRORS,
    Box,
    image_planes,
    resample_crop,
    to_rgb,
)
from bigbatch.errors import ConfigError, DataError

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: per-record CRC-32 (format 1 is read, without the check)
READABLE_VERSIONS = (1, 2)
COLUMNS = ("shard", "offset", "size", "height", "width", "label")
META_KEYS = ("version", "encoding", "classes", "shards")
ENCODINGS = ("jpeg", "raw")
INDEX_NAME = "index.npz"
DEFAULT_SHARD_BYTES = 1 << 30


@dataclass
class PackSummary:
    """What pack_imagefolder wrote, per split."""

    root: Path
    images: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, list[str]] = field(default_factory=dict)


def shrunk_size(width: int, height: int, short_side: int) -> tuple[int, int]:
    """(width, height) with the shorter side at most ``short_side``, aspect ratio kept."""
    scale = short_side / min(width, height)
    if scale >= 1:
        return width, height
    return max(1, round(width * scale)), max(1, round(height * scale))


def shrink_image(path: str, short_side: int) -> Image.Image:
    """The image at ``path`` as RGB with its shorter side at most ``short_side``.

    JPEGs are decoded at the largest DCT reduction that keeps the shorter side at least
    ``short_side`` (no resolution below the target is lost). Raises one of DECODE_ERRORS.
    """
    with Image.open(path) as image:
        width, height = image.size
        target = shrunk_size(width, height, short_side)
        if image.format == "JPEG" and target != (width, height):
            factor = min(width, height) // short_side
            if factor >= 2:
                image.draft("RGB", (width // factor, height // factor))
        image.load()
        rgb = to_rgb(image)
        if rgb.size != target:
            rgb = rgb.resize(target, Image.Resampling.BILINEAR)
        return rgb


def encode_record(task: tuple[str, int, str, int]) -> tuple[bytes | None, int, int, str]:
    """(record bytes or None, height, width, error) for one image; runs in pool workers."""
    path, short_side, encoding, quality = task
    try:
        image = shrink_image(path, short_side)
    except DECODE_ERRORS as error:
        return None, 0, 0, f"{type(error).__name__}: {error}"
    if encoding == "raw":
        data = np.ascontiguousarray(np.asarray(image, dtype=np.uint8)).tobytes()
    else:
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=quality)
        data = buffer.getvalue()
    return data, image.height, image.width, ""


class ShardWriter:
    """Appends records to shard-NNNNN.bin files of at most ``shard_bytes`` (one record may
    exceed it alone) and remembers where each went."""

    def __init__(self, folder: Path, shard_bytes: int) -> None:
        self.folder = folder
        self.shard_bytes = shard_bytes
        self.shard = -1
        self.file: io.BufferedWriter | None = None
        self.position = 0
        self.total = 0

    def _next_shard(self) -> None:
        self.close()
        self.shard += 1
        self.file = open(shard_file(self.folder, self.shard), "wb")
        self.position = 0

    def write(self, data: bytes) -> tuple[int, int]:
        """(shard, offset) of ``data`` once written."""
        if self.file is None or (self.position and self.position + len(data) > self.shard_bytes):
            self._next_shard()
        assert self.file is not None
        offset = self.position
        self.file.write(data)
        self.position += len(data)
        self.total += len(data)
        return self.shard, offset

    def close(self) -> None:
        if self.file is not None:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            self.file = None


def encoded_records(tasks: list[tuple[str, int, str, int]], workers: int
                    ) -> Iterator[tuple[bytes | None, int, int, str]]:
    """encode_record over ``tasks`` in order, in a process pool when workers > 1."""
    if workers <= 1:
        yield from map(encode_record, tasks)
        return
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        yield from pool.imap(encode_record, tasks, chunksize=8)


@dataclass
class SourceSplit:
    """One split of an image folder, as a shard writer reads it."""

    directory: Path
    files: np.ndarray  # paths relative to ``directory``, as bytes
    labels: np.ndarray
    classes: list[str]
    skipped: list[str] = field(default_factory=list)

    @classmethod
    def scan(cls, source: Path, split: str, class_names: list[str] | None) -> SourceSplit:
        directory = check_data_root(source, split)
        files, labels, classes, _ = scan_split(directory, class_names)
        return cls(directory, files, labels, classes)

    def path(self, index: int) -> str:
        return os.path.join(self.directory, os.fsdecode(self.files[index]))

    def readable(self, short_side: int, encoding: str, quality: int, workers: int,
                 on_broken: str) -> Iterator[tuple[int, bytes, int, int]]:
        """(index, encoded bytes, height, width) of each readable image, in order. An
        unreadable one is logged and listed in ``skipped``, or raises DataError with
        on_broken="error"."""
        tasks = [(self.path(k), short_side, encoding, quality) for k in range(len(self.files))]
        for k, (data, height, width, error) in enumerate(encoded_records(tasks, workers)):
            if data is None:
                if on_broken == "error":
                    raise DataError(f"cannot read image {self.path(k)}: {error}; replace or "
                                    "delete the file, or pack with on_broken=skip")
                log.warning("skipping unreadable image %s: %s", self.path(k), error)
                self.skipped.append(self.path(k))
                continue
            yield k, data, height, width


def pack_split(source: Path, split: str, target: Path, class_names: list[str] | None, *,
               short_side: int, encoding: str, quality: int, shard_bytes: int, workers: int,
               on_broken: str) -> tuple[list[str], int, int, list[str]]:
    """Pack one split into ``target`` (a fresh folder). Returns (class names, images written,
    bytes written, skipped paths)."""
    images = SourceSplit.scan(source, split, class_names)
    writer = ShardWriter(target, shard_bytes)
    columns: dict[str, list[int]] = {k: [] for k in (*COLUMNS, "crc32")}
    kept: list[bytes] = []
    try:
        for k, data, height, width in images.readable(short_side, encoding, quality, workers,
                                                      on_broken):
            shard, offset = writer.write(data)
            for name, value in zip(columns, (shard, offset, len(data), height, width,
                                             int(images.labels[k]), zlib.crc32(data)),
                                   strict=True):
                columns[name].append(value)
            kept.append(images.files[k])
    finally:
        writer.close()
    if not kept:
        raise DataError(f"no readable images in {images.directory}")
    meta = {"version": FORMAT_VERSION, "encoding": encoding, "short_side": short_side,
            "quality": quality, "classes": images.classes, "split": split,
            "shards": writer.shard + 1, "skipped": images.skipped}
    arrays = {name: np.array(values, dtype=np.int64) for name, values in columns.items()}
    write_index(target / INDEX_NAME, arrays, np.array(kept, dtype=np.bytes_), meta)
    return images.classes, len(kept), writer.total, images.skipped


def write_index(path: Path, arrays: dict[str, np.ndarray], sources: np.ndarray,
                meta: dict) -> None:
    """Write an index .npz atomically: into a temporary file of its own (processes writing
    the same index at once do not share it), then renamed over ``path``."""
    descriptor, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                                           suffix=".partial")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            np.savez(handle, **arrays, source=sources, meta=np.array(json.dumps(meta)))
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(partial, 0o644)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def install_split(built: Path, final: Path) -> None:
    """Move a completely built split folder to its final name, replacing an older one."""
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    if final.exists():
        os.replace(final, old)
    os.replace(built, final)
    shutil.rmtree(old, ignore_errors=True)


def check_writer_options(on_broken: str, short_side: int, quality: int,
                         workers: int | None) -> int:
    """Check the options every shard writer shares; return the number of decoding processes
    (``workers``, or all cores this process may use)."""
    if on_broken not in ON_BROKEN:
        raise ConfigError(f"on_broken must be one of {', '.join(ON_BROKEN)}, got {on_broken!r}")
    if short_side < 1 or not 1 <= quality <= 100:
        raise ConfigError(f"short_side must be positive and quality in 1..100, got "
                          f"{short_side} and {quality}")
    if workers is not None:
        return workers
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


def pack_imagefolder(src_root: str | os.PathLike, dst_root: str | os.PathLike, *,
                     short_side: int = 256, encoding: str = "jpeg", quality: int = 90,
                     splits: tuple[str, ...] = ("train", "val"),
                     shard_bytes: int = DEFAULT_SHARD_BYTES, workers: int | None = None,
                     on_broken: str = "skip", overwrite: bool = False) -> PackSummary:
    """Pack ``src_root/<split>/<class>/<image>`` into ``dst_root/<split>/`` shards + index.

    Args:
        src_root: an image folder as read by ImageFolderData.
        dst_root: output folder (created).
        short_side: shorter side after shrinking; smaller images are kept as they are (256).
        encoding: "jpeg" (re-encoded at ``quality``) or "raw" (uint8 RGB pixels).
        quality: JPEG quality (90).
        splits: splits to pack; val is labelled with train's classes ("train", "val").
        shard_bytes: target shard size (1 GiB).
        workers: decoding processes (default: all cores this process may use).
        on_broken: "skip" (leave unreadable images out, listed in the index) or "error".
        overwrite: replace splits packed before (otherwise that is a DataError).
    """
    if encoding not in ENCODINGS:
        raise ConfigError(f"encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
    workers = check_writer_options(on_broken, short_side, quality, workers)
    source, target_root = Path(src_root), Path(dst_root)
    target_root.mkdir(parents=True, exist_ok=True)
    summary = PackSummary(root=target_root)
    class_names: list[str] | None = None
    for split in splits:
        final = target_root / split
        if final.exists() and not overwrite:
            raise DataError(f"{final} already exists; delete it or pack with overwrite=True")
        built = target_root / f".{split}.partial-{os.getpid()}"
        shutil.rmtree(built, ignore_errors=True)
        built.mkdir()
        try:
            class_names, count, size, skipped = pack_split(
                source, split, built, class_names, short_side=short_side, encoding=encoding,
                quality=quality, shard_bytes=shard_bytes, workers=workers, on_broken=on_broken)
        except BaseException:
            shutil.rmtree(built, ignore_errors=True)
            raise
        install_split(built, final)
        summary.images[split], summary.bytes[split] = count, size
        summary.skipped[split] = skipped
        log.info("packed %d %s images (%.1f MB) into %s", count, split, size / 1e6, final)
    return summary


@dataclass(frozen=True)
class PackedIndex:
    """The parsed index.npz of one packed split."""

    folder: Path
    shard: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    height: np.ndarray
    width: np.ndarray
    label: np.ndarray
    source: np.ndarray
    meta: dict
    crc32: np.ndarray | None = None  # None: a format 1 pack, records unchecked


def read_index(folder: Path) -> PackedIndex:
    """Load and check a split's index: readable, complete, a known format, and shards long
    enough for it. Anything else is a DataError naming the file."""
    path = folder / INDEX_NAME
    if not path.is_file():
        raise DataError(f"no {INDEX_NAME} in {folder}; pack the image folder first "
                        "(bigbatch.data.pack.pack_imagefolder)")
    arrays, meta = load_index_file(path)
    if meta.get("version") not in READABLE_VERSIONS or meta.get("encoding") not in ENCODINGS:
        raise DataError(f"{path} is packed format {meta.get('version')} "
                        f"({meta.get('encoding')}); this version reads format {FORMAT_VERSION}; "
                        "pack the split again")
    index = PackedIndex(folder=folder, meta=meta, **arrays)
    for shard in range(meta["shards"]):
        shard_path = shard_file(folder, shard)
        in_shard = index.shard == shard
        needed = int((index.offset[in_shard] + index.size[in_shard]).max(initial=0))
        have = shard_path.stat().st_size if shard_path.is_file() else -1
        if have < needed:
            raise DataError(f"{shard_path} is missing or truncated ({max(have, 0)} of {needed} "
                            "bytes); pack the split again")
    return index


def load_index_file(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    """The columns and metadata of an index file, every one present and of one length."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
        meta = json.loads(str(arrays.pop("meta")))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
        reason = "no metadata" if isinstance(error, KeyError) else f"{error}".splitlines()[0]
        raise DataError(f"cannot read {path} ({reason}); pack the split again") from None
    expected = (*COLUMNS, "source") + (("crc32",) if meta.get("version", 0) >= 2 else ())
    missing = [name for name in expected if name not in arrays]
    missing += [f"meta.{key}" for key in META_KEYS if key not in meta]
    if missing:
        raise DataError(f"{path} lacks {', '.join(missing)}; pack the split again")
    unknown = sorted(set(arrays) - set(expected))
    lengths = {len(arrays[name]) for name in expected}
    if unknown or len(lengths) != 1:
        raise DataError(f"{path} is damaged (columns of unequal length or unknown columns "
                        f"{', '.join(unknown) or 'none'}); pack the split again")
    return arrays, meta


def shard_file(folder: Path, shard: int) -> Path:
    return folder / f"shard-{shard:05d}.bin"


class PackedImages(IndexedImages):
    """Map-style packed split keyed by (index, epoch); ``__getitems__`` returns a Batch.

    The same crops and flips as ImageFolderData (see transforms.example_crop), taken from the
    pre-resized images. Arguments as ImageFolderData's; ``resize_size`` defaults to the usual
    256/224 ratio; ``normalize=False`` gives uint8 images (see transforms.normalize_images).
    Shards are memory-mapped lazily, once per process, so DataLoader workers share
    the page cache instead of copying data.
    """

    noun = "packed image"
    remedy = "pack the split again"

    def __init__(self, root: str | os.PathLike, split: str = "train", train: bool = True,
                 seed: int = 0, image_size: int = 224, resize_size: int | None = None,
                 on_broken: str = "skip", fast_decode: bool = True,
                 subset: int | None = None, normalize: bool = True,
                 augment: bool | None = None) -> None:
        super().__init__(train=train, seed=seed, image_size=image_size, resize_size=resize_size,
                         on_broken=on_broken, fast_decode=fast_decode, normalize=normalize,
                         augment=augment)
        self.root = Path(root)
        self.split = split
        self.index = read_index(self.root / split)
        rows = np.arange(len(self.index.label))
        if subset is not None:
            rows = rows[strided_subset(len(rows), subset, train)]
        self.rows = rows
        self.labels = self.index.label[self.rows]
        self.classes: list[str] = list(self.index.meta["classes"])
        self.num_classes = len(self.classes)
        self.encoding: str = self.index.meta["encoding"]
        self.shards = MappedFiles([shard_file(self.index.folder, shard)
                                   for shard in range(self.index.meta["shards"])])

    def source(self, index: int) -> str:
        """The original image's path relative to its split folder (for messages)."""
        return os.fsdecode(self.index.source[self.rows[index]])

    def describe(self, index: int) -> str:
        return f"{self.root / self.split}[{index}] ({self.source(index)})"

    def record(self, index: int) -> np.ndarray:
        """The stored bytes of example ``index`` (a view into the memory-mapped shard)."""
        row = self.rows[index]
        shard, offset = int(self.index.shard[row]), int(self.index.offset[row])
        data = self.shards.read(shard, offset, int(self.index.size[row]))
        expected = self.index.crc32
        if expected is not None and zlib.crc32(data) != int(expected[row]):
            raise ValueError(f"record at byte {offset} of {self.shards.paths[shard]} "
                             "fails its CRC-32 check (the shard is damaged)")
        return data

    def encoded(self, index: int) -> bytes:
        return self.record(index).tobytes()

    def defer_jpegs_to_device(self) -> bool:
        """Raw records are pixels, not JPEGs: the loader resamples them whatever the setting."""
        if self.encoding != "raw":
            return super().defer_jpegs_to_device()
        log.warning("%s holds raw pixels, not JPEGs: data.decode_on_device has nothing to "
                    "decode", self.root / self.split)
        return False

    def load_image(self, index: int, epoch: int) -> torch.Tensor:
        """One example as a 3 x image_size x image_size uint8 tensor (raises DECODE_ERRORS)."""
        if self.encoding != "raw":
            return super().load_image(index, epoch)
        box_for_size, flip = self.crop_plan(index, epoch)
        row = self.rows[index]
        height, width = int(self.index.height[row]), int(self.index.width[row])
        image = Image.frombuffer("RGB", (width, height), self.record(index), "raw", "RGB", 0, 1)
        box: Box = box_for_size(width, height)
        return image_planes(resample_crop(image, box, self.image_size), flip)
