"""JPEG decoding on the training device (``data.decode_on_device``).

The loader workers read each training JPEG's bytes and choose its crop and flip as always
(transforms.example_crop), but leave the decoding to the training process, which decodes the
batch's JPEGs together with ``torchvision.io.decode_jpeg`` on its device (nvJPEG, batched, on a
CUDA GPU; libjpeg-turbo on the CPU), cuts each crop out and resamples it there with route 1's
antialiased bilinear filter (data/decode.py), computed in float and rounded back to uint8 since
the CUDA kernel has no uint8 form. A worker's cost per image drops from a decode and a resample
to a file read and a header parse.

Which files: RGB JPEGs whose crop box lies on whole pixels (every training crop). Other files
(grayscale, CMYK, PNG, ...) are decoded by the workers as before and travel decoded in the same
batch. A file the device cannot decode is tried again on the CPU by data/decode.py's routes;
if those fail too it is skipped and reported (on_broken=skip) or named in a DataError
(on_broken=error), as a file broken in a worker would be.

Pixels: decoding on the CPU this way gives route 1's crops within one level (the float
resampler's rounding); the device always decodes at full scale, where the workers would have
decoded a large photo at reduced scale (fast_decode's draft mode); nvJPEG's inverse DCT differs
from libjpeg-turbo's by a few levels, so a run that decodes on a GPU is reproducible but not
bitwise the run that decodes on CPUs. Every example's pixels remain a function of (seed, epoch,
index) and the device kind.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional

from bigbatch.data.batch import PendingJpeg, PendingJpegs
from bigbatch.data.decode import crop_planes, jpeg_frame, takes_turbo_route
from bigbatch.data.transforms import DECODE_ERRORS, Box, BoxForSize

# report_broken(name, error) -> the name for Batch.skipped; raises DataError for on_broken=error
ReportBroken = Callable[[str, Exception], str]


def pending_jpeg(data: bytes, box_for_size: BoxForSize, out_size: int, flip: bool,
                 name: str) -> PendingJpeg | None:
    """The file ``data`` as a PendingJpeg if the device can take it (an RGB JPEG whose crop
    box lies on whole pixels), else None (the worker decodes it)."""
    frame = jpeg_frame(data)
    if frame is None:
        return None
    box = box_for_size(frame.width, frame.height)
    if not takes_turbo_route(frame, box, out_size, fast_decode=False):
        return None
    return PendingJpeg(data, frame.height, frame.width, box, flip, name)


def decode_all(encoded: list[torch.Tensor], device: torch.device) -> list[torch.Tensor | None]:
    """Each file decoded to a 3 x H x W uint8 RGB tensor on ``device`` (None where it cannot
    be): all in one batched call, or, if that fails, file by file to find the broken ones."""
    from torchvision.io import ImageReadMode, decode_jpeg

    try:
        return list(decode_jpeg(encoded, mode=ImageReadMode.RGB, device=device))
    except RuntimeError:
        pass
    decoded: list[torch.Tensor | None] = []
    for data in encoded:
        try:
            decoded.append(decode_jpeg(data, mode=ImageReadMode.RGB, device=device))
        except RuntimeError:
            decoded.append(None)
    return decoded


def resample_on_device(image: torch.Tensor, box: Box, out_size: int) -> torch.Tensor:
    """The whole-pixel ``box`` of a 3 x H x W uint8 image resampled (bilinear, antialiased) to
    3 x out_size x out_size uint8 on the image's device, from the box's own pixels."""
    left, top, width, height = int(box.left), int(box.top), int(box.width), int(box.height)
    crop = image[:, top : top + height, left : left + width].unsqueeze(0).float()
    resized = functional.interpolate(
        crop, size=(out_size, out_size), mode="bilinear", antialias=True, align_corners=False
    )
    return resized[0].round_().clamp_(0, 255).to(torch.uint8)


def crop_on_cpu(data: torch.Tensor, file: PendingJpeg, out_size: int) -> torch.Tensor:
    """The crop of a file the device could not decode, by data/decode.py's CPU routes (raises
    one of DECODE_ERRORS if they cannot either)."""
    return crop_planes(data.numpy().tobytes(), lambda width, height: file.box, out_size,
                       fast_decode=False, flip=False)


def decode_pending(images: torch.Tensor, labels: torch.Tensor, pending: PendingJpegs,
                   report_broken: ReportBroken) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Fill the pending rows of a uint8 N x 3 x S x S batch on its device; returns (images,
    labels, names of the files skipped), the rows of skipped files left out."""
    out_size = images.shape[-1]
    encoded = pending.encoded()
    skipped_rows: list[int] = []
    skipped: list[str] = []
    decoded = decode_all(encoded, images.device)
    for row, data, file, image in zip(pending.rows, encoded, pending.files, decoded,
                                      strict=True):
        if image is not None and tuple(image.shape) == (3, file.height, file.width):
            crop = resample_on_device(image, file.box, out_size)
        else:
            try:
                crop = crop_on_cpu(data, file, out_size).to(images.device)
            except DECODE_ERRORS as error:
                skipped.append(report_broken(file.name, error))
                skipped_rows.append(row)
                continue
        images[row] = crop.flip(-1) if file.flip else crop
    if not skipped_rows:
        return images, labels, skipped
    keep = torch.ones(len(labels), dtype=torch.bool)
    keep[skipped_rows] = False
    return images[keep.to(images.device)], labels[keep.to(labels.device)], skipped
