"""Shared image pieces: normalisation, crop-box sampling, PIL decoding to RGB crops.

Crop parameters are computed from uniforms the caller draws from (seed, epoch, index), never from
a global RNG (torchvision's RandomResizedCrop draws from torch's global generator, which makes
augmentation depend on the worker and on what it drew before).
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from bigbatch.data.seeding import example_generator

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# Inception-style crop (Szegedy et al. 2015), the standard ImageNet training augmentation.
CROP_SCALE = (0.08, 1.0)
CROP_RATIO = (3.0 / 4.0, 4.0 / 3.0)
CROP_ATTEMPTS = 10
UNIFORMS_PER_ATTEMPT = 4  # area fraction, log aspect ratio, top, left

# JPEG DCT scaling factors libjpeg can decode at (PIL's draft mode).
_DRAFT_FACTORS = (8, 4, 2, 1)
# The usual ImageNet evaluation resize: shorter side 256 for a 224 crop.
EVAL_CROP_FRACTION = 224 / 256

# Everything PIL raises for data it cannot decode (SyntaxError and struct.error come from
# plugins parsing malformed headers).
DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, struct.error, zlib.error,
                 Image.DecompressionBombError)


@dataclass(frozen=True)
class Box:
    """A crop rectangle in pixel coordinates of the full-size image (floats allowed)."""

    left: float
    top: float
    width: float
    height: float

    def scaled(self, factor: float) -> Box:
        return Box(self.left * factor, self.top * factor, self.width * factor,
                   self.height * factor)

    def as_pil(self) -> tuple[float, float, float, float]:
        return (self.left, self.top, self.left + self.width, self.top + self.height)


BoxForSize = Callable[[int, int], Box]  # the crop box of a width x height image


def eval_resize_size(image_size: int) -> int:
    """The shorter-side resize before the evaluation center crop (256 for 224)."""
    return round(image_size / EVAL_CROP_FRACTION)


def random_resized_crop_box(width: int, height: int, uniforms: np.ndarray,
                            scale: tuple[float, float] = CROP_SCALE,
                            ratio: tuple[float, float] = CROP_RATIO) -> Box:
    """The Inception crop of a width x height image, from uniforms of shape (attempts, 4).

    Each attempt draws an area fraction in ``scale`` and a log-uniform aspect ratio in ``ratio``;
    the first crop that fits is placed uniformly. If none fits, the whole image is cropped
    centrally to the nearest allowed aspect ratio (the same rule as torchvision's).
    """
    area = width * height
    log_low, log_high = math.log(ratio[0]), math.log(ratio[1])
    for u_area, u_ratio, u_top, u_left in np.asarray(uniforms, dtype=np.float64):
        target_area = area * (scale[0] + (scale[1] - scale[0]) * u_area)
        aspect = math.exp(log_low + (log_high - log_low) * u_ratio)
        crop_w = round(math.sqrt(target_area * aspect))
        crop_h = round(math.sqrt(target_area / aspect))
        if 0 < crop_w <= width and 0 < crop_h <= height:
            top = min(int(u_top * (height - crop_h + 1)), height - crop_h)
            left = min(int(u_left * (width - crop_w + 1)), width - crop_w)
            return Box(left, top, crop_w, crop_h)
    return _central_crop_box(width, height, ratio)


def _central_crop_box(width: int, height: int, ratio: tuple[float, float]) -> Box:
    aspect = width / height
    if aspect < ratio[0]:
        crop_w, crop_h = width, round(width / ratio[0])
    elif aspect > ratio[1]:
        crop_w, crop_h = round(height * ratio[1]), height
    else:
        crop_w, crop_h = width, height
    return Box((width - crop_w) // 2, (height - crop_h) // 2, crop_w, crop_h)


def center_crop_box(width: int, height: int, image_size: int, resize_size: int) -> Box:
    """The region that "resize the shorter side to resize_size, then center-crop image_size"
    takes from the full-size image, so both steps become one resampling of that box."""
    side = image_size * min(width, height) / resize_size
    return Box((width - side) / 2, (height - side) / 2, side, side)


def draft_factor(box: Box, out_size: int) -> int:
    """The largest JPEG reduction (8, 4, 2 or 1) after which ``box`` still covers
    ``out_size`` pixels on both sides, so decoding smaller loses no output resolution."""
    for factor in _DRAFT_FACTORS:
        if box.width / factor >= out_size and box.height / factor >= out_size:
            return factor
    return 1


def to_rgb(image: Image.Image) -> Image.Image:
    """Any PIL mode as 8-bit RGB: palette via RGBA (keeps transparency handling quiet), 16- and
    32-bit grayscale scaled to 8 bits (PIL's own conversion would clip them), alpha dropped."""
    if image.mode == "RGB":
        return image
    if image.mode.startswith("I;16") or image.mode == "I":
        depth = 65535.0 if image.mode.startswith("I;16") else float(max(1, image.getextrema()[1]))
        gray = np.asarray(image, dtype=np.float64) * (255.0 / depth)
        image = Image.fromarray(np.clip(np.rint(gray), 0, 255).astype(np.uint8), "L")
    elif image.mode in ("P", "PA"):
        image = image.convert("RGBA")
    return image.convert("RGB")


def load_crop(image: Image.Image, box: Box, out_size: int, fast_decode: bool) -> Image.Image:
    """Decode the opened (not yet loaded) ``image`` and resample its region ``box`` to an
    out_size x out_size RGB image.

    With ``fast_decode``, JPEGs are decoded at 1/2, 1/4 or 1/8 scale (libjpeg DCT scaling via
    PIL's draft mode) when the box still covers out_size pixels after the reduction; the box is
    rescaled to the reduced image. ``Image.load()`` forces the full decode so that truncated
    files raise here instead of silently yielding gray rows (PIL's LOAD_TRUNCATED_IMAGES is
    left False). Raises one of DECODE_ERRORS for unreadable data.
    """
    if fast_decode and image.format == "JPEG":
        factor = draft_factor(box, out_size)
        if factor > 1:
            width, height = image.size
            drafted = image.draft("RGB", (width // factor, height // factor))
            if drafted is not None:
                box = box.scaled(drafted[1][2] / width)
    image.load()
    return resample_crop(image, box, out_size)


def resample_crop(image: Image.Image, box: Box, out_size: int) -> Image.Image:
    """The box of ``image`` resampled (bilinear, antialiased) to out_size x out_size RGB:
    crop and resize in one pass, so sub-pixel box corners are honoured."""
    # Grayscale resamples per channel, so resizing before the RGB copy is exact and 3x cheaper.
    if image.mode != "L":
        image = to_rgb(image)
    crop = image.resize((out_size, out_size), Image.Resampling.BILINEAR, box=box.as_pil())
    return to_rgb(crop)


def example_crop(train: bool, seed: int, epoch: int, index: int, image_size: int,
                 resize_size: int) -> tuple[BoxForSize, bool]:
    """(box for a width x height image, flip) of one example.

    Training: Inception crop + horizontal flip drawn from example_generator(seed, epoch, index),
    so they depend on nothing else. Evaluation: resize to resize_size + center crop, no flip.
    """
    if not train:
        return (lambda w, h: center_crop_box(w, h, image_size, resize_size)), False
    generator = example_generator(seed, epoch, index)
    draws = torch.rand(CROP_ATTEMPTS * UNIFORMS_PER_ATTEMPT + 1, generator=generator,
                       dtype=torch.float64).numpy()
    attempts = draws[:-1].reshape(CROP_ATTEMPTS, UNIFORMS_PER_ATTEMPT)
    return (lambda w, h: random_resized_crop_box(w, h, attempts)), bool(draws[-1] < 0.5)


def image_planes(crop: Image.Image, flip: bool) -> torch.Tensor:
    """An RGB PIL crop as a 3xHxW uint8 tensor (a channels-first view of a fresh copy),
    mirrored left-right if ``flip``."""
    planes = torch.from_numpy(np.array(crop)).permute(2, 0, 1)
    return planes.flip(-1) if flip else planes


def normalization_affine(mean: Sequence[float], std: Sequence[float],
            device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, shift) of shape 1xCx1x1 with x*scale + shift == (x/255 - mean)/std."""
    scale = torch.tensor([1.0 / (255.0 * s) for s in std], device=device)
    shift = torch.tensor([-m / s for m, s in zip(mean, std, strict=True)], device=device)
    return scale.view(1, -1, 1, 1), shift.view(1, -1, 1, 1)


def normalize_images(images: torch.Tensor, mean: Sequence[float] = IMAGENET_MEAN,
                     std: Sequence[float] = IMAGENET_STD) -> torch.Tensor:
    """Normalise a uint8 NxCxHxW batch (from a dataset built with ``normalize=False``) to
    float32 on whatever device it is on; already-float input is returned unchanged.

    Normalising on the accelerator moves about 40% of the per-image CPU cost of a pre-resized
    input pipeline off the loader workers and sends 4x fewer bytes to the device.
    """
    if images.is_floating_point():
        return images
    scale, shift = normalization_affine(mean, std, images.device)
    return torch.addcmul(shift, images.float(), scale)
