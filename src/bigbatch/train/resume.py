"""Resume policy: what a checkpoint of a run holds, when it is written, and how a run restarts.

A checkpoint holds the weights, the optimizer state, the position in global steps and the run's
defining values (seed, global batch, micro-batch, config). Nothing in it depends on the number
of processes, so a run resumes on any world size: the data order, the augmentation and the LR
are functions of (seed, global step) alone. ``checkpoint.resume: auto`` takes the latest
checkpoint of the run directory that verifies, removing temporaries a crash left behind; a path
takes that file. A checkpoint written with another seed or global batch is refused.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from bigbatch import checkpoint
from bigbatch.config import RunConfig
from bigbatch.distributed import DistContext
from bigbatch.errors import CheckpointError
from bigbatch.metrics import truncate_after_step
from bigbatch.train.faults import NoFaults

log = logging.getLogger(__name__)


@dataclass
class Position:
    """How far training has gone, in global steps; all a resume needs besides the tensors."""

    step: int = 0
    skipped_steps: int = 0
    skipped_images: int = 0


def checkpoint_state(cfg: RunConfig, model: nn.Module, optimizer: torch.optim.Optimizer,
                     position: Position) -> dict:
    """Everything a resume needs; nothing in it depends on the number of processes."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": position.step,
        "skipped_steps": position.skipped_steps,
        "skipped_images": position.skipped_images,
        "seed": cfg.seed,
        "global_batch": cfg.global_batch,
        "micro_batch": cfg.micro_batch,
        "config": cfg.to_dict(),
        "grad_scaler": None,  # bf16 autocast needs no loss scaling
    }


def save_checkpoint(cfg: RunConfig, ctx: DistContext, run_dir: Path, model: nn.Module,
                    optimizer: torch.optim.Optimizer, position: Position,
                    writer: NoFaults) -> None:
    """Rank 0 writes (the caller has made the ranks' BatchNorm statistics agree)."""
    if ctx.is_main:
        state = checkpoint_state(cfg, model, optimizer, position)
        writer.write_checkpoint(run_dir / "checkpoints", position.step, state,
                                cfg.checkpoint.keep)


class CheckpointClock:
    """When checkpoints are due: every epoch, every N steps, and every M minutes by any rank's
    clock (the ranks vote, so all of them take the same collective decision)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.every_steps = cfg.checkpoint.every_steps
        self.every_minutes = cfg.checkpoint.every_minutes
        self.last_saved = time.monotonic()

    def vote(self) -> bool:
        """This rank's vote for a time-based checkpoint."""
        minutes = self.every_minutes
        return bool(minutes) and time.monotonic() - self.last_saved >= 60.0 * minutes

    def due(self, step: int, clock_votes: float) -> bool:
        """Due by step count, or because any rank's clock says so (the votes are summed)."""
        return bool(self.every_steps and step % self.every_steps == 0) or clock_votes > 0

    def saved(self) -> None:
        self.last_saved = time.monotonic()


def restore(cfg: RunConfig, ctx: DistContext, run_dir: Path, model: nn.Module,
            optimizer: torch.optim.Optimizer) -> Position:
    """Load the checkpoint named by ``checkpoint.resume`` (the latest valid one for 'auto')."""
    resume = cfg.checkpoint.resume
    if resume is None:
        return Position()
    folder = run_dir / "checkpoints"
    if resume == "auto":
        found = checkpoint.load_agreed_latest(folder, ctx)  # rank 0 chooses for every rank
        if found is None:
            log.info("no checkpoint in %s: starting from scratch", folder)
            return Position()
        path, state = found
    else:
        path, state = Path(resume), checkpoint.load(Path(resume))
    check_resumable(cfg, state, path)
    checkpoint.load_model_state(model, state["model"], f"checkpoint {path}")
    checkpoint.load_optimizer_state(optimizer, state["optimizer"], f"checkpoint {path}")
    if ctx.is_main:
        truncate_after_step(run_dir / "metrics.jsonl", state["step"])
        log.info("resumed from %s at global step %d", path, state["step"])
    return Position(state["step"], state.get("skipped_steps", 0), state.get("skipped_images", 0))


def check_resumable(cfg: RunConfig, state: dict, path: Path) -> None:
    """A resume is exact only with the same seed and global batch; say so instead of drifting."""
    for key in ("seed", "global_batch"):
        if state.get(key) != getattr(cfg, key):
            raise CheckpointError(
                f"checkpoint {path} was written with {key}={state.get(key)}, this run has "
                f"{key}={getattr(cfg, key)}; use the same {key} to resume"
            )
