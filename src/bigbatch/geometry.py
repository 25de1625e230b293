"""The batch geometry of a run: B = b · W · A, built once and checked once.

A run is defined by its global batch B (examples per optimizer step, over all processes), its
micro-batch b (what one process forwards at once; also the BatchNorm batch) and its seed. The
number of processes W and the accumulation steps A = B / (b · W) are how that run is executed.
Every quantity derived from (B, b, W, N) lives here, so that the sampler, the training loop,
BatchNorm statistics, the schedule, evaluation, the sweep and the planner read one formula:

- A, the micro-batches each process accumulates per global step;
- B / b, the micro-batches of one global step over all processes, and the global index
  ``a · W + r`` of the micro-batch that rank r runs at accumulation step a;
- N // B, the global steps per epoch (the last ``N mod B`` examples of each epoch's order are
  left out: a partial global batch would change the effective batch of one step);
- b · A, the divisor of each micro-batch's summed loss, so that with DDP's mean over W ranks the
  gradient is the mean over the global batch;
- the evaluation batch, which is b.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bigbatch.errors import ConfigError


def steps_per_epoch(num_examples: int, global_batch: int) -> int:
    """Global steps in one epoch of ``num_examples``; the partial last global batch is dropped."""
    return num_examples // global_batch


def total_steps(epochs: float, steps_in_epoch: int) -> int:
    """Global steps of a run of ``epochs`` (at least one; a fractional epoch rounds up)."""
    return max(1, math.ceil(epochs * steps_in_epoch))


@dataclass(frozen=True)
class BatchGeometry:
    """B, b and W (and N, the training set's size, once it is known), validated on creation.

    Args:
        global_batch: B, examples per optimizer step over all processes.
        micro_batch: b, examples one process forwards at once.
        world_size: W, number of processes (default 1).
        num_examples: N, size of the training set; None where it is not known (a config checked
            before any data is opened). Then the per-epoch quantities are unavailable.
    """

    global_batch: int
    micro_batch: int
    world_size: int = 1
    num_examples: int | None = None

    def __post_init__(self) -> None:
        for name in ("global_batch", "micro_batch", "world_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name.replace('_', ' ')} must be at least 1, got "
                                  f"{getattr(self, name)}")
        per_step = self.micro_batch * self.world_size
        if self.global_batch % per_step:
            processes = ("" if self.world_size == 1
                         else f" x {self.world_size} processes = {per_step}")
            raise ConfigError(
                f"global batch {self.global_batch} is not a multiple of micro-batch "
                f"{self.micro_batch}{processes}; choose a global batch that is a multiple of "
                f"{per_step} or a smaller --micro-batch")
        if self.num_examples is not None:
            if self.num_examples < 1:
                raise ConfigError(f"the training set is empty ({self.num_examples} examples)")
            if self.global_batch > self.num_examples:
                raise ConfigError(
                    f"global batch {self.global_batch} is larger than the data set "
                    f"({self.num_examples} examples); lower --batch-size or use more data")

    @property
    def accumulation_steps(self) -> int:
        """A = B / (b · W): micro-batches each process accumulates per global step."""
        return self.global_batch // (self.micro_batch * self.world_size)

    @property
    def micro_batches_per_step(self) -> int:
        """B / b: micro-batches in one global step, over all processes."""
        return self.global_batch // self.micro_batch

    def micro_index(self, accumulation: int, rank: int) -> int:
        """Global index ``a · W + r`` of the micro-batch rank r runs at accumulation step a."""
        return accumulation * self.world_size + rank

    @property
    def loss_divisor(self) -> int:
        """b · A: each micro-batch's summed loss is divided by it (DDP then averages over W)."""
        return self.micro_batch * self.accumulation_steps

    @property
    def eval_batch(self) -> int:
        """Batch of one evaluation forward pass: the micro-batch, which is known to fit."""
        return self.micro_batch

    @property
    def steps_per_epoch(self) -> int:
        """Global steps per epoch (N // B)."""
        return steps_per_epoch(self._examples(), self.global_batch)

    @property
    def tail(self) -> int:
        """Examples of each epoch's order left unused (N mod B)."""
        return self._examples() - self.steps_per_epoch * self.global_batch

    def total_steps(self, epochs: float) -> int:
        """Global steps of a run of ``epochs``."""
        return total_steps(epochs, self.steps_per_epoch)

    def epoch_of(self, step: int) -> float:
        """How many epochs ``step`` global steps are."""
        return step / self.steps_per_epoch

    def _examples(self) -> int:
        if self.num_examples is None:
            raise ValueError("the batch geometry was built without the training set's size")
        return self.num_examples
