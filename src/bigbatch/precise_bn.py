"""Precise BatchNorm statistics (``eval.bn_recompute: N``): the running statistics recomputed
for the weights being evaluated, the same bits on any number of processes.

Wu & Johnson, "Rethinking 'Batch' in BatchNorm" (2021), Sec. 3.1: the exponential moving
average a BatchNorm layer keeps during training mixes statistics of many past weights, and at
few steps or a large LR it estimates the final weights' population statistics poorly; PreciseBN
applies the fixed model to many training batches and aggregates the per-batch statistics with
equal weights. Here, for N training micro-batches of the run's micro-batch b:

    running_mean = (1 / N) sum_j mean_j,        running_var = (1 / N) sum_j var_j,

mean_j and var_j being micro-batch j's per-channel mean and unbiased variance of the layer's
input in training mode (what BatchNorm's forward computes and normalises with). The variance of
the micro-batch means is not added: the average of var_j is the expected normalising variance
of a training micro-batch, which is what inference stands in for.

Which micro-batches: micro-batch j (0 <= j < N) holds examples ``perm[j*b:(j+1)*b]`` of the
epoch permutation (data/sampler.py) of the epoch the evaluated step ends, with that epoch's
training augmentation, keys (index, epoch): a function of (seed, step) and not of the number of
processes W, and no randomness beyond the training's own. Dropout is seeded per micro-batch from
(seed, epoch, j), under a forked RNG, so training's random streams are untouched. Rank r runs the
micro-batches j = a * W + r (geometry.micro_index). Each writes its micro-batches' statistics
into row j of an N x (2 x channels) float64 matrix of zeros; one all-reduce sum (each entry has a
single non-zero term, so the sum is exact) gives every rank the full matrix, and its rows are
summed in index order: the result does not depend on W. The matrix costs 16 bytes per channel and
micro-batch (ResNet-50's 26.6k channels at N = 200: 85 MB).

Training never sees these statistics: the trainer keeps its running averages, evaluates with the
recomputed ones and puts its own back; final.pt carries the recomputed statistics, which are the
ones its reported accuracy was measured with (bigbatch.train.trainer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from bigbatch.data.batch import Batch
from bigbatch.data.device_batch import batch_on_device
from bigbatch.data.loader import make_loader
from bigbatch.data.sampler import GlobalBatchPlan, Key
from bigbatch.data.seeding import mix64
from bigbatch.distributed import DistContext, all_reduce_sum
from bigbatch.errors import ConfigError
from bigbatch.geometry import BatchGeometry

_DROPOUT_STREAM = 0x50424E  # "PBN": separates these dropout seeds from training's

Statistics = list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # (mean, var, tracked)


def bn_layers(model: nn.Module) -> list[_BatchNorm]:
    """The BatchNorm layers that keep running statistics, in module order."""
    return [m for m in model.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]


def save_statistics(model: nn.Module) -> Statistics:
    """A copy of every BatchNorm layer's running statistics."""
    return [(m.running_mean.clone(), m.running_var.clone(), m.num_batches_tracked.clone())
            for m in bn_layers(model)]


def load_statistics(model: nn.Module, saved: Statistics) -> None:
    """Put back statistics taken with :func:`save_statistics` from the same model."""
    for layer, (mean, var, tracked) in zip(bn_layers(model), saved, strict=True):
        layer.running_mean.copy_(mean)
        layer.running_var.copy_(var)
        layer.num_batches_tracked.copy_(tracked)


def check_count(count: int, geometry: BatchGeometry) -> None:
    """ConfigError unless ``count`` micro-batches fit in one epoch's order of the training set."""
    needed = count * geometry.micro_batch
    if needed > geometry.num_examples:
        raise ConfigError(
            f"eval.bn_recompute={count} needs {count} x micro-batch {geometry.micro_batch} = "
            f"{needed} training examples, the training set has {geometry.num_examples}; lower "
            "eval.bn_recompute")


def statistics_epoch(step: int, steps_per_epoch: int) -> int:
    """The epoch whose order and augmentation feed the statistics after ``step`` global steps:
    the epoch that step ``step`` ends (epoch 0 before any step)."""
    return max(step - 1, 0) // steps_per_epoch


def micro_batch_keys(geometry: BatchGeometry, seed: int, epoch: int,
                     count: int) -> list[list[Key]]:
    """The ``count`` micro-batches of the statistics: the first ``count * b`` examples of the
    epoch's order, as dataset keys (index, epoch)."""
    order = GlobalBatchPlan(geometry, 0, seed).epoch_permutation(epoch)
    b = geometry.micro_batch
    return [[(int(i), epoch) for i in order[j * b:(j + 1) * b]] for j in range(count)]


class PreciseBN:
    """Recomputes a model's BatchNorm running statistics from N training micro-batches.

    Args:
        count: N, the micro-batches averaged.
        dataset: the training set (the training augmentation; uint8 or float images).
        geometry: the run's batch geometry (b, W and the training set's size).
        seed: the run's seed.
        ctx: this process's place in the process group (all ranks call :meth:`apply`).
        workers, channels_last, autocast_dtype: as the run's evaluation uses them.
    """

    def __init__(self, count: int, dataset, geometry: BatchGeometry, seed: int,
                 ctx: DistContext, workers: int = 0, channels_last: bool = False,
                 autocast_dtype: torch.dtype | None = None) -> None:
        check_count(count, geometry)
        self.count, self.dataset, self.geometry, self.seed = count, dataset, geometry, seed
        self.ctx, self.workers, self.autocast_dtype = ctx, workers, autocast_dtype
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def evaluate(self, model: nn.Module, step: int, evaluate: Callable[[], dict[str, Any]],
                 trained: dict[str, Any]) -> tuple[dict[str, Any], Statistics]:
        """``evaluate()`` with the statistics recomputed, the model's own put back after.

        Returns the result, with ``trained_top1``, ``trained_top5`` and ``trained_loss`` from
        ``trained`` (the evaluation with the running statistics) and ``bn_recompute`` (N), and
        the recomputed statistics.
        """
        running = save_statistics(model)
        self.apply(model, step)
        recomputed = save_statistics(model)
        try:
            result = evaluate()
        finally:
            load_statistics(model, running)
        as_trained = {f"trained_{key}": trained[key] for key in ("top1", "top5", "loss")}
        return {**result, **as_trained, "bn_recompute": self.count}, recomputed

    @torch.no_grad()
    def apply(self, model: nn.Module, step: int) -> None:
        """Replace ``model``'s running statistics by the exact average over the N micro-batches
        of the epoch that global step ``step`` ends (num_batches_tracked is left as it was)."""
        layers = bn_layers(model)
        if not layers:
            return
        epoch = statistics_epoch(step, self.geometry.steps_per_epoch)
        rows = self.micro_batch_rows(model, layers, epoch)
        all_reduce_sum(rows, self.ctx)
        total = rows[0].clone()
        for row in rows[1:]:  # index order: the same additions on any number of processes
            total += row
        average = total / self.count
        offset = 0
        for layer in layers:
            channels = layer.running_mean.numel()
            layer.running_mean.copy_(average[offset:offset + channels])
            layer.running_var.copy_(average[offset + channels:offset + 2 * channels])
            offset += 2 * channels

    def micro_batch_rows(self, model: nn.Module, layers: list[_BatchNorm],
                         epoch: int) -> torch.Tensor:
        """N x (2 x channels) float64: row j holds micro-batch j's (mean, var) of every layer if
        this rank runs it, zeros otherwise."""
        width = sum(2 * layer.running_mean.numel() for layer in layers)
        rows = torch.zeros(self.count, width, dtype=torch.float64, device=self.ctx.device)
        mine = list(range(self.ctx.rank, self.count, self.ctx.world_size))  # j = a * W + r
        keys = micro_batch_keys(self.geometry, self.seed, epoch, self.count)
        loader = make_loader(self.dataset, [keys[j] for j in mine], self.workers)
        saved = save_statistics(model)
        momenta = [layer.momentum for layer in layers]
        was_training = model.training
        devices = [self.ctx.device] if self.ctx.device.type == "cuda" else []
        try:
            model.train()
            for layer in layers:
                layer.momentum = 1.0  # running statistic := this micro-batch's statistic
            with torch.random.fork_rng(devices=devices):
                for j, batch in zip(mine, loader, strict=True):
                    torch.manual_seed(mix64(self.seed, _DROPOUT_STREAM, epoch, j))
                    rows[j] = self.statistics_of(model, layers, batch)
        finally:
            for layer, momentum in zip(layers, momenta, strict=True):
                layer.momentum = momentum
            load_statistics(model, saved)
            model.train(was_training)
        return rows

    def statistics_of(self, model: nn.Module, layers: list[_BatchNorm],
                      batch: Batch) -> torch.Tensor:
        """One micro-batch's per-channel (mean, unbiased var) of every layer, concatenated.
        The running buffers are zeroed first, so that at momentum 1 the update leaves exactly
        the batch statistic, whichever way the kernel writes the moving average."""
        for layer in layers:
            layer.running_mean.zero_()
            layer.running_var.zero_()
        batch = batch_on_device(batch, self.ctx.device, self.memory_format,
                                getattr(self.dataset, "report_broken", None))
        with torch.autocast(self.ctx.device.type, dtype=self.autocast_dtype or torch.bfloat16,
                            enabled=self.autocast_dtype is not None):
            model(batch.images)
        return torch.cat([torch.cat([layer.running_mean, layer.running_var])
                          for layer in layers]).double()
