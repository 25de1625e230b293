"""Model size and compute, the two inputs of the paper's scaling argument (You et al.,
"ImageNet Training in Minutes", ICPP 2018).

Communication per iteration is proportional to the number of parameters (the gradient that is
all-reduced); computation is proportional to the images times the forward cost. The planner
combines ``count_parameters`` and ``forward_flops`` into a computation-to-communication ratio
(ResNet-50's is about 12.5x AlexNet's in the paper).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.func import functional_call

_MEASURED_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameter elements (what data-parallel training all-reduces every step when
    ``trainable_only``; all parameters otherwise). Shared parameters are counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def _layer_macs(module: nn.Module, output: torch.Tensor) -> int:
    """Multiply-accumulates of one conv/linear call: each output element costs one MAC per
    weight it reads (for a grouped conv, in_channels / groups times the kernel area)."""
    if isinstance(module, nn.Linear):
        return output.numel() * module.in_features
    kernel_area = math.prod(module.kernel_size)
    return output.numel() * (module.in_channels // module.groups) * kernel_area


def forward_macs(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Multiply-accumulates of conv and linear layers for one image of shape (C, H, W).

    Runs the model on the meta device (shapes only, no memory, no arithmetic), with the model's
    own parameters swapped for meta stand-ins, so the model is neither copied nor changed.
    Biases, BN, pooling and activations are not counted, by the usual convention.
    """
    total = 0

    def record(module: nn.Module, _inputs: tuple, output: torch.Tensor) -> None:
        nonlocal total
        total += _layer_macs(module, output)

    measured = [m for m in model.modules() if isinstance(m, _MEASURED_LAYERS)]
    handles = [m.register_forward_hook(record) for m in measured]
    # Eval mode: batch-1 BatchNorm would refuse 1x1 maps in training mode, and dropout is free.
    training_flags = {m: m.training for m in model.modules()}
    try:
        model.eval()
        stand_ins = {
            name: torch.empty_like(t, device="meta")
            for name, t in (*model.named_parameters(), *model.named_buffers())
        }
        image = torch.empty((1, *input_shape), device="meta")
        with torch.no_grad():
            functional_call(model, stand_ins, (image,), tie_weights=True, strict=False)
    finally:
        for handle in handles:
            handle.remove()
        for module, flag in training_flags.items():
            module.training = flag
    return total


def forward_flops(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Forward FLOPs for one image: 2 x the multiply-accumulates of conv and linear layers
    (one multiply plus one add each). ResNet-50 at 3x224x224: 8.18e9; AlexNet at 227: 1.45e9."""
    return 2 * forward_macs(model, input_shape)
