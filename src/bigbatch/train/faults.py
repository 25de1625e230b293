"""Fault injection, driven by one environment variable, for the reliability tests and studies.

``BIGBATCH_FAULT="KIND:step=N[:rank=R]"`` where KIND is

- ``crash``: the process exits with code 13 at the start of global step N;
- ``sigkill``: the process kills itself with SIGKILL at the start of global step N;
- ``nan``: the logits, and so the loss and the gradients, of global step N are made NaN;
- ``kill-in-checkpoint``: SIGKILL in the middle of writing the first checkpoint after step N;
- ``clock-skew``: at global step N this rank's clock reads an hour ahead when it votes for a
  time-based checkpoint (ranks' clocks disagreeing, as they do on real machines);
- ``hang``: the process stops making progress at the start of global step N (it sleeps until
  it is killed), as a stuck rank or a run that outlasts its time limit does.

Under torchrun the fault fires on the first attempt only (TORCHELASTIC_RESTART_COUNT == 0), so
that an elastic restart can show recovery. Without the variable the hook is :class:`NoFaults`,
which does nothing. Only tests set the variable; the training loop calls the hook once per step.
"""

from __future__ import annotations

import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from bigbatch import checkpoint
from bigbatch.errors import ConfigError

KINDS = ("crash", "sigkill", "nan", "kill-in-checkpoint", "clock-skew", "hang")
CRASH_EXIT_CODE = 13
CLOCK_SKEW_SECONDS = 3600.0


class SaveClock(Protocol):
    """What a fault needs of the time-based checkpoint clock (resume.CheckpointClock)."""

    last_saved: float


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: int | None = None

    def applies(self, step: int, rank: int) -> bool:
        return step == self.step and self.rank in (None, rank)

    def applies_after(self, step: int, rank: int) -> bool:
        return step >= self.step and self.rank in (None, rank)


def fault_from_env(environ: dict[str, str] | None = None) -> Fault | None:
    env = os.environ if environ is None else environ
    spec = env.get("BIGBATCH_FAULT")
    if not spec or int(env.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return None
    kind, *fields = spec.split(":")
    values = dict(field.split("=", 1) for field in fields if "=" in field)
    if kind not in KINDS or "step" not in values:
        raise ConfigError(
            f"BIGBATCH_FAULT '{spec}' is not KIND:step=N[:rank=R] with KIND in {', '.join(KINDS)}"
        )
    rank = int(values["rank"]) if "rank" in values else None
    return Fault(kind, int(values["step"]), rank)


class NoFaults:
    """The hook of a normal run: every method does nothing."""

    def begin_step(self, step: int, model: nn.Module, clock: SaveClock) -> None:
        """Called once at the start of every global step."""

    def write_checkpoint(self, folder: Path, step: int, state: dict, keep: int) -> None:
        checkpoint.save(folder, step, state, keep)


class FaultInjector(NoFaults):
    """Injects ``fault`` on this rank: the one hook the training loop calls at each step start
    (and the checkpoint writer it uses)."""

    def __init__(self, fault: Fault, rank: int) -> None:
        self.fault = fault
        self.rank = rank
        self._poison: torch.utils.hooks.RemovableHandle | None = None

    def begin_step(self, step: int, model: nn.Module, clock: SaveClock) -> None:
        if self._poison is not None:
            self._poison.remove()
            self._poison = None
        if not self.fault.applies(step, self.rank):
            return
        if self.fault.kind == "crash":
            os._exit(CRASH_EXIT_CODE)
        if self.fault.kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fault.kind == "hang":
            while True:
                time.sleep(3600)
        if self.fault.kind == "clock-skew":  # this rank's clock says the last save is an hour old
            clock.last_saved -= CLOCK_SKEW_SECONDS
        if self.fault.kind == "nan":  # every training forward of this step returns NaN logits
            self._poison = model.register_forward_hook(
                lambda module, inputs, out: out * math.nan if module.training else out)

    def write_checkpoint(self, folder: Path, step: int, state: dict, keep: int) -> None:
        if self.fault.kind == "kill-in-checkpoint" and self.fault.applies_after(step, self.rank):
            write_half_and_die(folder, state)
        super().write_checkpoint(folder, step, state, keep)


def write_half_and_die(folder: Path, state: dict) -> None:
    """Write half a checkpoint to the temporary file a real save would use, then SIGKILL."""
    folder.mkdir(parents=True, exist_ok=True)
    blob = checkpoint.encode(state)
    with open(folder / f".{checkpoint.checkpoint_name(0)}.tmp-{os.getpid()}", "wb") as file:
        file.write(blob[: len(blob) // 2])
        file.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def fault_hook(rank: int, environ: dict[str, str] | None = None) -> NoFaults:
    """The run's fault hook: a FaultInjector if BIGBATCH_FAULT names a fault, else NoFaults."""
    fault = fault_from_env(environ)
    return NoFaults() if fault is None else FaultInjector(fault, rank)
