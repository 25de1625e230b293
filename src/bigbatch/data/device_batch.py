"""A loaded batch's arrival on the training device: moved there (in the model's memory format),
its pending JPEGs decoded there (data/device_decode.py), normalised to float."""

from __future__ import annotations

import torch

from bigbatch.data.batch import Batch
from bigbatch.data.device_decode import ReportBroken, decode_pending
from bigbatch.data.transforms import normalize_images


def batch_on_device(batch: Batch, device: torch.device, memory_format: torch.memory_format,
                    report_broken: ReportBroken | None) -> Batch:
    """``batch`` ready for the model on ``device``; files the device found broken are left out
    and named in its ``skipped``. ``report_broken`` is the data set's (IndexedImages), needed
    only for a batch with pending JPEGs."""
    images = batch.images.to(device, non_blocking=True, memory_format=memory_format)
    labels = batch.labels.to(device, non_blocking=True)
    skipped = batch.skipped
    if batch.pending is not None:
        if report_broken is None:
            raise ValueError("a batch with pending JPEGs needs its data set's report_broken")
        images, labels, broken = decode_pending(images, labels, batch.pending, report_broken)
        images = images.contiguous(memory_format=memory_format)
        skipped = [*skipped, *broken]
    return Batch(normalize_images(images), labels, skipped)
