"""What happens when a step's loss or gradient is NaN or Inf.

Policy ``stop`` (the default): write every layer's weight and gradient norm to
``nonfinite-stepN.json`` in the run directory and stop (exit code 3); the last good checkpoint
is untouched. Policy ``skip``: drop the step (no optimizer update, BatchNorm statistics rolled
back) and go on, until more than ``max_skipped_steps`` steps were dropped; then stop as above.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from torch import nn

from bigbatch.config import RunConfig
from bigbatch.distributed import DistContext, barrier

log = logging.getLogger(__name__)


class NonFiniteLoss(RuntimeError):
    """Training stopped on a NaN/Inf loss or gradient."""


def nonfinite_gradients(model: nn.Module) -> torch.Tensor:
    """1.0 if any gradient holds a NaN or Inf, else 0.0, without a host synchronisation."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return torch.zeros((), device=next(model.parameters()).device)
    norms = torch._foreach_norm(grads)
    return (~torch.isfinite(torch.stack(norms).sum())).float()


def handle_nonfinite(cfg: RunConfig, ctx: DistContext, run_dir: Path, model: nn.Module,
                     step: int, loss: float, skipped_steps: int) -> None:
    """Apply the policy to a dropped step (already rolled back); raise NonFiniteLoss to stop."""
    if cfg.on_nonfinite == "skip" and skipped_steps <= cfg.max_skipped_steps:
        log.warning("step %d: non-finite loss or gradient, step skipped (%d so far)",
                    step, skipped_steps)
        return
    diagnostic = run_dir / f"nonfinite-step{step:09d}.json"
    if ctx.is_main:
        record = {"step": step, "loss": str(loss), "skipped_steps": skipped_steps,
                  "layers": layer_norms(model)}
        diagnostic.write_text(json.dumps(record, indent=2) + "\n")
    barrier(ctx)
    raise NonFiniteLoss(
        f"non-finite loss or gradient at step {step} (loss {loss}); per-layer norms written to "
        f"{diagnostic}; the last good checkpoint is in {run_dir / 'checkpoints'}"
    )


def layer_norms(model: nn.Module) -> dict[str, dict[str, str]]:
    """Weight and gradient norm of every parameter, as text (NaN and Inf included)."""
    norms = {}
    for name, param in model.named_parameters():
        grad = "none" if param.grad is None else str(param.grad.norm().item())
        norms[name] = {"weight_norm": str(param.detach().norm().item()), "grad_norm": grad}
    return norms
