"""Fault injection for reliability tests, driven by one environment variable.

``BIGBATCH_FAULT="KIND:step=N[:rank=R]"`` where KIND is

- ``crash``: the process exits with code 13 at the start of global step N;
- ``sigkill``: the process kills itself with SIGKILL at the start of global step N;
- ``nan``: the loss of global step N is made NaN;
- ``kill-in-checkpoint``: SIGKILL in the middle of writing the first checkpoint after step N;
- ``clock-skew``: at global step N this rank's clock reads an hour ahead when it votes for a
  time-based checkpoint (ranks' clocks disagreeing, as they do on real machines).

Under torchrun the fault fires on the first attempt only (TORCHELASTIC_RESTART_COUNT == 0), so
that an elastic restart can show recovery. Without the variable nothing here does anything.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from bigbatch.errors import ConfigError

KINDS = ("crash", "sigkill", "nan", "kill-in-checkpoint", "clock-skew")
CRASH_EXIT_CODE = 13
CLOCK_SKEW_SECONDS = 3600.0


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


def fire_step_fault(fault: Fault | None, step: int, rank: int) -> None:
    """Crash or kill this process if the fault names this step and rank."""
    if fault is None or not fault.applies(step, rank):
        return
    if fault.kind == "crash":
        os._exit(CRASH_EXIT_CODE)
    if fault.kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)


def poisons_loss(fault: Fault | None, step: int, rank: int) -> bool:
    return fault is not None and fault.kind == "nan" and fault.applies(step, rank)


def kills_checkpoint(fault: Fault | None, step: int, rank: int) -> bool:
    return (
        fault is not None and fault.kind == "kill-in-checkpoint" and fault.applies_after(step, rank)
    )


def clock_skew(fault: Fault | None, step: int, rank: int) -> float:
    """Seconds this rank's clock runs ahead at ``step`` (0 without a ``clock-skew`` fault)."""
    skewed = fault is not None and fault.kind == "clock-skew" and fault.applies(step, rank)
    return CLOCK_SKEW_SECONDS if skewed else 0.0
