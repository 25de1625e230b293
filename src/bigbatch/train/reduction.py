"""How a global step's sums are formed: in floating point (the default) or in fixed point
(``exact_reduction: true``, bigbatch.train.fixed_point).

Both give the training loop the same four things: the divisor of each micro-batch's summed loss,
what to do after each backward, BatchNorm statistics that advance once per global step, and one
reduction over ranks of the loss, the example count, the non-finite check and the stop and
checkpoint votes, so every rank takes the same decisions after the same step.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from bigbatch.distributed import DistContext, all_reduce_sum, average_buffers
from bigbatch.geometry import BatchGeometry
from bigbatch.train.bn_stats import PerStepRunningStats
from bigbatch.train.fixed_point import ExactReduction
from bigbatch.train.nonfinite import nonfinite_gradients
from bigbatch.train.timing import CommClock, timed_allreduce_hook
from bigbatch.train.votes import StepVotes


class FloatReduction:
    """The default: micro-batch gradients accumulated in fp32 on each rank, averaged over ranks
    by DDP's all-reduce; BatchNorm statistics averaged over ranks before evaluation and
    checkpoints. Layouts agree to float rounding (docs/DISTRIBUTED.md)."""

    def __init__(self, model: nn.Module, geometry: BatchGeometry, ctx: DistContext) -> None:
        self.model = model
        self.ctx = ctx
        self.loss_divisor = geometry.loss_divisor
        self.bn_stats = PerStepRunningStats(model, geometry.accumulation_steps)
        self.comm_clock = CommClock()

    def comm_hook(self):
        """(state, hook) for DistributedDataParallel.register_comm_hook."""
        return self.comm_clock, timed_allreduce_hook

    def begin_step(self) -> None:
        self.bn_stats.begin_step()

    def after_backward(self, last: bool, synced_by_hook: bool) -> None:
        """Nothing: autograd accumulates the micro-batch gradients in place."""

    def reduce(self, losses: list[torch.Tensor], examples: int, stop: bool,
               clock_vote: bool) -> StepVotes:
        device = self.ctx.device
        loss_sum = torch.zeros((), device=device)
        for loss in losses:
            loss_sum += loss
        flags = torch.stack([
            loss_sum,
            torch.tensor(float(examples), device=device),
            nonfinite_gradients(self.model),
            torch.tensor(float(stop), device=device),
            torch.tensor(float(clock_vote), device=device),
        ])
        total_loss, total_examples, nonfinite, stop_votes, clock_votes = (
            all_reduce_sum(flags, self.ctx).tolist())
        mean_loss = total_loss / max(total_examples, 1.0)
        return StepVotes(mean_loss, total_examples, bool(nonfinite) or not math.isfinite(mean_loss),
                         stop_votes, clock_votes)

    def sync_buffers(self) -> None:
        """Average the ranks' BatchNorm statistics (before evaluation and checkpoints)."""
        average_buffers(self.model, self.ctx)


def reduction_for(exact: bool, model: nn.Module, geometry: BatchGeometry, ctx: DistContext):
    """FloatReduction, or fixed_point.ExactReduction when ``exact``."""
    if not exact:
        return FloatReduction(model, geometry, ctx)
    return ExactReduction(model, geometry, ctx)
