"""Models by name: AlexNet and AlexNet-BN as in the paper, torchvision ResNets, small CPU nets,
and any timm or torchvision model (timm:NAME, torchvision:NAME)."""

from bigbatch.models.flops import count_parameters, forward_flops, forward_macs
from bigbatch.models.registry import (
    ModelSpec,
    create_model,
    default_image_size,
    model_names,
    model_spec,
)

__all__ = [
    "ModelSpec",
    "count_parameters",
    "create_model",
    "default_image_size",
    "forward_flops",
    "forward_macs",
    "model_names",
    "model_spec",
]
