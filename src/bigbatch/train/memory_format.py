"""The memory format a run's model and batches use: channels-last where asked for and safe.

PyTorch 2.14's CPU convolutions (oneDNN 3.12, its AVX2 1x1 kernels) get the backward pass of a
1x1 convolution with a stride above 1 wrong when the tensors are channels-last and the layer has
fewer input channels than the kernel's channel block (8 floats with AVX2, 16 with AVX-512): the
weight gradient comes out wrong without an error (62% relative at 4 input channels on two
threads), or the heap is corrupted and the process aborts ("corrupted size vs. prev_size"),
segfaults or hangs. This is oneDNN issue 6035 ("1x1 convolution backward_weights writes past
the rtus workspace (nhwc, IC < ic_block)"). Measured on a 2-core AMD EPYC with AVX2 (no
AVX-512): ``Conv2d(4, 8, 1, stride=2)`` and ``Conv2d(7, 8, 1, stride=2)`` on a channels-last
batch; 8 or more input channels, a 3x3 kernel, stride 1 and the contiguous format were right. A
residual network's projection shortcut is such a layer when the network is narrow
(``small_resnet`` with ``model.options.width`` under 16). On a CPU, a model with a strided 1x1
convolution of under 16 input channels (AVX-512's block, so that both kinds of CPU are covered)
is trained in the contiguous format instead, with a warning; GPUs are not affected.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

log = logging.getLogger(__name__)

SAFE_INPUT_CHANNELS = 16


def unsafe_channels_last_layers(model: nn.Module) -> list[str]:
    """The names of ``model``'s convolutions whose channels-last CPU backward is broken: 1x1
    kernels with a stride above 1 and fewer than SAFE_INPUT_CHANNELS input channels."""
    return [name for name, m in model.named_modules()
            if isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1)
            and max(m.stride) > 1 and m.in_channels < SAFE_INPUT_CHANNELS]


def memory_format_for(channels_last: bool, model: nn.Module, device: torch.device,
                      warn: bool = True) -> torch.memory_format:
    """Channels-last if asked for and, on a CPU, ``model`` has no layer it breaks; else the
    contiguous format (with a warning, if ``warn``, where channels-last was asked for)."""
    if not channels_last:
        return torch.contiguous_format
    unsafe = unsafe_channels_last_layers(model) if device.type == "cpu" else []
    if unsafe and warn:
        log.warning("channels_last is off for this run: on CPU, PyTorch's channels-last backward "
                    "of a strided 1x1 convolution with under %d input channels is wrong "
                    "(%s); training in the contiguous format", SAFE_INPUT_CHANNELS,
                    ", ".join(unsafe[:3]) + (" ..." if len(unsafe) > 3 else ""))
    return torch.contiguous_format if unsafe else torch.channels_last
