"""Write an image folder as WebDataset shards of reduced-size JPEGs.

``dst/train-0000.tar, ...`` and ``dst/val-0000.tar, ...``: sample k of a split is the members
``KKKKKKKK.jpg`` (the image with its shorter side shrunk to at most ``short_side``, re-encoded
as JPEG, as ``bigbatch data pack`` does for its own shards) and ``KKKKKKKK.cls`` (the class
index, classes numbered in sorted folder order of train/). Read back with
``--dataset webdataset --data dst``. A split's shards are written under temporary names and
renamed into place when all are complete.
"""

from __future__ import annotations

import io
import logging
import os
import tarfile
from pathlib import Path

from bigbatch.data.pack import (
    DEFAULT_SHARD_BYTES,
    PackSummary,
    SourceSplit,
    check_writer_options,
)
from bigbatch.data.webdataset import INDEX_SUFFIX
from bigbatch.errors import DataError

log = logging.getLogger(__name__)


class TarShardWriter:
    """Appends samples to ``folder/.PREFIX-NNNN.tar.partial`` files of at most ``shard_bytes``
    (a sample is never split; one sample may exceed the size alone)."""

    def __init__(self, folder: Path, prefix: str, shard_bytes: int) -> None:
        self.folder, self.prefix, self.shard_bytes = folder, prefix, shard_bytes
        self.written: list[Path] = []
        self.tar: tarfile.TarFile | None = None
        self.total = 0

    def _partial(self, shard: int) -> Path:
        return self.folder / f".{self.prefix}-{shard:04d}.tar.partial"

    def write(self, key: str, members: dict[str, bytes]) -> None:
        size = sum(512 + -(-len(data) // 512) * 512 for data in members.values())
        if self.tar is None or (self.tar.offset and self.tar.offset + size > self.shard_bytes):
            self.close()
            self.written.append(self._partial(len(self.written)))
            self.tar = tarfile.open(self.written[-1], "w", format=tarfile.USTAR_FORMAT)
        for extension, data in members.items():
            info = tarfile.TarInfo(f"{key}.{extension}")
            info.size, info.mode = len(data), 0o444
            self.tar.addfile(info, io.BytesIO(data))
        self.total += size

    def close(self) -> None:
        if self.tar is not None:
            self.tar.close()
            self.tar = None

    def install(self) -> list[Path]:
        """Rename the complete shards into place, removing the split's older shards."""
        self.close()
        for old in self.folder.glob(f"{self.prefix}-*.tar"):
            old.unlink()
            old.with_name(old.name + INDEX_SUFFIX).unlink(missing_ok=True)
        final = []
        for partial in self.written:
            final.append(partial.with_name(partial.name[1:-len(".partial")]))
            os.replace(partial, final[-1])
        return final

    def discard(self) -> None:
        self.close()
        for partial in self.written:
            partial.unlink(missing_ok=True)


def write_split(source: Path, split: str, target: Path, class_names: list[str] | None, *,
                short_side: int, quality: int, shard_bytes: int, workers: int,
                on_broken: str) -> tuple[list[str], int, int, list[str]]:
    """Write one split's shards. Returns (class names, images, bytes, skipped paths)."""
    images = SourceSplit.scan(source, split, class_names)
    writer = TarShardWriter(target, split, shard_bytes)
    try:
        for k, data, _, _ in images.readable(short_side, "jpeg", quality, workers, on_broken):
            writer.write(f"{k:08d}", {"jpg": data, "cls": str(int(images.labels[k])).encode()})
        if len(images.skipped) == len(images.files):
            raise DataError(f"no readable images in {images.directory}")
        writer.install()
    except BaseException:
        writer.discard()
        raise
    return images.classes, len(images.files) - len(images.skipped), writer.total, images.skipped


def write_webdataset(src_root: str | os.PathLike, dst_root: str | os.PathLike, *,
                     short_side: int = 256, quality: int = 90,
                     splits: tuple[str, ...] = ("train", "val"),
                     shard_bytes: int = DEFAULT_SHARD_BYTES, workers: int | None = None,
                     on_broken: str = "skip", overwrite: bool = False) -> PackSummary:
    """Write ``src_root/<split>/<class>/<image>`` as ``dst_root/<split>-NNNN.tar`` shards;
    arguments as pack.pack_imagefolder's (JPEG encoding only)."""
    workers = check_writer_options(on_broken, short_side, quality, workers)
    source, target = Path(src_root), Path(dst_root)
    target.mkdir(parents=True, exist_ok=True)
    summary = PackSummary(root=target)
    class_names: list[str] | None = None
    for split in splits:
        if any(target.glob(f"{split}-*.tar")) and not overwrite:
            raise DataError(f"{target} already holds {split}-*.tar shards; delete them or "
                            "pack with --overwrite")
        class_names, count, size, skipped = write_split(
            source, split, target, class_names, short_side=short_side, quality=quality,
            shard_bytes=shard_bytes, workers=workers, on_broken=on_broken)
        summary.images[split], summary.bytes[split] = count, size
        summary.skipped[split] = skipped
        log.info("wrote %d %s images (%.1f MB) as WebDataset shards in %s", count, split,
                 size / 1e6, target)
    return summary
