"""Exact reduction (``exact_reduction: true``): every sum whose order depends on how a global
batch is split across processes and accumulation steps is done in integers.

Floating-point addition is not associative, so the default mode's gradient (micro-batch
gradients accumulated in order on each rank, then all-reduced in the network's order), its
BatchNorm statistics and its logged loss carry last-bit differences between layouts, which
the training dynamics amplify. Integer addition is associative: here each micro-batch's value is
converted once to int64 at a fixed quantum (a multiple of 2^-bits), the int64 values are summed
over the step's micro-batches and ranks, and the sum is converted back once per step. Each
micro-batch's own value is computed identically in every layout (the same examples, weights and
kernels), so the sums, and the whole run, are bit-identical for any W and A.

Quanta and ranges (per value, summed over all B / b micro-batches of a step):

=================  ======  =========================  ==========================================
value              bits    quantum                    limit of one micro-batch's value
=================  ======  =========================  ==========================================
gradient entry     48      2^-48 ≈ 3.6e-15            2^14 / (B / b)   (16 at B / b = 1024)
BN running stat    32      2^-32 ≈ 2.3e-10            2^30 / (B / b)
summed loss        24      2^-24 ≈ 6.0e-8             2^38 / (B / b)
=================  ======  =========================  ==========================================

Gradients are of the summed micro-batch loss divided by B (not b · A), so every micro-batch
contributes the same quantity in every layout. A gradient entry beyond its limit would wrap
around; it is detected (with NaN and Inf) from each tensor's largest magnitude and the run
stops naming the tensor. The all-reduced gradient is int64: twice fp32's bytes.
"""

# No `from __future__ import annotations`: DDP checks the hook's GradBucket annotation at runtime.

import math
import time

import torch
import torch.distributed as dist
from torch import nn

from bigbatch.distributed import DistContext, all_reduce_sum
from bigbatch.geometry import BatchGeometry
from bigbatch.train.bn_stats import PerStepRunningStats
from bigbatch.train.nonfinite import NonFiniteLoss
from bigbatch.train.timing import CommClock
from bigbatch.train.votes import StepVotes

GRADIENT_BITS = 48
STATISTIC_BITS = 32
LOSS_BITS = 24
_INT64_BITS = 62  # the top bit is the sign; one more is left as headroom for rounding


def quantize(values: torch.Tensor, bits: int) -> torch.Tensor:
    """``values`` as int64 multiples of 2^-bits (round half to even; exact scaling in float64)."""
    return torch.round(values.double() * 2.0**bits).to(torch.int64)


def dequantize(values: torch.Tensor, bits: int, dtype: torch.dtype) -> torch.Tensor:
    """int64 multiples of 2^-bits back to ``dtype``."""
    return (values.double() * 2.0**-bits).to(dtype)


def value_limit(bits: int, geometry: BatchGeometry) -> float:
    """The largest magnitude one micro-batch's value may have, so that the sum over the step's
    micro-batches stays inside int64."""
    return 2.0 ** (_INT64_BITS - bits) / geometry.micro_batches_per_step


class ExactGradientSum:
    """The step's gradient summed in int64 over micro-batches and ranks.

    After every micro-batch's backward, :meth:`after_backward` adds the micro-batch's gradient to
    this rank's int64 totals and clears it. On several processes the last micro-batch goes
    through :func:`exact_allreduce_hook` instead, DDP's communication hook, which adds it, sums
    the totals over ranks in int64 (bucket by bucket, overlapped with the backward pass as usual)
    and writes the result back as the gradient; on one process :meth:`after_backward` does that.
    """

    def __init__(self, model: nn.Module, geometry: BatchGeometry, ctx: DistContext) -> None:
        self.names = {id(p): name for name, p in model.named_parameters() if p.requires_grad}
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.slot = {id(p): i for i, p in enumerate(self.params)}
        self.totals = [torch.zeros_like(p, dtype=torch.int64) for p in self.params]
        self.limit = value_limit(GRADIENT_BITS, geometry)
        self.ctx = ctx
        self.clock = CommClock()
        device = ctx.device
        self.nonfinite = torch.zeros((), dtype=torch.int64, device=device)
        self.overflow = torch.zeros(len(self.params), dtype=torch.int64, device=device)

    def begin_step(self) -> None:
        for total in self.totals:
            total.zero_()
        self.nonfinite.zero_()
        self.overflow.zero_()

    def add(self, slots: list[int], grads: list[torch.Tensor]) -> None:
        """Check and add one micro-batch's gradients of the parameters at ``slots``."""
        peaks = torch.stack(torch._foreach_norm(grads, ord=float("inf"))).double()
        finite = torch.isfinite(peaks)
        self.nonfinite += (~finite).sum()
        index = torch.tensor(slots, device=self.overflow.device)
        self.overflow.index_add_(0, index, (finite & (peaks > self.limit)).to(torch.int64))
        for slot, grad in zip(slots, grads, strict=True):
            self.totals[slot] += quantize(grad, GRADIENT_BITS)

    def after_backward(self, last: bool, synced_by_hook: bool) -> None:
        """Move this micro-batch's gradients into the totals (and, on the last micro-batch of a
        one-process step, write the step's gradient back). On the last micro-batch every
        gradient is given its parameter's memory layout: DDP's bucket views and autograd's
        fresh tensors can be laid out differently, and a norm summed in memory order would
        then see the same values in another order."""
        if last and synced_by_hook:
            self.lay_out_like_parameters()
            return
        present = [(self.slot[id(p)], p.grad) for p in self.params if p.grad is not None]
        slots, grads = [slot for slot, _ in present], [grad for _, grad in present]
        self.add(slots, grads)
        for slot, grad in present:
            if last:
                grad.copy_(dequantize(self.totals[slot], GRADIENT_BITS, grad.dtype))
            else:
                grad.zero_()
        if last:
            self.lay_out_like_parameters()

    def lay_out_like_parameters(self) -> None:
        for param in self.params:
            grad = param.grad
            if grad is not None and grad.stride() != param.stride():
                param.grad = torch.empty_like(param).copy_(grad)

    def votes(self) -> torch.Tensor:
        """[non-finite count, overflow count per tensor...] to be summed over ranks."""
        return torch.cat([self.nonfinite.view(1), self.overflow])

    def overflowing(self, overflow_counts: list[float]) -> list[str]:
        """Names of the tensors whose gradient exceeded the fixed-point range on some rank."""
        return [self.names[id(self.params[i])] for i, count in enumerate(overflow_counts)
                if count]


def exact_allreduce_hook(state: ExactGradientSum,
                         bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: add the bucket's gradients (the step's last micro-batch) to the
    totals, sum the totals over ranks in int64, and return them as the bucket's gradients."""
    state.clock.last_launch = time.perf_counter()
    state.clock.buckets += 1
    # The parameters' own gradients (DDP's views of the bucket in each parameter's layout), not
    # bucket.gradients(): for a channels_last parameter those are views with contiguous strides
    # over memory DDP filled in channels_last order, so they read the values permuted.
    params = bucket.parameters()
    grads = [param.grad for param in params]
    slots = [state.slot[id(p)] for p in params]
    state.add(slots, grads)
    flat = torch.cat([state.totals[slot].reshape(-1) for slot in slots])
    buffer = bucket.buffer()

    def write_back(done: torch.futures.Future) -> torch.Tensor:
        summed = done.value()[0]
        offset = 0
        for slot, grad in zip(slots, grads, strict=True):
            count = grad.numel()
            total = summed[offset:offset + count].view(state.totals[slot].shape)
            grad.copy_(dequantize(total, GRADIENT_BITS, grad.dtype))
            offset += count
        return buffer

    return dist.all_reduce(flat, async_op=True).get_future().then(write_back)


def exact_loss_votes(loss_sums: torch.Tensor, examples: int) -> torch.Tensor:
    """[summed loss in int64 multiples of 2^-LOSS_BITS, examples, non-finite losses] of this
    rank's micro-batches; ``loss_sums`` holds one summed loss per micro-batch."""
    finite = torch.isfinite(loss_sums)
    safe = torch.where(finite, loss_sums, torch.zeros_like(loss_sums))
    count = torch.tensor(examples, dtype=torch.int64, device=loss_sums.device)
    return torch.stack([quantize(safe, LOSS_BITS).sum(), count, (~finite).sum()])


def exact_mean(total: torch.Tensor, bits: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """The mean of ``count`` values from their int64 sum: one rounding, the same everywhere."""
    return (total.double() * 2.0**-bits / count).to(dtype)


class GradientOverflow(NonFiniteLoss):
    """A micro-batch's gradient left the fixed-point range of exact reduction."""


class ExactReduction:
    """The step's sums in fixed point: gradients (ExactGradientSum), BatchNorm statistics
    (ExactRunningStats), the loss and the example count. Same interface as
    reduction.FloatReduction."""

    def __init__(self, model: nn.Module, geometry: BatchGeometry, ctx: DistContext) -> None:
        self.ctx = ctx
        self.loss_divisor = geometry.global_batch  # the same per-micro-batch value in any layout
        self.gradients = ExactGradientSum(model, geometry, ctx)
        self.bn_stats = ExactRunningStats(model, geometry, ctx)
        self.comm_clock = self.gradients.clock

    def comm_hook(self):
        return self.gradients, exact_allreduce_hook

    def begin_step(self) -> None:
        self.gradients.begin_step()
        self.bn_stats.begin_step()

    def after_backward(self, last: bool, synced_by_hook: bool) -> None:
        self.gradients.after_backward(last, synced_by_hook)

    def reduce(self, losses: list[torch.Tensor], examples: int, stop: bool,
               clock_vote: bool) -> StepVotes:
        device = self.ctx.device
        flags = torch.tensor([int(stop), int(clock_vote)], dtype=torch.int64, device=device)
        votes = torch.cat([exact_loss_votes(torch.stack(losses), examples), flags,
                           self.gradients.votes()])
        loss, total_examples, bad_losses, stop_votes, clock_votes, bad_grads, *overflow = (
            all_reduce_sum(votes, self.ctx).tolist())
        overflowing = self.gradients.overflowing(overflow)
        if overflowing:
            raise GradientOverflow(
                f"the gradient of {', '.join(overflowing[:5])} exceeds the fixed-point range of "
                f"exact_reduction (a micro-batch's entry above {self.gradients.limit:g}); lower "
                "the LR or set exact_reduction=false")
        mean_loss = math.nan if bad_losses else loss * 2.0**-LOSS_BITS / max(total_examples, 1)
        return StepVotes(mean_loss, float(total_examples), bool(bad_losses or bad_grads),
                         float(stop_votes), float(clock_votes))

    def sync_buffers(self) -> None:
        """Nothing: the ranks' BatchNorm statistics are identical after every step."""


class ExactRunningStats(PerStepRunningStats):
    """BatchNorm running statistics advanced once per global step by the exact mean of the
    step's B / b micro-batch updates, summed in int64 over micro-batches and ranks every step, so
    every rank holds the same statistics (and no averaging across ranks is needed later)."""

    def __init__(self, model: nn.Module, geometry: BatchGeometry, ctx: DistContext) -> None:
        super().__init__(model, geometry.accumulation_steps)
        self.micro_batches = geometry.micro_batches_per_step
        self.ctx = ctx
        self._totals: list[torch.Tensor] = []

    @property
    def active(self) -> bool:
        return bool(self.layers)

    def begin_step(self) -> None:
        super().begin_step()
        self._totals = [torch.zeros(2 * m.running_mean.numel(), dtype=torch.int64,
                                    device=m.running_mean.device) for m in self.layers]

    def after_micro_batch(self) -> None:
        for layer, (mean0, var0, _), total in zip(self.layers, self._start, self._totals,
                                                  strict=True):
            update = torch.cat([layer.running_mean, layer.running_var])
            total += quantize(update, STATISTIC_BITS)
            layer.running_mean.copy_(mean0)
            layer.running_var.copy_(var0)

    def end_step(self) -> None:
        if not self.layers:
            return
        summed = all_reduce_sum(torch.cat(self._totals), self.ctx)
        offset = 0
        for layer, (_, _, tracked0) in zip(self.layers, self._start, strict=True):
            count = layer.running_mean.numel()
            mean = exact_mean(summed[offset:offset + count], STATISTIC_BITS, self.micro_batches,
                              layer.running_mean.dtype)
            var = exact_mean(summed[offset + count:offset + 2 * count], STATISTIC_BITS,
                             self.micro_batches, layer.running_var.dtype)
            layer.running_mean.copy_(mean)
            layer.running_var.copy_(var)
            layer.num_batches_tracked.copy_(tracked0 + 1)
            offset += 2 * count
