"""The run's record: config.yaml at the start, a metrics line per step and per evaluation,
summary.json and final.pt at the end (rank 0 writes them all)."""

from __future__ import annotations

import json
import logging
import resource
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bigbatch.config import RunConfig
from bigbatch.distributed import DistContext
from bigbatch.geometry import BatchGeometry
from bigbatch.metrics import quantiles

log = logging.getLogger(__name__)


def write_start_record(cfg: RunConfig, run_dir: Path, geometry: BatchGeometry, total_steps: int,
                       peak_lr: float, start_step: int) -> None:
    """config.yaml, and the derived batch layout in the log (nanoGPT prints it too)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(cfg.to_yaml())
    log.info(
        "global batch %d = micro-batch %d x %d processes x %d accumulation steps; %d steps/epoch, "
        "%d steps in all, peak LR %.4g",
        geometry.global_batch, geometry.micro_batch, geometry.world_size,
        geometry.accumulation_steps, geometry.steps_per_epoch, total_steps, peak_lr,
    )
    if start_step:
        log.info("continuing at step %d", start_step)


def trust_ratio_fields(optimizer: torch.optim.Optimizer,
                       names: dict[int, str]) -> dict[str, Any]:
    """min/median/max of the optimizer's last LARS trust ratios and ``trust_layers``, each
    adapted tensor's ratio by parameter name (nothing for other optimizers or before a step).
    The ratios are read from the device once."""
    getter = getattr(optimizer, "trust_ratios", None)
    ratios = getter() if getter is not None else None
    fields: dict[str, Any] = quantiles(ratios)
    parameters = getattr(optimizer, "trust_ratio_parameters", None)
    if ratios is not None and parameters is not None:
        values = ratios.tolist()
        fields["trust_layers"] = {
            names.get(id(p), f"parameter {i}"): value
            for i, (p, value) in enumerate(zip(parameters(), values, strict=True))
        }
    return fields


# With eval.bn_recompute: the result with the running BatchNorm statistics (bigbatch.precise_bn)
TRAINED_FIELDS = ("bn_recompute", "trained_top1", "trained_top5", "trained_loss")


def build_summary(cfg: RunConfig, ctx: DistContext, geometry: BatchGeometry, step: int,
                  skipped: tuple[int, int], result: dict[str, float], started: float,
                  train_seconds: float, train_images: int) -> dict[str, Any]:
    """summary.json: the result, the batch layout, the time and the memory of the run."""
    return {
        "top1": result.get("top1"),
        "top5": result.get("top5"),
        "val_loss": result.get("loss"),
        "val_examples": result.get("examples"),  # fewer than the split's with data.val_subset
        **{key: result[key] for key in TRAINED_FIELDS if key in result},
        "epochs": geometry.epoch_of(step),
        "steps": step,
        "global_batch": cfg.global_batch,
        "micro_batch": cfg.micro_batch,
        "world_size": ctx.world_size,
        "accumulation_steps": geometry.accumulation_steps,
        "wall_seconds": time.perf_counter() - started,
        "images_per_second": train_images / train_seconds if train_seconds else None,
        "skipped_steps": skipped[0],
        "skipped_images": skipped[1],
        "optimizer": cfg.optim.name,
        "model": cfg.model.name,
        "seed": cfg.seed,
        "peak_memory_mib": peak_memory_mib(),
    }


def write_final_record(cfg: RunConfig, run_dir: Path, model: nn.Module, classes: list,
                       summary: dict[str, Any]) -> None:
    """final.pt (weights, class names, config) and summary.json."""
    torch.save({"model": model.state_dict(), "classes": list(classes), "config": cfg.to_dict()},
               run_dir / "final.pt")
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def peak_memory_mib() -> float:
    """This process's peak resident memory (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
