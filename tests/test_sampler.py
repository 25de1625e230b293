"""World-size-invariant batching: the same micro-batches for any number of processes W."""

from __future__ import annotations

import numpy as np
import pytest

from bigbatch.data.sampler import GlobalBatchPlan, TrainBatches, eval_batches, eval_shard
from bigbatch.data.seeding import example_generator, example_uniforms, mix64, mix64_array
from bigbatch.errors import ConfigError
from bigbatch.geometry import BatchGeometry

N, B, MICRO = 1000, 64, 8  # 15 steps per epoch, 40 tail examples, 8 micro-batches per step


def batch_plan(num_examples: int, global_batch: int, micro_batch: int, world_size: int = 1,
               rank: int = 0, seed: int = 0) -> GlobalBatchPlan:
    geometry = BatchGeometry(global_batch, micro_batch, world_size, num_examples)
    return GlobalBatchPlan(geometry, rank, seed)


def micro_batches_by_index(world_size: int, epoch: int, step: int) -> dict[int, list[int]]:
    """Micro-batch number j -> its indices, gathered from every rank of a W-process run."""
    found: dict[int, list[int]] = {}
    for rank in range(world_size):
        plan = batch_plan(N, B, MICRO, world_size=world_size, rank=rank, seed=7)
        for a, micro in enumerate(plan.rank_micro_batches(epoch, step)):
            j = a * world_size + rank
            assert j not in found
            found[j] = micro.tolist()
    return found


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_micro_batches_do_not_depend_on_world_size(world_size: int) -> None:
    plan = batch_plan(N, B, MICRO, world_size=world_size, seed=7)
    assert plan.accumulation_steps == B // (MICRO * world_size)
    for epoch, step in [(0, 0), (0, 14), (3, 6)]:
        reference = micro_batches_by_index(1, epoch, step)
        found = micro_batches_by_index(world_size, epoch, step)
        assert found == reference
        union = np.concatenate([found[j] for j in sorted(found)])
        np.testing.assert_array_equal(union, plan.step_indices(epoch, step))


def test_rank_streams_interleave_to_the_single_process_stream() -> None:
    single = list(TrainBatches(batch_plan(N, B, MICRO, seed=3), 0, 0, epochs=2))
    world = 4
    streams = [list(TrainBatches(batch_plan(N, B, MICRO, world, rank, seed=3), 0, 0, epochs=2))
               for rank in range(world)]
    accumulation = B // (MICRO * world)
    rebuilt = []
    for step in range(len(single) // (B // MICRO)):
        for a in range(accumulation):
            for rank in range(world):
                rebuilt.append(streams[rank][step * accumulation + a])
    assert rebuilt == single


def test_each_example_at_most_once_per_epoch_and_tail_dropped() -> None:
    plan = batch_plan(N, B, MICRO, seed=1)
    assert plan.steps_per_epoch == 15 and plan.geometry.tail == 40
    for epoch in range(3):
        used = np.concatenate([plan.step_indices(epoch, s) for s in range(plan.steps_per_epoch)])
        assert len(used) == N - 40
        assert len(np.unique(used)) == len(used)
        assert used.min() >= 0 and used.max() < N
        np.testing.assert_array_equal(np.sort(plan.epoch_permutation(epoch)), np.arange(N))
    # The dropped tail is a different set each epoch.
    tails = [set(plan.epoch_permutation(e)[-40:].tolist()) for e in range(2)]
    assert tails[0] != tails[1]


def test_order_depends_on_seed_and_epoch_only() -> None:
    plan = batch_plan(N, B, MICRO, seed=5)
    again = batch_plan(N, B, MICRO, world_size=2, rank=1, seed=5)
    other_seed = batch_plan(N, B, MICRO, seed=6)
    np.testing.assert_array_equal(plan.epoch_permutation(2), again.epoch_permutation(2))
    assert not np.array_equal(plan.epoch_permutation(0), plan.epoch_permutation(1))
    assert not np.array_equal(plan.epoch_permutation(0), other_seed.epoch_permutation(0))
    # Cache does not leak between epochs: asking again for epoch 0 gives epoch 0's order.
    first = plan.epoch_permutation(0).copy()
    plan.epoch_permutation(1)
    np.testing.assert_array_equal(plan.epoch_permutation(0), first)


def test_permutation_is_roughly_uniform() -> None:
    size, epochs = 8, 4000
    plan = batch_plan(size, 8, 8, seed=0)
    first = np.array([plan.epoch_permutation(e)[0] for e in range(epochs)])
    counts = np.bincount(first, minlength=size)
    # Each of 8 examples comes first 500 times on average (std about 21); 5 std of slack.
    assert np.all(np.abs(counts - epochs / size) < 110), counts


def test_resume_yields_exactly_the_suffix() -> None:
    plan = batch_plan(N, B, MICRO, world_size=2, rank=1, seed=9)
    full = list(TrainBatches(plan, 0, 0, epochs=3))
    per_step = plan.accumulation_steps
    assert len(full) == len(TrainBatches(plan, 0, 0, epochs=3)) == 3 * 15 * per_step
    for epoch, step in [(0, 0), (0, 7), (1, 0), (2, 14)]:
        resumed = TrainBatches(plan, epoch, step, epochs=3)
        suffix = full[(epoch * plan.steps_per_epoch + step) * per_step:]
        assert list(resumed) == suffix
        assert len(resumed) == len(suffix)
    # A checkpoint written after an epoch's last step resumes at the next epoch.
    end_of_epoch = TrainBatches(plan, 0, 15, epochs=3)
    assert list(end_of_epoch) == full[15 * per_step:]
    assert len(TrainBatches(plan, 3, 0, epochs=3)) == 0


def test_train_batches_keys_carry_epoch_and_micro_batch_size() -> None:
    plan = batch_plan(N, B, MICRO, seed=0)
    batches = list(TrainBatches(plan, 1, 0, epochs=2))
    assert all(len(keys) == MICRO for keys in batches)
    assert {epoch for keys in batches for _, epoch in keys} == {1}
    assert [index for index, _ in batches[0]] == plan.micro_batch_indices(1, 0, 0).tolist()


def test_plan_validation_messages() -> None:
    with pytest.raises(ConfigError, match=r"^global batch 1000 is not a multiple of micro-batch "
                       r"64 x 3 processes = 192; choose a global batch that is a multiple of 192 "
                       r"or a smaller --micro-batch$"):
        batch_plan(6000, 1000, 64, world_size=3)
    with pytest.raises(ConfigError, match=r"^global batch 8192 is larger than the data set "
                       r"\(6000 examples\); lower --batch-size or use more data$"):
        batch_plan(6000, 8192, 64)
    with pytest.raises(ConfigError, match="rank 2 is outside"):
        batch_plan(6000, 64, 8, world_size=2, rank=2)
    with pytest.raises(ConfigError, match="micro batch must be at least 1"):
        batch_plan(6000, 64, 0)
    plan = batch_plan(100, 10, 5)
    with pytest.raises(ValueError, match="step 10 is outside"):
        plan.step_indices(0, 10)
    with pytest.raises(ValueError, match="start step 11"):
        TrainBatches(plan, 0, 11, epochs=1)


@pytest.mark.parametrize("size,world_size", [(10, 3), (7, 4), (3, 4), (1000, 7), (0, 2)])
def test_eval_shards_cover_exactly_once(size: int, world_size: int) -> None:
    shards = [eval_shard(size, world_size, rank) for rank in range(world_size)]
    covered = [i for shard in shards for i in shard]
    assert covered == list(range(size))
    lengths = [len(shard) for shard in shards]
    assert max(lengths) - min(lengths) <= 1


def test_eval_batches_cut_a_shard() -> None:
    batches = eval_batches(eval_shard(10, 3, 0), batch_size=3)
    assert batches == [[(0, 0), (1, 0), (2, 0)], [(3, 0)]]


def test_mix64_is_a_deterministic_64_bit_hash() -> None:
    assert mix64(1, 2, 3) == mix64(1, 2, 3)
    values = {mix64(1, 2, i) for i in range(1000)}
    assert len(values) == 1000 and all(0 <= v < 2**64 for v in values)
    assert mix64(1, 2) != mix64(2, 1) != mix64(1, 2, 0)
    assert mix64(-1) == mix64(2**64 - 1)
    assert mix64_array((1, 2), np.array([3, 4])).tolist() == [mix64(1, 2, 3), mix64(1, 2, 4)]


def test_example_uniforms_depend_only_on_their_coordinates() -> None:
    indices = np.array([5, 0, 123456789, 5])
    u = example_uniforms(11, 3, indices, 4)
    assert u.shape == (4, 4) and u.dtype == np.float64
    for n, index in enumerate(indices):
        expected = [(mix64(11, 3, int(index), j) >> 11) * 2.0**-53 for j in range(4)]
        assert u[n].tolist() == expected
    np.testing.assert_array_equal(u[0], u[3])
    np.testing.assert_array_equal(example_uniforms(11, 3, indices[2:3], 4)[0], u[2])
    assert not np.array_equal(example_uniforms(11, 4, indices, 4), u)
    assert not np.array_equal(example_uniforms(12, 3, indices, 4), u)
    many = example_uniforms(0, 0, np.arange(20000), 2)
    assert many.min() >= 0.0 and many.max() < 1.0
    assert abs(many.mean() - 0.5) < 0.01 and abs(many.var() - 1 / 12) < 0.002
    assert abs(np.corrcoef(many[:, 0], many[:, 1])[0, 1]) < 0.03


def test_example_generator_is_seeded_by_coordinates() -> None:
    import torch

    first = torch.rand(3, generator=example_generator(1, 2, 3))
    assert torch.equal(first, torch.rand(3, generator=example_generator(1, 2, 3)))
    assert not torch.equal(first, torch.rand(3, generator=example_generator(1, 3, 3)))
    assert example_generator(1, 2, 3).initial_seed() == mix64(1, 2, 3)
