"""Small CNNs for 28x28 grayscale images (Fashion-MNIST), cheap enough to train on a laptop CPU.

These are the models the large-batch recipes are tested with on one machine: they keep BatchNorm
(so the micro-batch / BN-batch distinction of the paper's setup matters) and residual connections
(so LARS sees the same kinds of layers as in ResNet-50), at a cost of a few million multiply-adds
per image.

Both nets end in global average pooling, so any input size >= 8x8 and any number of input
channels work (e.g. 32x32 RGB for CIFAR-10).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn


def _conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    # No bias: every conv here is followed by BatchNorm, whose shift makes a bias redundant.
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 conv + BN layers with an identity (or 1x1 projection) shortcut (He et al. 2016)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_channels, out_channels, stride)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(out_channels, out_channels)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


def _conv_bn_relu(in_channels: int, out_channels: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        _conv3x3(in_channels, out_channels, stride),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


def _classifier_head(features: int, num_classes: int, dropout: float) -> nn.Sequential:
    return nn.Sequential(
        OrderedDict(
            pool=nn.AdaptiveAvgPool2d(1),
            flatten=nn.Flatten(),
            dropout=nn.Dropout(dropout),
            fc=nn.Linear(features, num_classes),
        )
    )


class SmallResNet(nn.Module):
    """Stem conv + three stages of residual basic blocks (widths w, 2w, 4w), GAP, linear.

    The stem has stride 2 (28 -> 14), so the stages run at 14x14, 7x7 and 4x4: running the first
    stage at full 28x28 resolution would cost 4x as much for about the same Fashion-MNIST accuracy,
    and the point of this net is to make large-batch experiments cheap on a CPU.
    """

    def __init__(
        self,
        num_classes: int,
        in_channels: int = 1,
        width: int = 32,
        blocks_per_stage: int = 1,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        widths = (width, 2 * width, 4 * width)
        self.stem = _conv_bn_relu(in_channels, width, stride=2)
        stages: list[nn.Module] = []
        in_width = width
        for index, stage_width in enumerate(widths):
            first_stride = 1 if index == 0 else 2
            blocks = [BasicBlock(in_width, stage_width, first_stride)]
            blocks += [BasicBlock(stage_width, stage_width) for _ in range(blocks_per_stage - 1)]
            stages.append(nn.Sequential(*blocks))
            in_width = stage_width
        self.stage1, self.stage2, self.stage3 = stages
        self.head = _classifier_head(widths[-1], num_classes, dropout)
        _init_conv_bn(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.stage3(self.stage2(self.stage1(x)))
        return self.head(x)


class SmallCNN(nn.Module):
    """Plain baseline: three stride-2 conv-BN-ReLU layers (widths w, 2w, 4w: 28 -> 14 -> 7 -> 4),
    GAP, linear. No residual connections, no pooling layers; about a quarter of
    :class:`SmallResNet`'s multiply-adds at the same width."""

    def __init__(
        self, num_classes: int, in_channels: int = 1, width: int = 32, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.features = nn.Sequential(
            OrderedDict(
                block1=_conv_bn_relu(in_channels, width, stride=2),
                block2=_conv_bn_relu(width, 2 * width, stride=2),
                block3=_conv_bn_relu(2 * width, 4 * width, stride=2),
            )
        )
        self.head = _classifier_head(4 * width, num_classes, dropout)
        _init_conv_bn(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def _init_conv_bn(model: nn.Module) -> None:
    """He-normal (fan_out) convs and unit-gamma BN, as in torchvision's ResNet: activations keep
    unit scale through the ReLUs, so training needs no warmup merely to get started."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


def small_resnet(
    num_classes: int,
    in_channels: int = 1,
    *,
    width: int = 32,
    blocks_per_stage: int = 1,
    dropout: float = 0.0,
) -> SmallResNet:
    """Small residual CNN for 28x28 inputs; see :class:`SmallResNet`."""
    _check_positive(width=width, blocks_per_stage=blocks_per_stage)
    _check_probability(dropout)
    return SmallResNet(num_classes, in_channels, width, blocks_per_stage, dropout)


def small_cnn(
    num_classes: int, in_channels: int = 1, *, width: int = 32, dropout: float = 0.0
) -> SmallCNN:
    """Plain three-conv CNN baseline for 28x28 inputs; see :class:`SmallCNN`."""
    _check_positive(width=width)
    _check_probability(dropout)
    return SmallCNN(num_classes, in_channels, width, dropout)


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def _check_probability(dropout: float) -> None:
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
