"""The sweep's series: what each name in ``--optimizers`` trains with and how its LR grid scales.

A series is an optimizer plus the config settings that define it and the rule its grid centres
follow across batch sizes:

* ``sgd``: momentum SGD with the linear scaling rule and warmup of Goyal et al., "Accurate,
  Large Minibatch SGD: Training ImageNet in 1 Hour" (2017), Sec. 2.1-2.2.
* ``nesterov``: SGD with Nesterov momentum, the grid centred on the linear scaling rule; tuned
  as in Nado et al., "A Large Batch Optimizer Reality Check: Traditional, Generic Optimizers
  Suffice Across Batch Sizes" (2021), Sec. 3: its LR grid per point and, in a study, its warmup
  length searched as a second axis (one sweep per warmup).
* ``lars``: LARS with the recipe's own parameter groups (the project default excludes BN and
  bias tensors), square-root LR scaling.
* ``lars-paper``: LARS adapting and decaying every tensor, as the authors' Intel Caffe release
  of You et al., "ImageNet Training in Minutes" (ICPP 2018) does (``exclude_bn_and_bias=false``).
* ``lars-mlperf``: LARS with BN and bias tensors excluded from adaptation and decay, as the
  MLPerf ResNet-50 reference does (``exclude_bn_and_bias=true``).
* ``lamb``: LAMB (You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76
  Minutes", ICLR 2020, Algorithm 2), its norm and bias tensors excluded from adaptation and decay
  as in the authors' BERT setup, with the square-root LR scaling and warmup of that paper's
  Sec. 4 ("square root LR scaling", "linear-epoch warmup"): Adam-type updates are normalised per
  element, so the gradient-noise argument for sqrt(B) applies to them directly.

Every series pins the settings that define it, so a recipe change cannot turn one into another;
all other settings (model, decay, schedule, BatchNorm batch) are the sweep's and shared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LRRule:
    """How a point's grid centre follows the batch: lr * scale(B / reference_batch)."""

    lr: float
    reference_batch: int
    scaling: str  # "linear" or "sqrt", as config.optim.lr_scaling

    def centre(self, batch: int) -> float:
        ratio = batch / self.reference_batch
        return self.lr * (ratio if self.scaling == "linear" else math.sqrt(ratio))


@dataclass(frozen=True)
class Series:
    """One line of the study: an optimizer, the settings that define it, its default LR rule."""

    name: str
    optimizer: str  # config optim.name
    settings: tuple[str, ...]  # --set assignments, applied after the sweep's own
    rule: LRRule
    label: str  # legend of the figure

    def assignments(self) -> list[str]:
        return [f"optim.name={self.optimizer}", *self.settings]


# Default grid centres. SGD: the fashion-mnist-baseline recipe's LR at its batch. LARS: the
# fashion-mnist recipe's LR at batch 4096. LAMB: 1e-2 at 4096, a trust-ratio step of 1% of each
# tensor's norm (LAMB's update is normalised per element, so its LR is the relative step size).
SERIES = {
    series.name: series
    for series in (
        Series("sgd", "sgd", (), LRRule(0.1, 128, "linear"), "SGD, linear scaling + warmup"),
        Series("nesterov", "sgd", ("optim.nesterov=true",), LRRule(0.1, 128, "linear"),
               "Nesterov momentum, tuned LR and warmup"),
        Series("lars", "lars", (), LRRule(8.0, 4096, "sqrt"), "LARS, sqrt scaling + warmup"),
        Series("lars-paper", "lars", ("optim.exclude_bn_and_bias=false",),
               LRRule(8.0, 4096, "sqrt"), "LARS on every tensor (authors), sqrt scaling"),
        Series("lars-mlperf", "lars", ("optim.exclude_bn_and_bias=true",),
               LRRule(8.0, 4096, "sqrt"), "LARS, BN and bias excluded (MLPerf), sqrt scaling"),
        Series("lamb", "lamb", ("optim.exclude_bn_and_bias=true",),
               LRRule(0.01, 4096, "sqrt"), "LAMB, sqrt scaling + warmup"),
    )
}
