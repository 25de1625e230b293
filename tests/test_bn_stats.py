"""Running statistics advance once per global step, the same for any accumulation split."""

import torch
from torch import nn

from bigbatch.train.bn_stats import PerStepRunningStats


def run_step(model, micro_batches):
    stats = PerStepRunningStats(model, len(micro_batches))
    stats.begin_step()
    for x in micro_batches:
        model(x)
        stats.after_micro_batch()
    stats.end_step()
    return stats


def test_update_is_the_mean_of_micro_batch_updates():
    torch.manual_seed(0)
    data = torch.randn(8, 3, 5, 5) * 3 + 1
    model = nn.BatchNorm2d(3, momentum=0.1)
    run_step(model, list(data.chunk(4)))
    expected_mean = 0.9 * torch.zeros(3) + 0.1 * torch.stack(
        [c.mean(dim=(0, 2, 3)) for c in data.chunk(4)]
    ).mean(0)
    torch.testing.assert_close(model.running_mean, expected_mean)
    assert model.num_batches_tracked.item() == 1


def test_ranks_averaged_equal_one_process():
    """4 micro-batches on one process == average of two 'ranks' with 2 micro-batches each."""
    torch.manual_seed(1)
    steps = [torch.randn(8, 3, 4, 4) * 2 + 0.5 for _ in range(3)]
    single = nn.BatchNorm2d(3)
    rank_models = [nn.BatchNorm2d(3), nn.BatchNorm2d(3)]
    for data in steps:
        chunks = list(data.chunk(4))
        run_step(single, chunks)
        # micro-batch j goes to rank j % 2 (accumulation-major dealing)
        run_step(rank_models[0], chunks[0::2])
        run_step(rank_models[1], chunks[1::2])
    averaged = (rank_models[0].running_var + rank_models[1].running_var) / 2
    torch.testing.assert_close(averaged, single.running_var, rtol=1e-6, atol=1e-7)


def test_rollback_restores_the_step_start():
    model = nn.BatchNorm1d(2)
    stats = PerStepRunningStats(model, 1)
    stats.begin_step()
    model(torch.randn(6, 2) + 5)
    assert model.running_mean.abs().sum() > 0
    stats.rollback()
    assert torch.equal(model.running_mean, torch.zeros(2))
    assert model.num_batches_tracked.item() == 0
