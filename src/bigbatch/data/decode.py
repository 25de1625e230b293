"""An image file to its resampled crop as a 3 x S x S uint8 tensor, by the cheapest exact route.

Route 1, for an RGB JPEG whose crop box lies on whole pixels (every training crop) and that
draft mode would not decode at reduced scale (``transforms.draft_factor`` is 1, as for every
crop of an ImageNet-sized photo): the file's bytes are decoded by libjpeg-turbo through
``torchvision.io.decode_jpeg`` straight into a tensor, the box is cut out as a view, and torch's
uint8 antialiased bilinear kernel (vectorised, about 3x faster than PIL's resize) resamples it
from the crop's own pixels, as torchvision's RandomResizedCrop does. The frame header is read
by ``jpeg_frame`` (a walk over the marker segments) rather than by PIL, which costs more.

Route 2 (transforms.load_crop, PIL): everything else, i.e. other formats, grayscale and CMYK
JPEGs, JPEGs that draft mode decodes at 1/2, 1/4 or 1/8 scale, fractional (evaluation) boxes,
and any file libjpeg-turbo rejects, so that broken files fail with PIL's errors as before.

Both decoders are libjpeg-turbo with the same settings (accurate integer DCT, fancy upsampling)
and give identical pixels; the two resamplers differ by rounding and at the crop's edges (PIL
also weighs pixels just outside the box), bounded in tests/test_imagefolder_decode.py. The route
is a function of the file and the crop box, so an example's pixels remain a function of (seed,
epoch, index).
"""

from __future__ import annotations

import functools
import io
import struct
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from PIL import Image
from torch.nn import functional

from bigbatch.data.transforms import Box, BoxForSize, draft_factor, image_planes, load_crop


@functools.cache
def turbo_decoder() -> Callable[[torch.Tensor], torch.Tensor] | None:
    """torchvision's ``decode_jpeg`` to RGB, or None for a torchvision without its image codecs
    (then every file takes route 2). Imported on first use: importing torchvision also imports
    torch._dynamo, about 3 s of CPU in every process, which runs on other data sets do not need."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except ImportError:
        return None
    return functools.partial(decode_jpeg, mode=ImageReadMode.RGB)

# torchvision 0.29 deprecates its image codecs in favour of TorchCodec and warns on every call;
# route 1 falls back to route 2 by itself if they go, so the warning only adds noise.
warnings.filterwarnings(
    "ignore",
    message="The image decoding and encoding capabilities of TorchVision",
    category=DeprecationWarning,
)

_SOI = b"\xff\xd8"
_EOI_MARKER = 0xD9
# Start-of-frame markers of Huffman-coded JPEGs: baseline, extended sequential, progressive.
_HUFFMAN_FRAMES = frozenset({0xC0, 0xC1, 0xC2})
# Markers that stand alone, without a length field (TEM, RST0-7, SOI).
_STANDALONE_MARKERS = frozenset({0x01, *range(0xD0, 0xD9)})


@dataclass(frozen=True)
class JpegFrame:
    """The size and colour component count from a JPEG's start-of-frame segment."""

    width: int
    height: int
    components: int


def jpeg_frame(data: bytes) -> JpegFrame | None:
    """The start-of-frame of JPEG ``data``, or None if the data is not a Huffman-coded JPEG
    whose header segments can be walked (PIL then decides what it is, or raises)."""
    if not data.startswith(_SOI):
        return None
    position = len(_SOI)
    while position + 4 <= len(data):
        if data[position] != 0xFF or data[position + 1] == _EOI_MARKER:
            return None
        marker = data[position + 1]
        if marker == 0xFF:  # fill byte before a marker
            position += 1
        elif marker in _STANDALONE_MARKERS:
            position += 2
        elif marker in _HUFFMAN_FRAMES:
            return _frame_fields(data, position + 4)
        else:
            (length,) = struct.unpack_from(">H", data, position + 2)
            position += 2 + length
    return None


def _frame_fields(data: bytes, start: int) -> JpegFrame | None:
    """The fields after a start-of-frame marker and its length: precision, height, width,
    component count (a zero height is defined later in the file; PIL handles those)."""
    if start + 6 > len(data):
        return None
    height, width, components = struct.unpack_from(">HHB", data, start + 1)
    if not (height and width and components):
        return None
    return JpegFrame(width, height, components)


def on_whole_pixels(box: Box) -> bool:
    """Whether every corner of ``box`` is an integer pixel coordinate."""
    return all(float(v).is_integer() for v in (box.left, box.top, box.width, box.height))


def takes_turbo_route(frame: JpegFrame | None, box: Box, out_size: int, fast_decode: bool) -> bool:
    """Route 1 (see the module doc) for a file with this JPEG frame (None: not a JPEG) and box."""
    return (
        frame is not None
        and frame.components == 3
        and on_whole_pixels(box)
        and not (fast_decode and draft_factor(box, out_size) > 1)
        and turbo_decoder() is not None
    )


def resize_box(image: torch.Tensor, box: Box, out_size: int) -> torch.Tensor:
    """The whole-pixel ``box`` of a 3 x H x W uint8 image resampled (bilinear, antialiased) to
    3 x out_size x out_size uint8, from the box's own pixels."""
    left, top, width, height = int(box.left), int(box.top), int(box.width), int(box.height)
    crop = image[:, top : top + height, left : left + width].unsqueeze(0)
    resized = functional.interpolate(
        crop, size=(out_size, out_size), mode="bilinear", antialias=True, align_corners=False
    )
    return resized[0]


def turbo_crop(data: bytes, frame: JpegFrame, box: Box, out_size: int) -> torch.Tensor:
    """Route 1 on the file's bytes; raises RuntimeError for data libjpeg-turbo cannot decode
    or that decodes to another size than ``frame`` says."""
    encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    image = turbo_decoder()(encoded)
    if tuple(image.shape) != (3, frame.height, frame.width):
        raise RuntimeError(f"decoded {tuple(image.shape)}, the frame header says {frame}")
    return resize_box(image, box, out_size)


def crop_planes(
    data: bytes, box_for_size: BoxForSize, out_size: int, fast_decode: bool, flip: bool
) -> torch.Tensor:
    """The region ``box_for_size(width, height)`` of the encoded image ``data`` resampled to a
    3 x out_size x out_size uint8 tensor, mirrored left-right if ``flip``.

    ``fast_decode`` lets PIL decode JPEGs at reduced scale when that loses no output
    resolution (transforms.load_crop). Raises one of transforms.DECODE_ERRORS for unreadable
    data.
    """
    frame = jpeg_frame(data)
    if frame is not None:
        box = box_for_size(frame.width, frame.height)
        if takes_turbo_route(frame, box, out_size, fast_decode):
            try:
                crop = turbo_crop(data, frame, box, out_size)
            except RuntimeError:
                pass  # PIL decodes it below and raises its own error for broken data
            else:
                return crop.flip(-1) if flip else crop
    with Image.open(io.BytesIO(data)) as image:
        return image_planes(
            load_crop(image, box_for_size(*image.size), out_size, fast_decode), flip
        )
