"""Recompute the BatchNorm statistics (bigbatch.precise_bn) of a fixed tiny model with as many
processes as the environment describes; rank 0 saves them to the file named by argv[1]."""

import sys

import torch
from torch import nn

from bigbatch.data.synthetic import SyntheticImages
from bigbatch.distributed import DistContext, init_distributed, shutdown
from bigbatch.geometry import BatchGeometry
from bigbatch.precise_bn import PreciseBN

COUNT, MICRO, EXAMPLES, STEP = 5, 8, 64, 3  # 5 micro-batches: 3 on rank 0 and 2 on rank 1


def tiny_model(dropout: float = 0.5) -> nn.Module:
    """Two conv BatchNorms and a BatchNorm1d after dropout (seeded per micro-batch)."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
        nn.Conv2d(4, 6, 3), nn.BatchNorm2d(6), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 5), nn.Dropout(dropout),
        nn.BatchNorm1d(5))


def dataset() -> SyntheticImages:
    return SyntheticImages(EXAMPLES, 1000, 8, seed=0)


def recomputed(ctx: DistContext, model: nn.Module | None = None) -> dict[str, torch.Tensor]:
    """The running statistics of ``model`` (default: tiny_model()) after PreciseBN."""
    model = model if model is not None else tiny_model()
    geometry = BatchGeometry(4 * MICRO, MICRO, ctx.world_size, EXAMPLES)
    PreciseBN(COUNT, dataset(), geometry, seed=0, ctx=ctx).apply(model, STEP)
    return {key: value for key, value in model.state_dict().items() if "running" in key}


if __name__ == "__main__":
    context = init_distributed("gloo")
    statistics = recomputed(context)
    if context.is_main:
        torch.save(statistics, sys.argv[1])
    shutdown()
