"""World-size-invariant, resumable batching.

A run is defined by the global batch B, the micro-batch b and the seed. Each epoch has one
permutation of the data set, a pure function of (seed, epoch). Global step s takes the B indices
``perm[s*B:(s+1)*B]``; they are cut into B/b micro-batches, micro-batch j being
``step[j*b:(j+1)*b]``. With W processes and A = B/(b*W) accumulation steps, rank r runs
micro-batch ``j = a*W + r`` at accumulation step a (bigbatch.geometry holds these formulas).
The micro-batches, and so the BatchNorm batches and the summed gradient of the step, are
therefore the same for every W.

Tail policy: an epoch has ``num_examples // B`` steps; the last ``num_examples % B`` examples of
each epoch's permutation are not used in that epoch (a different set each epoch). The paper's
large-batch schedules are defined in whole global batches, and a partial global batch would
change the effective batch size of one step.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from bigbatch.data.seeding import mix64_array
from bigbatch.errors import ConfigError
from bigbatch.geometry import BatchGeometry

# Separates the permutation's hash stream from the augmentation streams of seeding.py.
_PERMUTATION_STREAM = 0x5045524D  # "PERM"

Key = tuple[int, int]  # (example index, epoch): what a dataset needs to load one augmented example


class GlobalBatchPlan:
    """Which examples each global step and micro-batch holds, and which rank runs which.

    Args:
        geometry: the run's batch geometry (B, b, W and N).
        rank: this process's rank in [0, W) (default 0).
        seed: run seed; the data order is a function of (seed, epoch) only (default 0).
    """

    def __init__(self, geometry: BatchGeometry, rank: int = 0, seed: int = 0) -> None:
        if geometry.num_examples is None:
            raise ValueError("a batch plan needs the geometry of a known training set")
        if not 0 <= rank < geometry.world_size:
            raise ConfigError(f"rank {rank} is outside [0, {geometry.world_size}); "
                              "check RANK and WORLD_SIZE in the environment")
        self.geometry = geometry
        self.rank = rank
        self.seed = seed
        self._permutations: dict[int, np.ndarray] = {}

    @property
    def num_examples(self) -> int:
        return self.geometry.num_examples

    @property
    def micro_batch(self) -> int:
        return self.geometry.micro_batch

    @property
    def accumulation_steps(self) -> int:
        return self.geometry.accumulation_steps

    @property
    def steps_per_epoch(self) -> int:
        return self.geometry.steps_per_epoch

    def epoch_permutation(self, epoch: int) -> np.ndarray:
        """The epoch's order of all example indices: argsort of hashes of (seed, epoch, index).

        Sorting random keys gives a uniformly random permutation that is defined by our hash
        alone, not by a library RNG whose stream could change between numpy versions.
        """
        cached = self._permutations.get(epoch)
        if cached is None:
            keys = mix64_array((_PERMUTATION_STREAM, self.seed, epoch),
                               np.arange(self.num_examples, dtype=np.int64))
            cached = np.argsort(keys, kind="stable")
            cached.setflags(write=False)
            self._permutations.clear()  # one epoch at a time: ImageNet's is 10 MB
            self._permutations[epoch] = cached
        return cached

    def step_indices(self, epoch: int, step: int) -> np.ndarray:
        """The B example indices of global step ``step`` of ``epoch`` (the same on all ranks)."""
        if not 0 <= step < self.steps_per_epoch:
            raise ValueError(f"step {step} is outside [0, {self.steps_per_epoch})")
        batch = self.geometry.global_batch
        return self.epoch_permutation(epoch)[step * batch:(step + 1) * batch]

    def micro_batch_indices(self, epoch: int, step: int, micro: int) -> np.ndarray:
        """Micro-batch ``micro`` (in [0, B/b)) of a global step, independent of W."""
        count = self.geometry.micro_batches_per_step
        if not 0 <= micro < count:
            raise ValueError(f"micro-batch {micro} is outside [0, {count})")
        start = micro * self.micro_batch
        return self.step_indices(epoch, step)[start:start + self.micro_batch]

    def rank_micro_batches(self, epoch: int, step: int) -> list[np.ndarray]:
        """This rank's A micro-batches of a global step, in accumulation order (j = a*W + r)."""
        return [self.micro_batch_indices(epoch, step, self.geometry.micro_index(a, self.rank))
                for a in range(self.accumulation_steps)]


class TrainBatches:
    """This rank's micro-batches of keys (index, epoch) for a whole training, in order.

    Iterates step-major, accumulation-minor from (start_epoch, start_step) to the end of epoch
    ``epochs - 1``, so a single DataLoader (with persistent workers) serves the whole run, and a
    run resumed at (epoch, step) sees exactly the micro-batches the interrupted run had left.
    Pass it as a DataLoader's ``batch_sampler``.

    Args:
        plan: the run's GlobalBatchPlan for this rank.
        start_epoch, start_step: the first global step to yield (0, 0 for a fresh run);
            ``start_step == plan.steps_per_epoch`` means the start of the next epoch.
        epochs: total epochs of the run; iteration stops after epoch ``epochs - 1``.
    """

    def __init__(self, plan: GlobalBatchPlan, start_epoch: int, start_step: int,
                 epochs: int) -> None:
        if epochs < 0:
            raise ConfigError(f"epochs must be at least 0, got {epochs}")
        if not 0 <= start_step <= plan.steps_per_epoch:
            raise ValueError(f"start step {start_step} is outside [0, {plan.steps_per_epoch}]")
        if start_step == plan.steps_per_epoch:  # a checkpoint taken at the end of an epoch
            start_epoch, start_step = start_epoch + 1, 0
        if start_epoch < 0:
            raise ValueError(f"start epoch must be at least 0, got {start_epoch}")
        self.plan = plan
        self.epochs = epochs
        self.start_epoch = start_epoch
        self.start_step = start_step

    def steps(self) -> Iterator[tuple[int, int]]:
        """The (epoch, step) pairs this object covers, in order."""
        for epoch in range(self.start_epoch, self.epochs):
            first = self.start_step if epoch == self.start_epoch else 0
            for step in range(first, self.plan.steps_per_epoch):
                yield epoch, step

    def num_steps(self) -> int:
        """Global steps left from (start_epoch, start_step) to the end of training."""
        epochs_left = max(0, self.epochs - self.start_epoch)
        if epochs_left == 0:
            return 0
        return epochs_left * self.plan.steps_per_epoch - self.start_step

    def __len__(self) -> int:
        return self.num_steps() * self.plan.accumulation_steps

    def __iter__(self) -> Iterator[list[Key]]:
        for epoch, step in self.steps():
            for micro in self.plan.rank_micro_batches(epoch, step):
                yield [(int(index), epoch) for index in micro]


def eval_shard(num_examples: int, world_size: int, rank: int) -> range:
    """Rank ``rank``'s contiguous share of an evaluation set.

    Shards are disjoint and cover ``range(num_examples)`` exactly once (no padding, unlike
    torch's DistributedSampler), so summed counts equal the data set size; the first
    ``num_examples % world_size`` ranks get one example more.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside [0, {world_size})")
    base, extra = divmod(num_examples, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


def eval_batches(shard: range, batch_size: int) -> list[list[Key]]:
    """Keys (index, 0) of an evaluation shard cut into batches of at most ``batch_size``."""
    if batch_size < 1:
        raise ConfigError(f"eval batch size must be at least 1, got {batch_size}")
    return [[(index, 0) for index in shard[start:start + batch_size]]
            for start in range(0, len(shard), batch_size)]
