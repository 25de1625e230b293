"""data/decode.py: JPEG frame parsing, the choice of route, and that the libjpeg-turbo + torch
route gives the PIL route's pixels (decoders identical, resamplers within rounding)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from imagegen import encode_image, smooth_pixels
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg

from bigbatch.data import decode
from bigbatch.data.transforms import (
    DECODE_ERRORS,
    Box,
    draft_factor,
    example_crop,
    image_planes,
    load_crop,
)

OUT = 224


@pytest.fixture(scope="module")
def photos() -> list[bytes]:
    """Six 500x375 RGB JPEGs (ImageNet's typical size), quality 90."""
    rng = np.random.default_rng(4)
    return [encode_image(smooth_pixels(500, 375, rng), "RGB", "JPEG") for _ in range(6)]


def write(tmp_path: Path, data: bytes, name: str = "image.JPEG") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def pil_route(data: bytes, box: Box, out_size: int, fast_decode: bool) -> torch.Tensor:
    with Image.open(io.BytesIO(data)) as image:
        return image_planes(load_crop(image, box, out_size, fast_decode), False)


def mean_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().mean().item()


def test_jpeg_frame_reads_size_and_components() -> None:
    pixels = smooth_pixels(120, 90, np.random.default_rng(0))
    for mode, components in (("RGB", 3), ("L", 1), ("CMYK", 4)):
        frame = decode.jpeg_frame(encode_image(pixels, mode, "JPEG"))
        assert frame == decode.JpegFrame(120, 90, components)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", progressive=True)
    assert decode.jpeg_frame(buffer.getvalue()) == decode.JpegFrame(120, 90, 3)
    whole = encode_image(pixels, "RGB", "JPEG")
    for not_a_frame in (
        b"",
        b"this is not an image\n",
        encode_image(pixels, "RGB", "PNG"),
        whole[:20],
        b"\xff\xd8\xff\xd9" + whole[2:],
    ):
        assert decode.jpeg_frame(not_a_frame) is None


def test_draft_factor_is_the_largest_that_keeps_the_output_size() -> None:
    assert draft_factor(Box(0, 0, 500, 375), 224) == 1  # ImageNet-sized: never reduced
    assert draft_factor(Box(0, 0, 1000, 750), 224) == 2  # 375 >= 224 > 187
    assert draft_factor(Box(0, 0, 1000, 750), 187) == 4
    assert draft_factor(Box(10, 10, 1792, 1800), 224) == 8
    assert draft_factor(Box(0, 0, 447, 2000), 224) == 1  # one short side is enough to refuse


def test_route_choice() -> None:
    rgb = decode.JpegFrame(500, 375, 3)
    crop = Box(40, 20, 300, 250)
    assert decode.takes_turbo_route(rgb, crop, OUT, fast_decode=True)
    assert decode.takes_turbo_route(rgb, crop, 100, fast_decode=False)
    assert not decode.takes_turbo_route(rgb, crop, 100, fast_decode=True)  # drafted by 2: PIL
    assert not decode.takes_turbo_route(rgb, Box(40.5, 20, 300, 250), OUT, True)  # fractional
    for other in (decode.JpegFrame(500, 375, 1), decode.JpegFrame(500, 375, 4), None):
        assert not decode.takes_turbo_route(other, crop, OUT, True)


def test_both_decoders_give_identical_pixels(photos: list[bytes]) -> None:
    for data in photos[:3]:
        turbo = decode_jpeg(
            torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB
        )
        with Image.open(io.BytesIO(data)) as image:
            assert torch.equal(turbo, torch.from_numpy(np.array(image)).permute(2, 0, 1))


def test_turbo_route_matches_the_pil_route(photos: list[bytes], tmp_path: Path) -> None:
    """The resamplers differ by rounding and at the crop's edges (PIL also weighs pixels just
    outside the box): measured at most 0.02 grey levels mean absolute difference on these
    images (0.07 on 1/f noise), against 8 or more for another crop of the same image."""
    for index, data in enumerate(photos):
        path = write(tmp_path, data)
        box_for_size, _ = example_crop(True, 3, 0, index, OUT, 256)
        box = box_for_size(500, 375)
        assert decode.takes_turbo_route(decode.jpeg_frame(data), box, OUT, True)
        ours = decode.crop_planes(path.read_bytes(), box_for_size, OUT, True, flip=False)
        assert ours.shape == (3, OUT, OUT) and ours.dtype == torch.uint8
        assert mean_abs(ours, pil_route(data, box, OUT, True)) < 0.1
        other_crop = example_crop(True, 3, 1, index, OUT, 256)[0]
        other = decode.crop_planes(path.read_bytes(), other_crop, OUT, True, False)
        assert mean_abs(ours, other) > 8
        mirrored = decode.crop_planes(path.read_bytes(), box_for_size, OUT, True, flip=True)
        assert torch.equal(mirrored, ours.flip(-1))


def test_drafted_decode_is_close_to_the_full_decode(photos: list[bytes], tmp_path: Path) -> None:
    """DCT scaling is a different low-pass filter from bilinear antialiasing; with the box drawn
    from the header size and rescaled, measured 0.5-0.8 grey levels mean absolute difference on
    these images (up to 3.2 on 1/f noise), against tens for a box left unscaled."""
    checked = 0
    for index, data in enumerate(photos):
        for epoch in range(4):
            box_for_size, _ = example_crop(True, 3, epoch, index, 48, 55)
            box = box_for_size(500, 375)
            if draft_factor(box, 48) == 1:
                continue
            path = write(tmp_path, data)
            drafted = decode.crop_planes(path.read_bytes(), box_for_size, 48, True, flip=False)
            assert torch.equal(drafted, pil_route(data, box, 48, fast_decode=True))
            assert mean_abs(drafted, pil_route(data, box, 48, fast_decode=False)) < 1.5
            checked += 1
    assert checked >= 6


def test_broken_jpegs_fail_with_pil_errors(photos: list[bytes], tmp_path: Path) -> None:
    box_for_size, _ = example_crop(True, 3, 0, 0, OUT, 256)
    truncated = write(tmp_path, photos[0][: len(photos[0]) // 2], "truncated.JPEG")
    garbage = photos[0][:700] + bytes(range(256)) * 40  # a valid header, then noise
    for path in (truncated, write(tmp_path, garbage, "garbage.JPEG")):
        with pytest.raises(DECODE_ERRORS):
            decode.crop_planes(path.read_bytes(), box_for_size, OUT, True, flip=False)
    with pytest.raises(OSError, match="image file is truncated"):
        decode.crop_planes(truncated.read_bytes(), box_for_size, OUT, True, flip=False)


def test_without_torchvision_codecs_every_file_takes_the_pil_route(
    photos: list[bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, photos[1])
    box_for_size, _ = example_crop(True, 3, 0, 1, OUT, 256)
    with_codecs = decode.crop_planes(path.read_bytes(), box_for_size, OUT, True, flip=False)
    monkeypatch.setattr(decode, "turbo_decoder", lambda: None)
    assert not decode.takes_turbo_route(
        decode.jpeg_frame(photos[1]), box_for_size(500, 375), OUT, True
    )
    without = decode.crop_planes(path.read_bytes(), box_for_size, OUT, True, flip=False)
    assert torch.equal(without, pil_route(photos[1], box_for_size(500, 375), OUT, True))
    assert mean_abs(without, with_codecs) < 0.1
