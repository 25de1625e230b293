"""AlexNet and AlexNet-BN in the layouts the paper trained (Caffe ``bvlc_alexnet``).

Layer names follow Caffe (``conv1`` .. ``conv5``, ``fc6`` .. ``fc8``), so state-dict keys read
``conv1.weight`` and per-layer ‖w‖/‖∇w‖ can be printed like Table 2 of the LARS paper.

Layout (input 227x227, the paper's crop)::

    conv1 11x11/4 96 -> relu1 -> norm1 (LRN) -> pool1 3/2          55 -> 27
    conv2 5x5 256 pad 2 group 2 -> relu2 -> norm2 (LRN) -> pool2   27 -> 13
    conv3 3x3 384 pad 1 -> relu3                                   13
    conv4 3x3 384 pad 1 group 2 -> relu4                           13
    conv5 3x3 256 pad 1 group 2 -> relu5 -> pool5 3/2              13 -> 6
    avgpool (adaptive, 6x6) -> flatten -> fc6 4096 -> relu6 -> drop6
    fc7 4096 -> relu7 -> drop7 -> fc8 num_classes

AlexNet-BN (You et al., "ImageNet Training in Minutes", ICPP 2018, and the
authors' Intel Caffe release) drops both LRN layers and puts a
BatchNorm immediately *before* conv2, conv3, conv4 and conv5 (``bn2`` .. ``bn5``: after pool1,
pool2, relu3 and relu4). Those BN layers are Caffe ``BatchNorm`` layers: moving-average fraction
0.9 (PyTorch momentum 0.1), eps 1e-4 and no learnable scale or shift (``bn_affine=False``).

Input scale: Caffe fed mean-subtracted 0-255 pixels (standard deviation about 58), and the
Gaussian fillers (std 0.01) were chosen for that scale. bigbatch feeds images normalised to unit
standard deviation, so a Caffe-initialised AlexNet multiplies its input by ``CAFFE_INPUT_SCALE``
(255 x ImageNet's mean per-channel std, 57.6) before conv1: the network then sees what Caffe's
saw, up to 1.5% per channel. Without it conv1's activations and gradients are 58x too small,
which changes the starting point of the paper's SGD recipes and the first-iteration ‖w‖/‖∇w‖
table (conv1 ~100 instead of ~4). ``init="torch"`` (Kaiming, made for unit-variance inputs) uses
scale 1; ``input_scale`` overrides either.

Pooling uses ``ceil_mode=True`` because Caffe rounds pooling output sizes up; at 227 this is the
same as flooring (55 -> 27 -> 13 -> 6). The adaptive average pool before fc6 is the identity at
227; for other sizes it resamples the pool5 map to 6x6 so that the fc6 weight shape (and the
parameter count, 60,965,224 at 1000 classes) never changes. Any input of at least 39x39 runs
(pool5 is then 1x1, copied to 6x6); from 63x63 on pool5 is at least 2x2 wide, which is the
smallest size worth training at (e.g. 64x64 downsampled ImageNet).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Literal

import torch
from torch import nn

from bigbatch.data.transforms import IMAGENET_STD

MIN_INPUT_SIZE = 39

# Standard deviation of ImageNet pixels in Caffe's 0-255 units: 255 x the mean of the per-channel
# stds that normalised inputs are divided by.
CAFFE_INPUT_SCALE = 255 * sum(IMAGENET_STD) / len(IMAGENET_STD)

# Caffe's LRN divides alpha by local_size, exactly like nn.LocalResponseNorm; bvlc_alexnet
# leaves k at Caffe's default of 1 (the 2012 paper used k = 2).
_LRN_SIZE, _LRN_ALPHA, _LRN_BETA, _LRN_K = 5, 1e-4, 0.75, 1.0

# Caffe BatchNorm: moving_average_fraction 0.9 -> PyTorch momentum 1 - 0.9; eps 1e-4.
_BN_MOMENTUM, _BN_EPS = 0.1, 1e-4

# bvlc_alexnet fillers: (weight std, bias constant). The positive biases keep the ReLUs of the
# tiny-initialised deeper layers alive at the start of training.
_CAFFE_FILLERS: dict[str, tuple[float, float]] = {
    "conv1": (0.01, 0.0),
    "conv2": (0.01, 0.1),
    "conv3": (0.01, 0.0),
    "conv4": (0.01, 0.1),
    "conv5": (0.01, 0.1),
    "fc6": (0.005, 0.1),
    "fc7": (0.005, 0.1),
    "fc8": (0.01, 0.0),
}

InitScheme = Literal["caffe", "torch"]


def _feature_layers(in_channels: int, batch_norm: bool, bn_affine: bool) -> OrderedDict:
    """The conv tower as (name, module) pairs in forward order."""

    def bn(channels: int) -> nn.BatchNorm2d:
        return nn.BatchNorm2d(channels, eps=_BN_EPS, momentum=_BN_MOMENTUM, affine=bn_affine)

    def lrn() -> nn.LocalResponseNorm:
        return nn.LocalResponseNorm(_LRN_SIZE, alpha=_LRN_ALPHA, beta=_LRN_BETA, k=_LRN_K)

    def pool() -> nn.MaxPool2d:
        return nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True)

    layers: list[tuple[str, nn.Module]] = [
        ("conv1", nn.Conv2d(in_channels, 96, kernel_size=11, stride=4)),
        ("relu1", nn.ReLU(inplace=True)),
    ]
    if not batch_norm:
        layers.append(("norm1", lrn()))
    layers.append(("pool1", pool()))
    if batch_norm:
        layers.append(("bn2", bn(96)))
    layers += [
        ("conv2", nn.Conv2d(96, 256, kernel_size=5, padding=2, groups=2)),
        ("relu2", nn.ReLU(inplace=True)),
    ]
    if not batch_norm:
        layers.append(("norm2", lrn()))
    layers.append(("pool2", pool()))
    if batch_norm:
        layers.append(("bn3", bn(256)))
    layers += [
        ("conv3", nn.Conv2d(256, 384, kernel_size=3, padding=1)),
        ("relu3", nn.ReLU(inplace=True)),
    ]
    if batch_norm:
        layers.append(("bn4", bn(384)))
    layers += [
        ("conv4", nn.Conv2d(384, 384, kernel_size=3, padding=1, groups=2)),
        ("relu4", nn.ReLU(inplace=True)),
    ]
    if batch_norm:
        layers.append(("bn5", bn(384)))
    layers += [
        ("conv5", nn.Conv2d(384, 256, kernel_size=3, padding=1, groups=2)),
        ("relu5", nn.ReLU(inplace=True)),
        ("pool5", pool()),
    ]
    return OrderedDict(layers)


def _classifier_layers(num_classes: int, dropout: float) -> OrderedDict:
    return OrderedDict(
        [
            ("avgpool", nn.AdaptiveAvgPool2d((6, 6))),
            ("flatten", nn.Flatten()),
            ("fc6", nn.Linear(256 * 6 * 6, 4096)),
            ("relu6", nn.ReLU(inplace=True)),
            ("drop6", nn.Dropout(dropout)),
            ("fc7", nn.Linear(4096, 4096)),
            ("relu7", nn.ReLU(inplace=True)),
            ("drop7", nn.Dropout(dropout)),
            ("fc8", nn.Linear(4096, num_classes)),
        ]
    )


class AlexNet(nn.Sequential):
    """AlexNet as one flat ``nn.Sequential`` whose children carry the Caffe layer names.

    Flat on purpose: ``model.conv1``, ``model.bn2`` and state-dict keys such as ``fc6.weight``
    are what per-layer tools (LARS trust-ratio reports, ``bigbatch inspect``) print.
    """

    def __init__(
        self,
        num_classes: int = 1000,
        in_channels: int = 3,
        *,
        batch_norm: bool = False,
        bn_affine: bool = False,
        dropout: float = 0.5,
        init: InitScheme = "caffe",
        input_scale: float | None = None,
    ) -> None:
        layers = _feature_layers(in_channels, batch_norm, bn_affine)
        layers.update(_classifier_layers(num_classes, dropout))
        super().__init__(layers)
        if init == "caffe":
            _apply_caffe_init(self)
        self.input_scale = _default_input_scale(init) if input_scale is None else input_scale

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        # Checked here because below the minimum PyTorch fails deep inside pool5 with a message
        # about a 0x0 output that does not say which input size would work.
        if min(images.shape[-2:]) < MIN_INPUT_SIZE:
            raise ValueError(
                f"AlexNet needs inputs of at least {MIN_INPUT_SIZE}x{MIN_INPUT_SIZE}, "
                f"got {tuple(images.shape[-2:])}"
            )
        if self.input_scale != 1.0:
            images = images * self.input_scale
        return super().forward(images)


def _apply_caffe_init(model: nn.Module) -> None:
    """Gaussian weights and constant biases of Caffe's ``bvlc_alexnet`` train_val.prototxt.

    The default because the paper's AlexNet recipes are Caffe runs started from Caffe's Gaussian
    fillers, and with LARS the starting weight norms matter: each layer's step is scaled by
    ‖w‖/‖∇w‖ (Table 2 of the LARS paper reports those ratios for this family of inits).
    ``init="torch"`` keeps PyTorch's Kaiming-uniform default instead.
    """
    for name, (std, bias) in _CAFFE_FILLERS.items():
        layer = getattr(model, name)
        nn.init.normal_(layer.weight, mean=0.0, std=std)
        nn.init.constant_(layer.bias, bias)


def _default_input_scale(init: str) -> float:
    """Caffe's fillers expect 0-255 pixels; Kaiming's expect unit variance."""
    return CAFFE_INPUT_SCALE if init == "caffe" else 1.0


def _check_options(dropout: float, init: str, input_scale: float | None) -> None:
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    if init not in ("caffe", "torch"):
        raise ValueError(f"init must be 'caffe' or 'torch', got {init!r}")
    if input_scale is not None and not (
        isinstance(input_scale, (int, float)) and not isinstance(input_scale, bool)
        and math.isfinite(input_scale) and input_scale > 0
    ):
        raise ValueError(f"input_scale must be a positive number, got {input_scale!r}")


def alexnet(
    num_classes: int,
    in_channels: int = 3,
    *,
    dropout: float = 0.5,
    init: InitScheme = "caffe",
    input_scale: float | None = None,
) -> AlexNet:
    """The original AlexNet with LRN (Krizhevsky et al. 2012, Caffe ``bvlc_alexnet`` layout).
    ``input_scale`` None: CAFFE_INPUT_SCALE with Caffe's init, 1 with PyTorch's."""
    _check_options(dropout, init, input_scale)
    return AlexNet(num_classes, in_channels, batch_norm=False, dropout=dropout, init=init,
                   input_scale=input_scale)


def alexnet_bn(
    num_classes: int,
    in_channels: int = 3,
    *,
    dropout: float = 0.5,
    bn_affine: bool = False,
    init: InitScheme = "caffe",
    input_scale: float | None = None,
) -> AlexNet:
    """AlexNet-BN of the paper: LRN removed, BatchNorm before conv2..conv5 (ICPP 2018).
    ``input_scale`` as for ``alexnet`` (BN after pool1 makes it matter for conv1 alone)."""
    _check_options(dropout, init, input_scale)
    return AlexNet(
        num_classes, in_channels, batch_norm=True, bn_affine=bn_affine, dropout=dropout, init=init,
        input_scale=input_scale,
    )
