"""Per-step time split: data wait, forward+backward, exposed communication, optimizer.

Exposed communication is the time backward() spends waiting for gradient all-reduces after the
last bucket was handed to the network: DDP overlaps the all-reduce of each bucket with the rest
of the backward pass (the paper's per-layer overlap), so only this tail costs wall time.
A DDP communication hook records when each bucket's all-reduce is launched.
"""

# No `from __future__ import annotations`: DDP checks the hook's GradBucket annotation at runtime.
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class CommClock:
    """Launch time of the last gradient bucket in the current backward pass."""

    last_launch: float = 0.0
    buckets: int = 0


def timed_allreduce_hook(
    clock: CommClock, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Average a gradient bucket over ranks (DDP's default behaviour), noting the launch time."""
    clock.last_launch = time.perf_counter()
    clock.buckets += 1
    buffer = bucket.buffer()
    buffer.div_(dist.get_world_size())
    future = dist.all_reduce(buffer, async_op=True).get_future()
    return future.then(lambda done: done.value()[0])


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so wall-clock splits are honest on a GPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class StepTimer:
    """Accumulates the four parts of one global step, in seconds."""

    data: float = 0.0
    compute: float = 0.0
    comm_exposed: float = 0.0
    optimizer: float = 0.0
    _marks: dict[str, float] = field(default_factory=dict)

    def start(self, name: str) -> None:
        self._marks[name] = time.perf_counter()

    def stop(self, name: str) -> float:
        elapsed = time.perf_counter() - self._marks.pop(name)
        setattr(self, name, getattr(self, name) + elapsed)
        return elapsed

    def split_synced_backward(self, started: float, ended: float, clock: CommClock) -> None:
        """Book a synchronised micro-batch: compute until the last launch, the rest as exposed."""
        if clock.buckets and started <= clock.last_launch <= ended:
            self.compute += clock.last_launch - started
            self.comm_exposed += ended - clock.last_launch
        else:
            self.compute += ended - started

    def as_record(self) -> dict[str, float]:
        return {
            "time_data": self.data,
            "time_compute": self.compute,
            "time_comm_exposed": self.comm_exposed,
            "time_optimizer": self.optimizer,
        }
