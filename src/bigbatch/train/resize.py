"""Progressive resizing: the early training steps on smaller images, the last ones at full size.

A convolutional network's cost per image falls with the number of pixels, and the early steps
of a large-batch run, taken at a high learning rate, learn coarse features that need less
detail than the last ones. Training at a lower resolution than the test one and then at the
test resolution recovers the accuracy of training at full size throughout: Touvron, Vedaldi,
Douze and Jégou, "Fixing the train-test resolution discrepancy" (NeurIPS 2019), sections 3-5.

With ``resize.initial_scale`` s < 1 the image sides are scaled by s at the first step; the
scale rises linearly to 1 at ``(1 - resize.finetune_fraction)`` of the steps and stays 1 after.
Sides are rounded down to a multiple of ``resize.multiple_of``, so a run uses a few distinct
sizes. The size is a function of the global step alone: every rank, every world size and a
resumed run see the same size at the same step. Images are resized on the training device,
after normalisation, by bilinear interpolation with antialiasing, which is deterministic on
the CPU. Validation images are never resized. The model must accept the smaller inputs
(global average pooling before the classifier, as the ResNets here; not AlexNet's fixed-size
classifier).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bigbatch.config import ResizeConfig


class ProgressiveResize:
    """The training image size at each global step, and the resizing itself."""

    def __init__(self, cfg: ResizeConfig, total_steps: int) -> None:
        self.initial_scale = cfg.initial_scale
        self.multiple_of = cfg.multiple_of
        self.ramp_steps = (1.0 - cfg.finetune_fraction) * total_steps

    @property
    def enabled(self) -> bool:
        return self.initial_scale < 1.0

    def scale(self, step: int) -> float:
        """The scale of the image sides at ``step`` (0-based)."""
        if not self.enabled or step >= self.ramp_steps:
            return 1.0
        return self.initial_scale + (1.0 - self.initial_scale) * step / self.ramp_steps

    def side(self, step: int, full: int) -> int:
        """A side of ``full`` pixels at ``step``: scaled, rounded down to the multiple, never
        below one multiple nor above ``full``."""
        scale = self.scale(step)
        if scale >= 1.0:
            return full
        rounded = int(full * scale) // self.multiple_of * self.multiple_of
        return min(full, max(self.multiple_of, rounded))

    def __call__(self, images: torch.Tensor, step: int,
                 memory_format: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
        """The NxCxHxW float batch at the size of ``step``, in ``memory_format`` (returned
        unchanged at full size)."""
        height, width = images.shape[-2:]
        size = (self.side(step, height), self.side(step, width))
        if size == (height, width):
            return images
        resized = F.interpolate(images, size=size, mode="bilinear", align_corners=False,
                                antialias=True)
        return resized.contiguous(memory_format=memory_format)
