"""ResNet-18 / ResNet-50 (v1.5, torchvision's) for any number of input channels and classes.

torchvision's ResNet puts the stride of each down-sampling bottleneck on the 3x3 conv ("v1.5");
the paper's Caffe ResNet-50 is v1 (stride on the first 1x1). Both have 25,557,032 parameters at
1000 classes. v1.5 costs a little more compute (4.09 G multiply-adds at 224 by
``forward_macs``; He et al. 2016 quote 3.8 G for v1) and is what MLPerf and most PyTorch
large-batch work train, so we use torchvision's rather than keep a fork.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:
    from torchvision.models.resnet import ResNet

_STEM_WIDTH = 64


def _stem_conv(in_channels: int) -> nn.Conv2d:
    """torchvision's 7x7/2 stem conv for ``in_channels`` inputs, with torchvision's He init."""
    conv = nn.Conv2d(in_channels, _STEM_WIDTH, kernel_size=7, stride=2, padding=3, bias=False)
    nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
    return conv


def _build_resnet(
    factory: str, num_classes: int, in_channels: int, zero_init_residual: bool
) -> ResNet:
    """torchvision's ``factory`` (``"resnet50"``, ``"resnet18"``). ``zero_init_residual`` zeroes
    the last BN gamma of every residual branch (bn3 in a Bottleneck, bn2 in a BasicBlock), so
    each block starts as the identity (Goyal et al. 2017, §5.1): the large-batch SGD baseline of
    the paper's comparison uses it. torchvision is imported here, not with the module: importing
    it costs about 3 s of CPU in every process, which runs of other models do not need."""
    from torchvision.models import resnet as tv_resnet

    if in_channels < 1:
        raise ValueError(f"in_channels must be >= 1, got {in_channels}")
    model = getattr(tv_resnet, factory)(
        weights=None, num_classes=num_classes, zero_init_residual=zero_init_residual
    )
    if in_channels != 3:
        model.conv1 = _stem_conv(in_channels)
    return model


def resnet50(
    num_classes: int, in_channels: int = 3, *, zero_init_residual: bool = False
) -> ResNet:
    """ResNet-50 (bottleneck blocks 3-4-6-3), randomly initialised."""
    return _build_resnet("resnet50", num_classes, in_channels, zero_init_residual)


def resnet18(
    num_classes: int, in_channels: int = 3, *, zero_init_residual: bool = False
) -> ResNet:
    """ResNet-18 (basic blocks 2-2-2-2), randomly initialised."""
    return _build_resnet("resnet18", num_classes, in_channels, zero_init_residual)
