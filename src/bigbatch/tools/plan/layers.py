"""What an accelerator's step is made of: kernels launched and activation bytes moved per image.

Counted from one forward call of a registered model on the meta device (shapes only, no
arithmetic), the way ``bigbatch.models.flops`` counts FLOPs. Every call of a convolution, linear
layer, normalisation, activation or pooling module is one forward kernel; backward runs two for
each convolution and linear layer (the input's and the weights' gradients) and one for each of
the others. Residual additions (not modules) are not counted, nor fused kernels: a stack that
fuses BatchNorm and ReLU into the convolution launches fewer.

Activation traffic: each normalisation and activation output element is written once and read
once forward, and backward reads it, reads its gradient and writes the input's gradient: five
accesses of ``bytes_per_element`` each. Convolutions and linear layers are taken as
compute-bound (3 x forward FLOPs per training image), the rest as memory-bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from bigbatch.errors import ConfigError

ACTIVATION_ACCESSES = 5  # forward write + read; backward read, read gradient, write gradient


@dataclass(frozen=True)
class LayerCounts:
    matmuls: int  # convolution and linear calls
    elementwise: int  # normalisation, activation and pooling calls
    norms: int  # normalisation calls (each a synchronisation point under synchronised BN)
    elementwise_elements: int  # output elements of normalisations and activations, one image

    @property
    def forward_kernels(self) -> int:
        return self.matmuls + self.elementwise

    @property
    def training_kernels(self) -> int:
        """Forward plus backward kernels of one training step."""
        return self.forward_kernels + 2 * self.matmuls + self.elementwise

    def activation_bytes(self, bytes_per_element: int) -> float:
        """Bytes the memory-bound layers move per training image."""
        return float(self.elementwise_elements * ACTIVATION_ACCESSES * bytes_per_element)


def layer_counts(name: str, image_size: int | None = None) -> LayerCounts:
    """The counts of a registered model at ``image_size`` (default: the model's)."""
    import torch
    from torch import nn
    from torch.func import functional_call

    from bigbatch.models import create_model, model_spec

    try:
        size = image_size or model_spec(name).default_image_size
        model = create_model(name, 1000)
    except (KeyError, ValueError) as error:
        raise ConfigError(f"unknown model '{name}': {error}") from None
    matmul = (nn.Conv2d, nn.Linear)
    norm = (nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm)
    activation = (nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU)
    pool = (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d)
    counts = {"matmuls": 0, "elementwise": 0, "norms": 0, "elementwise_elements": 0}

    def record(module: nn.Module, _inputs: tuple, output: torch.Tensor) -> None:
        if isinstance(module, matmul):
            counts["matmuls"] += 1
            return
        counts["elementwise"] += 1
        if isinstance(module, norm):
            counts["norms"] += 1
        if isinstance(module, norm + activation):
            counts["elementwise_elements"] += output.numel()

    kinds = matmul + norm + activation + pool
    handles = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, kinds)]
    model.eval()
    stand_ins = {
        key: torch.empty_like(t, device="meta")
        for key, t in (*model.named_parameters(), *model.named_buffers())
    }
    try:
        with torch.no_grad():
            image = torch.empty((1, 3, size, size), device="meta")
            functional_call(model, stand_ins, (image,), tie_weights=True, strict=False)
    finally:
        for handle in handles:
            handle.remove()
    return LayerCounts(**counts)
