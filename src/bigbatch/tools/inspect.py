"""‖w‖/‖∇w‖ per parameter tensor at the first iteration: the table that motivates LARS.

    bigbatch inspect --model alexnet                     # synthetic 227x227 input, batch 8
    bigbatch inspect --model small_resnet --dataset fashion-mnist
    bigbatch inspect --model alexnet --dataset imagefolder --data /data/imagenet --batch 64

The LARS paper (Table 2) shows that at the first iteration of AlexNet the ratio of weight norm to
gradient norm differs by more than two orders of magnitude between layers (conv1.w 5.76 vs
fc6.w 1345). One global learning rate is then too large for some layers and too small for others;
LARS gives every layer the local rate η·‖w‖/‖∇w‖ (You, Gitman, Ginsburg,
"Large Batch Training of Convolutional Networks", 2017). This module measures the same
table for any registered model: a freshly initialised model, one forward and backward pass of
cross-entropy on one batch in training mode, no optimizer step.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
from torch import nn

from bigbatch.errors import ConfigError

log = logging.getLogger(__name__)


# LARS paper (You, Gitman, Ginsburg, 2017) Table 2: AlexNet, first iteration. Keys are our
# parameter names.
PAPER_ALEXNET_RATIOS = {
    "conv1.weight": 5.76,
    "conv1.bias": 8.48,
    "conv2.weight": 83.5,
    "conv3.weight": 127.0,
    "conv4.weight": 148.0,
    "conv5.weight": 69.0,
    "fc6.weight": 1345.0,
    "fc7.weight": 489.0,
    "fc8.weight": 19.0,
}


INSPECT_DATA = ("synthetic", "fashion-mnist", "imagefolder", "packed")


SYNTHETIC_CLASSES = 1000  # ImageNet's, so fc8 has the paper's shape


@dataclass(frozen=True)
class ParameterRatio:
    """One row of the table."""

    name: str
    shape: tuple[int, ...]
    weight_norm: float
    grad_norm: float

    @property
    def ratio(self) -> float:
        """‖w‖/‖∇w‖; inf for a zero gradient, nan for a tensor with no gradient at all."""
        if math.isnan(self.grad_norm):
            return math.nan
        return self.weight_norm / self.grad_norm if self.grad_norm > 0 else math.inf


def first_iteration_ratios(model: nn.Module, images: torch.Tensor,
                           labels: torch.Tensor) -> list[ParameterRatio]:
    """‖w‖ and ‖∇w‖ of every parameter after one cross-entropy forward/backward (train mode).

    The loss is the batch mean, as in the training loop, so ‖∇w‖ is the norm of the mean gradient.
    """
    model.train()
    model.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    rows = []
    for name, parameter in model.named_parameters():
        grad = parameter.grad
        grad_norm = float(grad.norm()) if grad is not None else math.nan
        rows.append(ParameterRatio(name, tuple(parameter.shape), float(parameter.detach().norm()),
                                   grad_norm))
    return rows


def inspection_batch(data: str, batch: int, image_size: int, seed: int, input_std: float = 1.0,
                     data_path: str | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(images, labels, number of classes) of the batch to inspect on.

    Synthetic: Gaussian images of the requested size with standard deviation ``input_std`` and
    labels from 1000 classes. 1.0 is the scale of per-channel normalised images, what the
    training pipeline feeds every model (a Caffe-initialised AlexNet rescales them to Caffe's
    0-255 pixel units itself, see models.alexnet). Real data: ``real_batch``, times ``input_std``.
    """
    if data == "synthetic":
        generator = torch.Generator().manual_seed(seed)
        images = torch.randn((batch, 3, image_size, image_size), generator=generator)
        labels = torch.randint(0, SYNTHETIC_CLASSES, (batch,), generator=generator)
        return images * input_std, labels, SYNTHETIC_CLASSES
    images, labels, classes = real_batch(data, data_path, batch, image_size, seed)
    return images * input_std, labels, classes


def real_batch(data: str, data_path: str | None, batch: int, image_size: int, seed: int
               ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``batch`` validation examples spread evenly over the validation set of ``data`` (no
    augmentation, normalised as for training), at ``image_size``. Unreadable images are left
    out and reported; fewer than two readable ones is an error."""
    from bigbatch.data import build_datasets

    folder_data = data in ("imagefolder", "packed")
    _, val = build_datasets(data, path=data_path, seed=seed,
                            image_size=image_size if folder_data else None)
    if batch > len(val):
        raise ConfigError(f"--batch {batch} is larger than the validation set of {data} "
                          f"({len(val)} examples)")
    indices = torch.linspace(0, len(val) - 1, batch).round().long().tolist()
    loaded = val.__getitems__(indices)
    if loaded.skipped:
        log.warning("%d of the %d chosen images could not be read and are left out",
                    len(loaded.skipped), batch)
    if len(loaded) < 2:
        raise ConfigError(f"fewer than 2 readable images among the {batch} chosen from {data}")
    images = loaded.images
    if images.shape[-1] != image_size:
        images = nn.functional.interpolate(images, size=(image_size, image_size),
                                           mode="bilinear", align_corners=False)
    return images, loaded.labels, len(val.classes)


def default_image_size(model_name: str, data: str) -> int:
    from bigbatch.models import model_spec

    spec = _model_spec_or_error(model_spec, model_name)
    size = getattr(spec, "default_image_size", None)
    if size:
        return int(size)
    return 28 if data == "fashion-mnist" else 224


def _model_spec_or_error(model_spec, name: str):
    try:
        return model_spec(name)
    except (KeyError, ValueError) as error:
        raise ConfigError(str(error).strip("'\"")) from None


def build_fresh_model(name: str, num_classes: int, in_channels: int, seed: int,
                      options: dict | None = None) -> nn.Module:
    """``name`` with fresh weights from ``seed``; ``options`` are the model's keyword options."""
    from bigbatch.models import create_model

    torch.manual_seed(seed)
    try:
        return create_model(name, num_classes, in_channels, **(options or {}))
    except (KeyError, ValueError) as error:
        raise ConfigError(str(error).strip("'\"")) from None


def inspect_model(model_name: str, data: str = "synthetic", image_size: int | None = None,
                  batch: int = 8, seed: int = 0, input_std: float = 1.0,
                  options: dict | None = None, data_path: str | None = None
                  ) -> list[ParameterRatio]:
    """The first-iteration table of ``model_name`` (fresh weights from ``seed``, built with the
    model ``options``, e.g. ``{"init": "torch"}``) on a batch of data set ``data`` (read from
    ``data_path`` where it needs a folder)."""
    if data not in INSPECT_DATA:
        raise ConfigError(f"--dataset '{data}' is not supported; choose one of "
                          f"{', '.join(INSPECT_DATA)}")
    if batch < 2:
        raise ConfigError(f"--batch must be at least 2 (BatchNorm needs two examples), got {batch}")
    size = image_size or default_image_size(model_name, data)
    if size < 1:
        raise ConfigError(f"--image-size must be positive, got {size}")
    if not (input_std > 0 and math.isfinite(input_std)):
        raise ConfigError(f"--input-std must be a positive number, got {input_std}")
    images, labels, num_classes = inspection_batch(data, batch, size, seed, input_std, data_path)
    model = build_fresh_model(model_name, num_classes, images.shape[1], seed, options)
    try:
        return first_iteration_ratios(model, images, labels)
    except RuntimeError as error:
        raise ConfigError(f"model '{model_name}' cannot take {size}x{size} input: "
                          f"{str(error).splitlines()[0]}; pick another --image-size") from None


def format_table(rows: list[ParameterRatio], paper: dict[str, float] | None) -> str:
    """A fixed-width table, one line per parameter tensor, with the paper's value if known."""
    name_width = max(len("parameter"), *(len(r.name) for r in rows))
    header = f"{'parameter':<{name_width}}  {'shape':<20} {'‖w‖':>10} {'‖∇w‖':>10} {'‖w‖/‖∇w‖':>10}"
    if paper is not None:
        header += f" {'paper':>8}"
    lines = [header, "-" * len(header)]
    for row in rows:
        shape = "x".join(str(d) for d in row.shape)
        line = (f"{row.name:<{name_width}}  {shape:<20} {row.weight_norm:>10.4g} "
                f"{row.grad_norm:>10.4g} {row.ratio:>10.4g}")
        if paper is not None:
            value = paper.get(row.name)
            line += f" {value:>8.4g}" if value is not None else f" {'':>8}"
        lines.append(line)
    return "\n".join(lines)


def spread_summary(rows: list[ParameterRatio]) -> str:
    """One line: the largest and smallest finite ratio and their quotient."""
    finite = [r for r in rows if math.isfinite(r.ratio) and r.ratio > 0]
    if not finite:
        return "no finite ratios (no gradients reached the parameters)"
    low = min(finite, key=lambda r: r.ratio)
    high = max(finite, key=lambda r: r.ratio)
    return (f"spread: {high.name} {high.ratio:.4g} / {low.name} {low.ratio:.4g} = "
            f"{high.ratio / low.ratio:.3g}x (one global LR cannot suit every layer; LARS scales "
            "each layer by η‖w‖/‖∇w‖)")


def paper_values_for(model_name: str) -> dict[str, float] | None:
    """Table 2 is AlexNet's; its rows are shown next to ours for that model only."""
    return PAPER_ALEXNET_RATIOS if model_name == "alexnet" else None
