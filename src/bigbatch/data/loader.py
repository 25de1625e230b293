"""One DataLoader per run: batches of keys in, Batch objects out, workers kept alive."""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch
from torch.utils.data import DataLoader, Dataset

from bigbatch.data.batch import Batch


def pass_through(batch: Batch) -> Batch:
    """collate_fn: datasets already return a whole Batch from __getitems__."""
    return batch


def single_threaded_worker(worker_id: int) -> None:
    """worker_init_fn: one intra-op thread per worker; the workers are the parallelism, and
    more threads per worker would oversubscribe the cores the training process needs."""
    torch.set_num_threads(1)


def make_loader(dataset: Dataset, batches: Iterable[list[tuple[int, int]]], workers: int,
                pin_memory: bool = False, prefetch_factor: int = 2) -> DataLoader:
    """A DataLoader that loads each list of keys in ``batches`` (e.g. TrainBatches) as one Batch.

    Workers are persistent, so one loader can serve the whole training without restarting them
    each epoch. For in-memory data (Fashion-MNIST, synthetic) ``workers=0`` is the right choice.
    """
    if workers < 0:
        raise ValueError(f"workers must be at least 0, got {workers}")
    parallel = workers > 0
    return DataLoader(
        dataset,
        batch_sampler=batches,
        collate_fn=pass_through,
        num_workers=workers,
        pin_memory=pin_memory,
        persistent_workers=parallel,
        prefetch_factor=prefetch_factor if parallel else None,
        worker_init_fn=single_threaded_worker if parallel else None,
    )


def available_cores() -> int:
    """CPU cores this process may run on (respects taskset/cgroup affinity, unlike cpu_count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no sched_getaffinity
        return os.cpu_count() or 1


def default_workers(processes_per_node: int = 1) -> int:
    """Loader workers per training process: its share of the cores minus one for itself."""
    share = available_cores() // max(1, processes_per_node)
    return max(1, share - 1)
