"""Progress on rank 0: a bar on a terminal, log lines when stderr is a file (SLURM, nohup).

A batch job's log gets a line every ``log.progress_every_steps`` steps (at multiples of it) and
at least every ``log.progress_every_seconds`` seconds, and one at the last step::

    step 150/3120 (epoch 2.40): loss 2.3456, lr 3.2, 12345 images/s, ETA 1:23:45

images/s is the training throughput since the previous line; the ETA is the remaining steps at
the wall-clock time per step since this process started training (evaluations and checkpoints
included).
"""

from __future__ import annotations

import datetime
import logging
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from bigbatch.config import LogConfig

log = logging.getLogger(__name__)


class StepReport(Protocol):
    """What a progress display reads of a step (the trainer's StepResult)."""

    lr: float
    loss: float
    examples: float
    seconds: float


class ProgressBar:
    """tqdm's bar, for a terminal."""

    def __init__(self, total: int, done: int) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, initial=done, unit="step", dynamic_ncols=True)

    def update(self, step: int, result: StepReport, note: str = "") -> None:
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{result.loss:.3f}", lr=f"{result.lr:.3g}",
                             img_s=f"{result.examples / result.seconds:.0f}",
                             **({"note": note} if note else {}))

    def close(self) -> None:
        self.bar.close()


class ProgressLines:
    """One log line every ``every_steps`` steps and at least every ``every_seconds`` seconds
    (0 turns a rule off), and at the last step."""

    def __init__(self, total: int, done: int, steps_per_epoch: int, every_steps: int,
                 every_seconds: float, clock: Callable[[], float] = time.monotonic,
                 emit: Callable[[str], Any] = log.info) -> None:
        self.total, self.steps_per_epoch = total, steps_per_epoch
        self.every_steps, self.every_seconds = every_steps, every_seconds
        self.clock, self.emit = clock, emit
        self.started = self.last_line = clock()
        self.first_step = done
        self.images = self.seconds = 0.0  # since the last line

    def due(self, step: int, now: float) -> bool:
        return (step == self.total
                or bool(self.every_steps and step % self.every_steps == 0)
                or bool(self.every_seconds and now - self.last_line >= self.every_seconds))

    def update(self, step: int, result: StepReport, note: str = "") -> None:
        """Count the step; emit the line when due (``note``, e.g. a straggler, at its end)."""
        self.images += result.examples
        self.seconds += result.seconds
        now = self.clock()
        if not self.due(step, now):
            return
        per_step = (now - self.started) / (step - self.first_step)
        eta = datetime.timedelta(seconds=round(per_step * (self.total - step)))
        rate = self.images / self.seconds if self.seconds else 0.0
        self.emit(f"step {step}/{self.total} (epoch {step / self.steps_per_epoch:.2f}): "
                  f"loss {result.loss:.4f}, lr {result.lr:.4g}, {rate:.0f} images/s, ETA {eta}"
                  + (f"; {note}" if note else ""))
        self.last_line, self.images, self.seconds = now, 0.0, 0.0

    def close(self) -> None:
        pass


def progress_for(is_main: bool, settings: LogConfig, total: int, done: int,
                 steps_per_epoch: int, stream: Any = None) -> ProgressBar | ProgressLines | None:
    """Rank 0's progress display: a bar when ``stream`` (stderr) is a terminal, lines if not."""
    if not is_main:
        return None
    if (stream or sys.stderr).isatty():
        return ProgressBar(total, done)
    return ProgressLines(total, done, steps_per_epoch, settings.progress_every_steps,
                         settings.progress_every_seconds)
