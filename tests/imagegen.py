"""Small generated image folders for tests: varied sizes and modes, plus broken and stray files.

Images are smooth random patterns (sums of sinusoids and discs) rather than noise, so that two
resamplings of the same region compare closely, as they would on photographs.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

# (width, height, PIL mode, file format) cycled over each class's good images.
GOOD_SPECS = [
    (500, 375, "RGB", "JPEG"),
    (300, 400, "L", "JPEG"),
    (64, 48, "CMYK", "JPEG"),
    (256, 256, "P", "PNG"),  # palette PNG data in a file named .JPEG
    (375, 500, "RGBA", "PNG"),
    (120, 90, "RGB", "JPEG"),
]


@dataclass
class FolderInfo:
    """What make_image_folder wrote (paths are absolute)."""

    root: Path
    classes: list[str]
    train_good: list[Path] = field(default_factory=list)
    train_broken: list[Path] = field(default_factory=list)
    val_good: list[Path] = field(default_factory=list)
    ignored: list[Path] = field(default_factory=list)


def smooth_pixels(width: int, height: int, rng: np.random.Generator) -> np.ndarray:
    """A height x width x 3 uint8 picture of low-frequency waves and a few filled discs."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    channels = []
    for _ in range(3):
        fx, fy = rng.uniform(2, 6, size=2) / max(width, height)
        phase = rng.uniform(0, 2 * np.pi)
        channels.append(0.5 + 0.35 * np.sin(2 * np.pi * (fx * x + fy * y) + phase))
    picture = np.stack(channels, axis=-1)
    for _ in range(3):
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        radius = rng.uniform(0.1, 0.3) * min(width, height)
        inside = (x - cx) ** 2 + (y - cy) ** 2 < radius**2
        picture[inside] = rng.uniform(0, 1, size=3)
    return np.clip(picture * 255, 0, 255).astype(np.uint8)


def encode_image(pixels: np.ndarray, mode: str, fmt: str, quality: int = 90) -> bytes:
    """The bytes of ``pixels`` converted to ``mode`` and saved as ``fmt``."""
    image = Image.fromarray(pixels, "RGB")
    if mode == "P":
        image = image.quantize(colors=64)
    elif mode != "RGB":
        image = image.convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **({"quality": quality} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def write_good_image(path: Path, spec: tuple[int, int, str, str], rng: np.random.Generator
                     ) -> Path:
    width, height, mode, fmt = spec
    path.write_bytes(encode_image(smooth_pixels(width, height, rng), mode, fmt))
    return path


def write_broken_images(folder: Path, rng: np.random.Generator) -> list[Path]:
    """A truncated JPEG, a zero-byte .JPEG and a text file named .JPEG."""
    whole = encode_image(smooth_pixels(400, 300, rng), "RGB", "JPEG")
    truncated = folder / "truncated.JPEG"
    truncated.write_bytes(whole[: len(whole) // 2])
    empty = folder / "empty.JPEG"
    empty.write_bytes(b"")
    text = folder / "text.JPEG"
    text.write_text("this is not an image\n")
    return [truncated, empty, text]


def make_image_folder(root: Path, classes: tuple[str, ...] = ("cat", "dog", "fish"),
                      per_class: int = 6, val_per_class: int = 2, broken: bool = True,
                      seed: int = 0) -> FolderInfo:
    """root/train/<class>/*.JPEG and root/val/<class>/*.JPEG with GOOD_SPECS images; with
    ``broken``, train/<classes[1]>/ also gets three unreadable .JPEG files and train/<classes[0]>/
    a README.txt (ignored for its extension)."""
    rng = np.random.default_rng(seed)
    info = FolderInfo(root=root, classes=list(classes))
    for split, count, good in (("train", per_class, info.train_good),
                               ("val", val_per_class, info.val_good)):
        for class_name in classes:
            folder = root / split / class_name
            folder.mkdir(parents=True, exist_ok=True)
            for k in range(count):
                spec = GOOD_SPECS[k % len(GOOD_SPECS)]
                suffix = ".png" if spec[2] == "RGBA" else ".JPEG"
                good.append(write_good_image(folder / f"{class_name}_{k:03d}{suffix}", spec, rng))
    if broken:
        info.train_broken = write_broken_images(root / "train" / classes[1], rng)
        readme = root / "train" / classes[0] / "README.txt"
        readme.write_text("not an image\n")
        info.ignored.append(readme)
    return info


def make_jpeg_folder(root: Path, count: int, size: tuple[int, int] = (500, 375),
                     quality: int = 90, classes: int = 4, seed: int = 0) -> list[Path]:
    """root/<split-less>: ``count`` RGB JPEGs of one size spread over ``classes`` class folders
    under root/train (for throughput and packing tests)."""
    rng = np.random.default_rng(seed)
    paths = []
    for k in range(count):
        folder = root / "train" / f"class{k % classes:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"img{k:05d}.JPEG"
        path.write_bytes(encode_image(smooth_pixels(*size, rng), "RGB", "JPEG", quality))
        paths.append(path)
    return paths
