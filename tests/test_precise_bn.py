"""eval.bn_recompute (bigbatch.precise_bn): BatchNorm statistics recomputed before evaluation as
the exact average over N training micro-batches, the same bits on 1 and 2 processes, training
untouched, final.pt carrying what was evaluated, bad N refused in one line."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest
import torch
from launch import finish_ranks, start_ranks
from scripts.precise_bn_ranks import COUNT, MICRO, dataset, recomputed, tiny_model
from torch import nn

from bigbatch import checkpoint
from bigbatch.commands import main
from bigbatch.config import EvalConfig, RunConfig, resolve_config
from bigbatch.data.sampler import GlobalBatchPlan
from bigbatch.distributed import DistContext
from bigbatch.errors import ConfigError
from bigbatch.geometry import BatchGeometry
from bigbatch.inference import eval_config, evaluate_weights
from bigbatch.precise_bn import statistics_epoch
from bigbatch.train import train

CPU = DistContext(rank=0, world_size=1, local_rank=0, backend=None, device=torch.device("cpu"))
SCRIPT = Path(__file__).parent / "scripts" / "precise_bn_ranks.py"


@contextlib.contextmanager
def one_thread():
    """The thread count of the processes the tests start (OMP_NUM_THREADS=1)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def by_hand(model: nn.Module) -> dict[str, torch.Tensor]:
    """Running statistics as the average of per-micro-batch mean and unbiased variance of each
    BatchNorm's input, taken with hooks in float64 on the micro-batches of the epoch the step
    ends: examples perm[j*b:(j+1)*b] of that epoch's order, j < COUNT."""
    epoch = 1  # STEP = 3 at 2 steps per epoch ends epoch 1
    order = GlobalBatchPlan(BatchGeometry(4 * MICRO, MICRO, 1, 64), 0, 0).epoch_permutation(epoch)
    sums: dict[str, list[torch.Tensor]] = {}

    def record(name):
        def hook(_, inputs):
            x = inputs[0].double()
            dims = [d for d in range(x.dim()) if d != 1]
            mean, var = x.mean(dims), x.var(dims, unbiased=True)
            previous = sums.get(name, [torch.zeros_like(mean), torch.zeros_like(var)])
            sums[name] = [previous[0] + mean, previous[1] + var]
        return hook

    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.register_forward_pre_hook(record(name))
    images = dataset()
    model.train()
    with torch.no_grad():
        for j in range(COUNT):
            keys = [(int(i), epoch) for i in order[j * MICRO:(j + 1) * MICRO]]
            model(images.__getitems__(keys).images)
    expected = {}
    for name, (mean_sum, var_sum) in sums.items():
        expected[f"{name}.running_mean"] = mean_sum / COUNT
        expected[f"{name}.running_var"] = var_sum / COUNT
    return expected


def test_statistics_are_the_average_of_the_micro_batch_statistics():
    assert [statistics_epoch(step, 2) for step in (0, 1, 2, 3, 4)] == [0, 0, 0, 1, 1]
    model = tiny_model(dropout=0.0)
    weights = {k: v.clone() for k, v in model.state_dict().items() if "running" not in k}
    model.eval()
    statistics = recomputed(CPU, model)
    assert not model.training  # the mode is put back
    assert all(m.momentum == 0.1 for m in model.modules() if hasattr(m, "momentum"))
    for key, value in model.state_dict().items():
        if "running" not in key:  # weights and num_batches_tracked untouched
            assert torch.equal(value, weights[key]), key
    expected = by_hand(tiny_model(dropout=0.0))
    assert statistics.keys() == expected.keys() and len(expected) == 6
    for key, value in expected.items():
        torch.testing.assert_close(statistics[key].double(), value, rtol=1e-6, atol=1e-6)
        assert not torch.allclose(value, torch.zeros_like(value) + (1 if "var" in key else 0))


@pytest.mark.slow
def test_two_processes_give_the_bits_of_one(tmp_path):
    out = tmp_path / "statistics.pt"
    ranks = start_ranks([[sys.executable, str(SCRIPT), str(out)]] * 2)
    with one_thread():
        expected = recomputed(CPU)
    for code, _, stderr in finish_ranks(ranks, timeout=120):
        assert code == 0, stderr[-3000:]
    two = torch.load(out, weights_only=True)
    assert two.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(two[key], value), key


def tiny_run(out: Path, *sets: str):
    """2 epochs of 2 steps of 2 micro-batches of 16 synthetic 8x8 images; evaluated after each
    epoch, so training continues after an evaluation with recomputed statistics."""
    return resolve_config(overrides=[
        "data.name=synthetic", "data.synthetic_examples=64", "data.synthetic_classes=10",
        "data.image_size=8", "model.name=small_resnet", "model.options.width=4",
        "global_batch=32", "micro_batch=16", "epochs=2", "optim.lr=0.5", "threads=1",
        "schedule.warmup_epochs=0.5", "channels_last=false", "precision=fp32",
        "log.progress_every_steps=0", f"out={out}", *sets])


def last_checkpoint(run: Path) -> Path:
    return sorted((run / "checkpoints").glob("checkpoint-step*.pt"))[-1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, dict, dict]:
    """(folder, summary without eval.bn_recompute, summary with eval.bn_recompute=3)."""
    folder = tmp_path_factory.mktemp("precise_bn")
    plain = train(tiny_run(folder / "plain"), CPU)
    return folder, plain, train(tiny_run(folder / "precise", "eval.bn_recompute=3"), CPU)


def test_training_is_untouched_and_final_weights_carry_the_recomputed_statistics(runs):
    tmp_path, plain, precise = runs
    states = [checkpoint.load(last_checkpoint(tmp_path / name))["model"]
              for name in ("plain", "precise")]
    for key, value in states[0].items():  # weights and running statistics: the same bits
        assert torch.equal(value, states[1][key]), key
    finals = [torch.load(tmp_path / name / "final.pt", weights_only=True)["model"]
              for name in ("plain", "precise")]
    recomputed_keys = [key for key in finals[0] if "running" in key]
    assert recomputed_keys and all(not torch.equal(finals[0][k], finals[1][k])
                                   for k in recomputed_keys)
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0]
               if k not in recomputed_keys)
    # as trained: what the run without the option measured
    assert (precise["trained_top1"], precise["trained_loss"]) == (plain["top1"], plain["val_loss"])
    assert precise["bn_recompute"] == 3
    # `bigbatch eval` on the last checkpoint recomputes what final.pt carries, and measures it
    again = evaluate_weights(str(last_checkpoint(tmp_path / "precise")),
                             overrides=["eval.bn_recompute=3"])
    assert (again["top1"], again["loss"]) == (precise["top1"], precise["val_loss"])
    assert evaluate_weights(str(tmp_path / "precise" / "final.pt"))["loss"] == precise["val_loss"]


@pytest.mark.parametrize("sets, message", [
    (["eval.bn_recompute=-1"], "'eval.bn_recompute' must be zero or positive, got -1"),
    (["eval.bn_recompute=2.5"], "'eval.bn_recompute' must be an integer, got 2.5"),
    (["eval.bn_recompute=4", "sync_bn=true"], "cannot be combined with sync_bn=true"),
])
def test_bad_values_are_refused(sets, message):
    with pytest.raises(ConfigError, match=message):
        resolve_config(overrides=sets)


@pytest.mark.parametrize("value, message", [
    ("5", "eval.bn_recompute=5 needs 5 x micro-batch 16 = 80 training examples, the training "
          "set has 64; lower eval.bn_recompute"),
    ("-1", "'eval.bn_recompute' must be zero or positive, got -1"),
    ("many", "'eval.bn_recompute' must be an integer, got 'many'"),
])
def test_bad_counts_are_one_line_and_exit_2_from_the_command_line(runs, capsys, value, message):
    weights = str(runs[0] / "precise" / "final.pt")
    assert main(["eval", "--weights", weights, "--set", f"eval.bn_recompute={value}"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"bigbatch: error: {message}"]


def test_eval_takes_only_eval_keys_and_the_val_subset():
    raw = RunConfig(eval=EvalConfig(bn_recompute=7)).to_dict()
    assert eval_config(raw, []).eval.bn_recompute == 0  # the file's statistics, unless asked
    assert eval_config(raw, ["eval.bn_recompute=9"]).eval.bn_recompute == 9
    assert eval_config(raw, ["data.val_subset=null"]).data.val_subset is None
    assert eval_config(raw, [" data.val_subset = 5"]).data.val_subset == 5
    only = "bigbatch eval --set takes eval.* keys and data.val_subset only"
    for assignment in ("seed=1", "data.val_subset_x=1", "data.train_subset=8"):
        with pytest.raises(ConfigError, match=only):
            eval_config(raw, [assignment])
