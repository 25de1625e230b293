"""WebDataset tar shards read by example index, for world-size-invariant, exactly resumable runs.

WebDataset's convention: a sample is the run of consecutive tar members sharing a key (the
member name up to the first dot of its base name), one member per extension, e.g.
``n01440764_10026.jpg`` + ``n01440764_10026.cls``. A sample never spans two shards.

WebDataset's own readers stream shards in order; bigbatch needs example ``i`` of epoch ``e``
on whichever rank the global batch plan says (data/sampler.py), so each shard is scanned once
with Python's ``tarfile`` into an index of (key, image offset, image size, label, flaw), cached
beside the shard (``SHARD.tar.index.npz``), or in ~/.cache/bigbatch/webdataset when the shard's
folder is read-only; the index records the shard's size and modification time and is rebuilt
when they change. Samples are then read from memory-mapped shards by offset and decoded through
the image-folder route (data/decode.py: libjpeg-turbo into a uint8 tensor, reduced-scale JPEG
decoding where that loses nothing).

The image is the first member with an image extension (jpg, jpeg, png, webp, ...); the label
is the integer in the ``.cls`` member, else the "label" (or "cls") field of the ``.json``
member. Samples without an image, without a readable label, or with a label outside
0..num_classes-1 stay in the index and are skipped and reported at load time like broken
image files.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
import tarfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bigbatch.data.base import BrokenExample, IndexedImages, MappedFiles
from bigbatch.data.imagefolder import IMAGE_EXTENSIONS, strided_subset
from bigbatch.data.pack import write_index
from bigbatch.errors import DataError

log = logging.getLogger(__name__)

INDEX_SUFFIX = ".index.npz"
INDEX_VERSION = 1
IMAGE_MEMBERS = frozenset(ext.lstrip(".") for ext in IMAGE_EXTENSIONS)
# Flaw codes stored in the index; the out-of-range label is judged against num_classes later.
FLAWS = ("", "no image member", "no label member (.cls or .json)", "unreadable label",
         "image member cut off by the end of the shard")
NO_IMAGE, NO_LABEL, BAD_LABEL, CUT_OFF = 1, 2, 3, 4
_BRACES = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "bigbatch" / "webdataset"


# --------------------------------------------------------------------------- naming the shards


def expand_braces(pattern: str) -> list[str]:
    """All names of a brace pattern, in order: ``{0000..0099}`` (zero-padded to the widest end
    when an end has a leading zero), ``{a,b,c}``; several groups multiply out."""
    match = _BRACES.search(pattern)
    if match is None:
        return [pattern]
    head, tail = pattern[:match.start()], pattern[match.end():]
    body = match.group(1)
    span = _RANGE.match(body)
    if span:
        first, last = span.groups()
        padded = any(len(end.lstrip("-")) > 1 and end.lstrip("-").startswith("0")
                     for end in (first, last))
        width = max(len(first), len(last)) if padded else 0
        step = 1 if int(last) >= int(first) else -1
        items = [f"{n:0{width}d}" for n in range(int(first), int(last) + step, step)]
    else:
        items = body.split(",")
    return [name for item in items for name in expand_braces(head + item + tail)]


def shard_paths(spec: str | os.PathLike, prefix: str = "") -> list[Path]:
    """The shards that ``spec`` names: a brace pattern or glob, a .tar file, a folder (its
    ``PREFIX-*.tar`` if any, else every .tar), or a list file (one shard, pattern or glob per
    line, relative to the list file; blank lines and # comments ignored)."""
    text = os.fspath(spec)
    if "{" in text:
        paths = [Path(name) for name in expand_braces(text)]
        missing = [path for path in paths if not path.is_file()]
        if missing:
            raise DataError(f"shard {missing[0]} of {text} does not exist "
                            f"({len(missing)} of {len(paths)} missing)")
        return paths
    if glob.has_magic(text):
        return _non_empty(sorted(Path(name) for name in glob.glob(text)), text)
    path = Path(text)
    if path.is_dir():
        named = sorted(path.glob(f"{prefix}-*.tar")) if prefix else []
        return _non_empty(named or sorted(path.glob("*.tar")), text)
    if not path.is_file():
        raise DataError(f"{text} does not exist; pass shards as PATH/train-{{0000..0099}}.tar, a "
                        "folder of .tar shards or a file listing them")
    if tarfile.is_tarfile(path):
        return [path]
    return _non_empty(_listed(path), text)


def _listed(list_file: Path) -> list[Path]:
    paths: list[Path] = []
    for line in list_file.read_text().splitlines():
        entry = line.split("#", 1)[0].strip()
        if entry:
            paths.extend(shard_paths(entry if os.path.isabs(entry)
                                     else os.path.join(list_file.parent, entry)))
    return paths


def _non_empty(paths: list[Path], spec: str) -> list[Path]:
    if not paths:
        raise DataError(f"no .tar shards in {spec}")
    return paths


def split_shards(data: str, val_path: str | None) -> tuple[list[Path], list[Path]]:
    """(training shards, validation shards) of ``--data`` and ``data.val_path``; without a
    val_path, a folder's ``val-*.tar`` are the validation shards."""
    train = shard_paths(data, prefix="train")
    if val_path:
        return train, shard_paths(val_path)
    folder = Path(data)
    val = sorted(folder.glob("val-*.tar")) if folder.is_dir() else []
    if not val:
        raise DataError(f"no validation shards for {data}; name them with --set "
                        "data.val_path='PATH/val-{0000..0003}.tar' or put val-*.tar beside "
                        "train-*.tar in one folder")
    return train, val


# --------------------------------------------------------------------------- the index


@dataclass(frozen=True)
class ShardIndex:
    """One shard's samples in order: key, image offset and size (bytes), label (-1 if none)
    and flaw code (see FLAWS)."""

    key: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    label: np.ndarray
    flaw: np.ndarray

    def __len__(self) -> int:
        return len(self.key)


def split_member_name(name: str) -> tuple[str, str] | None:
    """(key, extension) of a member name as WebDataset splits it: at the first dot of the
    base name; the extension lower-cased. None for names without one."""
    folder, _, base = name.rpartition("/")
    stem, dot, extension = base.partition(".")
    if not dot or not stem:
        return None
    return (f"{folder}/{stem}" if folder else stem), extension.lower()


def parse_label(extension: str, data: bytes) -> int:
    """The class index stored in a ``.cls`` or ``.json`` member (ValueError if unreadable)."""
    if extension == "cls":
        return int(data.decode("utf-8").strip())
    value = json.loads(data)
    if isinstance(value, dict):
        value = value.get("label", value.get("cls"))
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"no integer label in {data[:80]!r}")
    return value


class _Sample:
    """A sample while its members are scanned."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.offset = self.size = 0
        self.label: int | None = None
        self.flaw = NO_LABEL
        self.has_image = False

    def add(self, extension: str, member: tarfile.TarInfo, tar: tarfile.TarFile,
            shard_size: int) -> None:
        if extension in IMAGE_MEMBERS and not self.has_image:
            self.has_image = True
            self.offset, self.size = member.offset_data, member.size
        elif extension in ("cls", "json") and (self.label is None or extension == "cls"):
            if member.offset_data + member.size > shard_size:
                self.flaw = BAD_LABEL
                return
            try:
                self.label = parse_label(extension, tar.extractfile(member).read())
                self.flaw = 0
            except (ValueError, UnicodeDecodeError):
                self.flaw = BAD_LABEL

    def row(self, shard_size: int) -> tuple[str, int, int, int, int]:
        flaw = self.flaw
        if not self.has_image:
            flaw = NO_IMAGE
        elif self.offset + self.size > shard_size:
            flaw = CUT_OFF
        label = self.label if self.label is not None and not flaw else -1
        return self.key, self.offset, self.size, label, flaw


def shard_members(tar: tarfile.TarFile, path: Path) -> Iterator[tarfile.TarInfo]:
    """The file members of an open shard in order; a shard cut off after some members yields
    those (with a warning), as its last sample is then reported broken anyway."""
    count = 0
    while True:
        try:
            member = tar.next()
        except tarfile.ReadError as error:
            if not count:
                raise
            log.warning("shard %s ends inside a member (%s); using its first %d members", path,
                        error, count)
            return
        if member is None:
            return
        tar.members.clear()  # the headers are not needed again; keep memory flat
        count += 1
        if member.isfile():
            yield member


def scan_shard(path: Path) -> ShardIndex:
    """Index one shard by reading its member headers (data is skipped, labels are read)."""
    shard_size = path.stat().st_size
    rows: list[tuple[str, int, int, int, int]] = []
    sample: _Sample | None = None
    try:
        with tarfile.open(path, "r:") as tar:
            for member in shard_members(tar, path):
                named = split_member_name(member.name)
                if named is None:
                    continue
                key, extension = named
                if sample is None or key != sample.key:
                    if sample is not None:
                        rows.append(sample.row(shard_size))
                    sample = _Sample(key)
                sample.add(extension, member, tar, shard_size)
    except (tarfile.TarError, OSError) as error:
        raise DataError(f"cannot read shard {path}: {error}; replace the shard") from error
    if sample is not None:
        rows.append(sample.row(shard_size))
    keys, offsets, sizes, labels, flaws = zip(*rows, strict=True) if rows else ([],) * 5
    return ShardIndex(key=np.array([k.encode() for k in keys], dtype=np.bytes_),
                      offset=np.array(offsets, dtype=np.int64),
                      size=np.array(sizes, dtype=np.int64),
                      label=np.array(labels, dtype=np.int64),
                      flaw=np.array(flaws, dtype=np.int8))


def index_locations(shard: Path, cache_dir: Path) -> tuple[Path, Path]:
    """(beside the shard, in the cache folder) - where a shard's index may be cached."""
    resolved = shard.resolve()
    digest = hashlib.sha256(os.fsencode(resolved)).hexdigest()[:16]
    return (shard.with_name(shard.name + INDEX_SUFFIX),
            cache_dir / f"{digest}-{shard.name}{INDEX_SUFFIX}")


def _stamp(shard: Path) -> dict:
    stat = shard.stat()
    return {"version": INDEX_VERSION, "shard_bytes": stat.st_size,
            "shard_mtime_ns": stat.st_mtime_ns}


def read_cached_index(path: Path, stamp: dict) -> ShardIndex | None:
    """The index cached at ``path`` if it exists and was built from the shard as it is now."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
        meta = json.loads(str(arrays.pop("meta")))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None  # missing or damaged: built again
    if meta != stamp:
        return None
    return ShardIndex(key=arrays.pop("source"), **arrays)


def save_index(index: ShardIndex, stamp: dict, locations: Sequence[Path]) -> Path | None:
    """Write the index to the first location that accepts it; None if none does."""
    arrays = {"offset": index.offset, "size": index.size, "label": index.label,
              "flaw": index.flaw}
    for path in locations:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_index(path, arrays, index.key, stamp)
        except OSError as error:
            log.debug("cannot cache the shard index at %s: %s", path, error)
            continue
        return path
    log.warning("cannot cache the index of %s anywhere (%s); it will be rebuilt next time",
                locations[0].with_suffix(""), ", ".join(str(p.parent) for p in locations))
    return None


def shard_index(shard: Path, cache_dir: Path | None = None) -> ShardIndex:
    """The shard's index: cached if still valid, else scanned and cached."""
    stamp = _stamp(shard)
    locations = index_locations(shard, cache_dir or default_cache_dir())
    for path in locations:
        cached = read_cached_index(path, stamp)
        if cached is not None:
            return cached
    index = scan_shard(shard)
    save_index(index, stamp, locations)
    return index


def label_count(shards: Sequence[str | os.PathLike], cache_dir: Path | None = None) -> int:
    """The largest label in the shards + 1 (0 where none has a readable label), from their
    cached indexes."""
    return max(int(shard_index(Path(s), cache_dir).label.max(initial=-1)) for s in shards) + 1


def refuse_unknown_classes(val: WebDatasetImages) -> None:
    """DataError if a validation sample's label is num_classes or more: an accuracy must count
    every validation image, so such samples are not skipped as broken ones are."""
    beyond = np.flatnonzero((val.raw_labels >= val.num_classes) & (val.flaws == 0))
    if len(beyond):
        first = int(beyond[0])
        raise DataError(f"{len(beyond)} validation samples have labels outside 0.."
                        f"{val.num_classes - 1} (the first: {val.describe(first)}, label "
                        f"{val.raw_labels[first]}); set data.num_classes to "
                        f"{int(val.raw_labels.max()) + 1} or more")


# --------------------------------------------------------------------------- the data set


class WebDatasetImages(IndexedImages):
    """WebDataset shards as a map-style data set keyed by (index, epoch).

    Example i is the i-th sample in shard order (shards in the given order, samples in tar
    order). Arguments after ``shards`` as IndexedImages', plus:
        subset: keep only this many examples, spread evenly over the shards (default all).
        num_classes: labels must lie in 0..num_classes-1 (default: the largest label in these
            shards + 1); others are reported as broken. A run passes the count of both splits
            (bigbatch.data.build_datasets).
        cache_dir: where indexes go when a shard's folder is read-only
            (default ~/.cache/bigbatch/webdataset).
    """

    noun = "sample"
    remedy = "replace the shard or use on_broken=skip to skip broken samples"

    def __init__(self, shards: Sequence[str | os.PathLike], train: bool = True, seed: int = 0,
                 image_size: int = 224, resize_size: int | None = None,
                 on_broken: str = "skip", fast_decode: bool = True, subset: int | None = None,
                 normalize: bool = True, num_classes: int | None = None,
                 cache_dir: str | os.PathLike | None = None,
                 augment: bool | None = None) -> None:
        super().__init__(train=train, seed=seed, image_size=image_size, resize_size=resize_size,
                         on_broken=on_broken, fast_decode=fast_decode, normalize=normalize,
                         augment=augment)
        paths = [Path(shard) for shard in shards]
        if not paths:
            raise DataError("no shards given")
        start = time.perf_counter()
        indexes = [shard_index(path, Path(cache_dir) if cache_dir else None) for path in paths]
        self.files = MappedFiles(paths)
        self.shard = np.concatenate([np.full(len(ix), k, dtype=np.int32)
                                     for k, ix in enumerate(indexes)])
        columns = {name: np.concatenate([getattr(ix, name) for ix in indexes])
                   for name in ("key", "offset", "size", "label", "flaw")}
        if not len(columns["key"]):
            raise DataError(f"no samples in {len(paths)} shards ({paths[0]}, ...)")
        log.info("indexed %d samples in %d shards in %.1f s", len(columns["key"]), len(paths),
                 time.perf_counter() - start)
        self.num_classes = num_classes or int(columns["label"].max()) + 1
        if self.num_classes < 1:
            raise DataError(f"no sample in {paths[0]}, ... has a readable label (.cls or .json)")
        rows = np.arange(len(columns["key"]))
        if subset is not None:
            rows = rows[strided_subset(len(rows), subset, train)]
        self.rows = rows
        self.keys, self.offsets, self.sizes = (columns[n][rows] for n in ("key", "offset", "size"))
        self.shard = self.shard[rows]
        self.flaws = columns["flaw"][rows]
        raw_labels = columns["label"][rows]
        out_of_range = (raw_labels < 0) | (raw_labels >= self.num_classes)
        self.raw_labels = raw_labels
        self.labels = np.where(out_of_range | (self.flaws != 0), -1, raw_labels)
        self.classes = [str(label) for label in range(self.num_classes)]

    def describe(self, index: int) -> str:
        return f"{self.files.paths[self.shard[index]]}:{os.fsdecode(self.keys[index])}"

    def problem(self, index: int) -> str | None:
        """Why example ``index`` cannot be used, known from the index alone (None if nothing)."""
        flaw = int(self.flaws[index])
        if flaw:
            return FLAWS[flaw]
        if self.labels[index] < 0:
            return f"label {self.raw_labels[index]} outside 0..{self.num_classes - 1}"
        return None

    def encoded(self, index: int) -> bytes:
        problem = self.problem(index)
        if problem:
            raise BrokenExample(problem)
        return self.files.read(int(self.shard[index]), int(self.offsets[index]),
                               int(self.sizes[index])).tobytes()
