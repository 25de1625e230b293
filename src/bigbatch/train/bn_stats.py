"""BatchNorm running statistics updated once per global step, whatever the accumulation.

PyTorch's BatchNorm updates its running mean/var at every forward in training mode, so with A
accumulation steps a global step would apply A exponential-moving-average updates, and the
result would depend on how the global batch is split between processes and accumulation.

We define the update per global step instead:

    r_{t+1} = (1 - m) r_t + m * mean over the step's micro-batches of the micro-batch statistic

Each rank achieves its share by restoring r_t before every micro-batch (so BatchNorm computes
(1 - m) r_t + m s_i) and averaging those results at the end of the step. The update is linear in
the statistics, so the ranks' running averages, averaged over ranks before evaluation and
checkpoint (distributed.average_buffers), equal the single-process value: the same global batch
gives the same running statistics for any number of processes.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


class PerStepRunningStats:
    """Makes a model's BatchNorm running statistics advance once per global step."""

    def __init__(self, model: nn.Module, accumulation_steps: int) -> None:
        self.layers = [
            m for m in model.modules() if isinstance(m, _BatchNorm) and m.track_running_stats
        ]
        self.accumulation_steps = accumulation_steps
        self._start: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._sums: list[tuple[torch.Tensor, torch.Tensor]] = []

    @property
    def active(self) -> bool:
        return bool(self.layers) and self.accumulation_steps > 1

    def begin_step(self) -> None:
        """Remember the statistics at the start of the step (also used by rollback)."""
        self._start = [
            (m.running_mean.clone(), m.running_var.clone(), m.num_batches_tracked.clone())
            for m in self.layers
        ]
        if self.active:
            self._sums = [
                (torch.zeros_like(m.running_mean), torch.zeros_like(m.running_var))
                for m in self.layers
            ]

    def after_micro_batch(self) -> None:
        """Accumulate this micro-batch's update and put the step's starting values back."""
        if not self.active:
            return
        for layer, (mean0, var0, _), (mean_sum, var_sum) in zip(
            self.layers, self._start, self._sums, strict=True
        ):
            mean_sum += layer.running_mean
            var_sum += layer.running_var
            layer.running_mean.copy_(mean0)
            layer.running_var.copy_(var0)

    def end_step(self) -> None:
        if not self.active:
            return
        for layer, (_, _, tracked0), (mean_sum, var_sum) in zip(
            self.layers, self._start, self._sums, strict=True
        ):
            layer.running_mean.copy_(mean_sum / self.accumulation_steps)
            layer.running_var.copy_(var_sum / self.accumulation_steps)
            layer.num_batches_tracked.copy_(tracked0 + 1)

    def rollback(self) -> None:
        """Put back the statistics of the step's start (a skipped non-finite step)."""
        for layer, (mean0, var0, tracked0) in zip(self.layers, self._start, strict=True):
            layer.running_mean.copy_(mean0)
            layer.running_var.copy_(var0)
            layer.num_batches_tracked.copy_(tracked0)
