"""Preemption: SIGTERM or SIGUSR1 asks the run to stop after the current global step.

SLURM sends SIGUSR1 (with ``--signal=USR1@120``) or SIGTERM before it preempts or times out a job.
The handler only sets a flag; the training loop reduces it over ranks with the step's other
statistics, so every rank stops after the same step, writes a checkpoint and exits with
``errors.EXIT_PREEMPTED`` (75, EX_TEMPFAIL: try again), which a requeued job resumes from.
"""

from __future__ import annotations

import signal
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequest:
    """Set by a preemption signal; read once per global step."""

    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        self.signal_name = signal.Signals(signum).name

    def install(self) -> StopRequest:
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
