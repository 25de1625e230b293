"""JPEG decoding on the training device (``data.decode_on_device``).

The loader workers read each training JPEG's bytes and choose its crop and flip as always
(transforms.example_crop), but leave the decoding to the training process, which decodes the
batch's JPEGs together with ``torchvision.io.decode_jpeg`` on its device (nvJPEG, batched, on a
CUDA GPU; libjpeg-turbo on the CPU), then cuts each crop out and resamples it there. A worker's
cost per image drops from a decode and a resample to a file read and a header parse; the
training process takes on the decode calls (on a GPU without a hardware JPEG decoder, nvJPEG
also does part of the work on the host).

Which files: RGB JPEGs whose crop box lies on whole pixels (every training crop). Other files
(grayscale, CMYK, PNG, ...) are decoded by the workers as before and travel decoded in the same
batch. A file the device cannot decode or resample is tried again on the CPU by data/decode.py's
routes (with one warning per process); if those fail too it is skipped and reported
(on_broken=skip) or named in a DataError (on_broken=error), as a file broken in a worker would
be. A device that fails on every file of a whole batch that the CPU can read stops the run.

Pixels: on the CPU the crops are route 1's exactly (the same decoder and the same uint8
resampler), except where the workers would have decoded a large photo at reduced scale
(fast_decode's draft mode): the device always decodes at full scale. On a GPU the resampler
runs in float (CUDA's antialiased kernel has no uint8 form) and rounds to uint8, within one
level of the CPU's, and nvJPEG's decoder may differ from libjpeg-turbo's; how much has not been
measured. Every example's pixels remain a function of (seed, epoch, index) and the device.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch.nn import functional

from bigbatch.data.batch import DeferredJpeg, JpegCrop, PendingJpegs
from bigbatch.data.decode import (
    crop_planes,
    jpeg_frame,
    resize_box,
    takes_turbo_route,
    turbo_decoder,
)
from bigbatch.data.transforms import DECODE_ERRORS, Box, BoxForSize
from bigbatch.errors import DataError

log = logging.getLogger(__name__)

# report_broken(name, error) -> the name for Batch.skipped; raises DataError for on_broken=error
ReportBroken = Callable[[str, Exception], str]

# A batch of at least this many JPEGs that all fail on the device but not on the CPU means the
# device cannot decode (no nvJPEG, a broken driver), not that the files are odd.
WHOLE_BATCH_FAILURE = 8

_warned_fallback = False


def deferred_jpeg(data: bytes, box_for_size: BoxForSize, out_size: int, flip: bool,
                  name: str) -> DeferredJpeg | None:
    """The file ``data`` left for the device if it can take it (an RGB JPEG whose crop box
    lies on whole pixels), else None (the worker decodes it)."""
    frame = jpeg_frame(data)
    if frame is None:
        return None
    box = box_for_size(frame.width, frame.height)
    if not takes_turbo_route(frame, box, out_size, fast_decode=False):
        return None
    return DeferredJpeg(data, JpegCrop(frame.height, frame.width, box, flip, name))


def decode_all(encoded: list[torch.Tensor],
               device: torch.device) -> list[torch.Tensor | RuntimeError]:
    """Each file decoded to a 3 x H x W uint8 RGB tensor on ``device``, or the error it raised:
    all in one batched call, or, if that fails, file by file to find the failing ones. Running
    out of device memory is not a decoding failure and is raised.

    On CUDA the current stream is drained first: torchvision's decoder allocates its outputs on
    the current stream but writes them from a stream of its own that waits for nothing, so
    memory just freed by kernels still queued (gradients after zero_grad, a previous
    micro-batch's activations) could be written while they still read it."""
    decode = turbo_decoder()
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
    try:
        return list(decode(encoded, device=device))
    except RuntimeError as error:
        raise_if_out_of_memory(error)
    decoded: list[torch.Tensor | RuntimeError] = []
    for data in encoded:
        try:
            decoded.append(decode(data, device=device))
        except RuntimeError as error:
            raise_if_out_of_memory(error)
            decoded.append(error)
    return decoded


def raise_if_out_of_memory(error: RuntimeError) -> None:
    """Re-raise an out-of-memory error, which torchvision's decoder reports as a plain
    RuntimeError ("Error while decoding JPEG images: ... out of memory")."""
    if isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error):
        raise error


def resample_rounding(image: torch.Tensor, box: Box, out_size: int) -> torch.Tensor:
    """The whole-pixel ``box`` of a 3 x H x W uint8 image resampled (bilinear, antialiased) to
    3 x out_size x out_size in float, from the box's own pixels, plus 0.5: copying it into a
    uint8 tensor (which truncates) rounds it. Three kernels (four with the flip), for devices
    without a uint8 antialiased resampler."""
    left, top, width, height = int(box.left), int(box.top), int(box.width), int(box.height)
    crop = torch.add(image[:, top : top + height, left : left + width], 0.5)  # float32
    resized = functional.interpolate(
        crop.unsqueeze(0), size=(out_size, out_size), mode="bilinear", antialias=True,
        align_corners=False,
    )
    return resized[0]


def crop_on_device(image: torch.Tensor | RuntimeError, crop: JpegCrop,
                   out_size: int) -> torch.Tensor:
    """The crop of a decoded image on its device, flipped if asked, to be copied into a uint8
    row; raises RuntimeError for a file that failed to decode or decoded to another size."""
    if isinstance(image, RuntimeError):
        raise image
    if tuple(image.shape) != (3, crop.height, crop.width):
        raise RuntimeError(f"decoded {tuple(image.shape)}, the frame header says "
                           f"{crop.height}x{crop.width}")
    if image.device.type == "cpu":  # the workers' own uint8 kernel: their crops exactly
        resized = resize_box(image, crop.box, out_size)
    else:
        resized = resample_rounding(image, crop.box, out_size)
    return resized.flip(-1) if crop.flip else resized


def crop_on_cpu(data: torch.Tensor, crop: JpegCrop, out_size: int) -> torch.Tensor:
    """The crop of a file the device could not take, by data/decode.py's CPU routes (raises
    one of DECODE_ERRORS if they cannot either)."""
    return crop_planes(data.numpy().tobytes(), lambda width, height: crop.box, out_size,
                       fast_decode=False, flip=crop.flip)


def warn_fallback(name: str, error: RuntimeError) -> None:
    """Say once per process that files go to the CPU because the device failed on them."""
    global _warned_fallback
    if not _warned_fallback:
        _warned_fallback = True
        log.warning("the training device could not decode %s (%s); such files are decoded on "
                    "the CPU instead", name, error)


def decode_pending(images: torch.Tensor, labels: torch.Tensor, pending: PendingJpegs,
                   report_broken: ReportBroken) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Fill the pending rows of a uint8 N x 3 x S x S batch on its device; returns (images,
    labels, names of the files skipped), the rows of skipped files left out."""
    out_size = images.shape[-1]
    encoded = pending.encoded()
    decoded = decode_all(encoded, images.device)
    skipped_rows: list[int] = []
    skipped: list[str] = []
    device_failures: list[RuntimeError] = []
    for row, data, crop, image in zip(pending.rows, encoded, pending.crops, decoded,
                                      strict=True):
        try:
            images[row] = crop_on_device(image, crop, out_size)
            continue
        except RuntimeError as error:
            raise_if_out_of_memory(error)
            device_failures.append(error)
        try:
            images[row] = crop_on_cpu(data, crop, out_size)
        except DECODE_ERRORS as error:
            skipped.append(report_broken(crop.name, error))
            skipped_rows.append(row)
            continue
        warn_fallback(crop.name, device_failures[-1])
    refuse_a_device_that_cannot_decode(device_failures, len(encoded), len(skipped))
    if not skipped_rows:
        return images, labels, skipped
    keep = torch.ones(len(labels), dtype=torch.bool)
    keep[skipped_rows] = False
    return images[keep.to(images.device)], labels[keep.to(labels.device)], skipped


def refuse_a_device_that_cannot_decode(failures: list[RuntimeError], files: int,
                                       broken: int) -> None:
    """DataError if the device failed on all of a whole batch's files and the CPU read some."""
    if files >= WHOLE_BATCH_FAILURE and len(failures) == files and broken < files:
        raise DataError(f"the training device cannot decode JPEGs ({failures[0]}); set "
                        "data.decode_on_device=false")
