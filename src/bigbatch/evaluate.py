"""Exact evaluation: every validation example counted once, whatever the number of ranks.

Each rank takes a contiguous, disjoint shard of the validation set (no padding, unlike
DistributedSampler, which repeats examples to even out the shards) and the correct counts are
summed over ranks, so the result equals a single-process evaluation of the same weights.

With ``hflip`` (``eval.hflip``), each image's logits are the mean of the model's logits for
the image and for its horizontal mirror: the test-time augmentation that matches the training
flip, at twice the evaluation compute.
"""

from __future__ import annotations

import torch
from torch import nn

from bigbatch.data.loader import make_loader
from bigbatch.data.sampler import eval_batches, eval_shard
from bigbatch.distributed import DistContext, all_reduce_sum
from bigbatch.metrics import topk_correct


@torch.inference_mode()
def evaluate(
    model: nn.Module,
    dataset,
    ctx: DistContext,
    batch_size: int,
    workers: int = 0,
    channels_last: bool = False,
    autocast_dtype: torch.dtype | None = None,
    hflip: bool = False,
) -> dict[str, float]:
    """Top-1, top-5 (in %) and mean loss over the whole of ``dataset``."""
    was_training = model.training
    model.eval()
    shard = eval_shard(len(dataset), ctx.world_size, ctx.rank)
    totals = torch.zeros(5, dtype=torch.float64, device=ctx.device)  # top1, top5, loss, n, skipped
    loader = make_loader(dataset, eval_batches(shard, batch_size), workers)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    for batch in loader:
        images = batch.images.to(ctx.device, non_blocking=True, memory_format=memory_format)
        labels = batch.labels.to(ctx.device, non_blocking=True)
        with torch.autocast(
            ctx.device.type,
            dtype=autocast_dtype or torch.bfloat16,
            enabled=autocast_dtype is not None,
        ):
            logits = model(images)
            if hflip:
                logits = (logits.float() + model(images.flip(-1)).float()) / 2
        top1, top5 = topk_correct(logits.float(), labels)
        loss = nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
        counts = torch.tensor([len(labels), len(batch.skipped)], dtype=totals.dtype,
                              device=totals.device)
        totals += torch.cat([torch.stack([top1, top5, loss]).to(totals), counts])
    all_reduce_sum(totals, ctx)
    model.train(was_training)
    top1, top5, loss, count, skipped = totals.tolist()
    count = max(count, 1.0)
    return {
        "top1": 100.0 * top1 / count,
        "top5": 100.0 * top5 / count,
        "loss": loss / count,
        "examples": int(count),
        "skipped": int(skipped),
    }
