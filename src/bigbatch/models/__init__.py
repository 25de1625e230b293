"""Models by name: AlexNet and AlexNet-BN as in the paper, torchvision ResNets, small CPU nets."""

from bigbatch.models.flops import count_parameters, forward_flops, forward_macs
from bigbatch.models.registry import ModelSpec, create_model, model_names, model_spec

__all__ = [
    "ModelSpec",
    "count_parameters",
    "create_model",
    "forward_flops",
    "forward_macs",
    "model_names",
    "model_spec",
]
