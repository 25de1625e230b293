"""Preemption: SIGTERM or SIGUSR1 asks the run to stop after the current global step.

SLURM sends SIGUSR1 (with ``--signal=USR1@120``) or SIGTERM before it preempts or times out a job.
The handler only sets a flag; the training loop reduces it over ranks with the step's other
statistics, so every rank stops after the same step, writes a checkpoint and exits with
``errors.EXIT_PREEMPTED`` (75, EX_TEMPFAIL: try again), which a requeued job resumes from.

Both signals end a process by default, and SLURM sends its warning at a time of its choosing:
under ``--signal=USR1@60`` it came 30-60 s into a two-minute job, which can be while a requeued
run is still starting (loading data, joining the process group) or already in its final
evaluation. ``catch_early`` records a signal from the start of ``bigbatch train``, so one that
comes before the training loop stops the run after its first step (with a checkpoint), and one
that comes after the last step lets the run finish. Once the command is done, ``ignore_from_now``
ignores them to the process's end: the interpreter's shutdown puts Python's handlers back to the
default, so a warning that came while torch was tearing down ended a finished run by the signal
(a requeued SLURM job, done, reported "died by signal: 10").
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
        if _EARLY.requested and self is not _EARLY:
            self.requested, self.signal_name = True, _EARLY.signal_name
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


_EARLY = StopRequest()


def catch_early() -> None:
    """Record preemption signals from now on; the training loop's StopRequest takes them over."""
    _EARLY.install()


def ignore_from_now() -> None:
    """The run has ended: preemption signals are ignored until the process exits."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
