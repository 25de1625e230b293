"""exact_reduction: sums in fixed point, so every layout of a global batch gives the same bits."""

from __future__ import annotations

import json

import pytest
import torch
from launch import final_state, run_bigbatch, summary, train_losses
from torch import nn

from bigbatch.distributed import DistContext
from bigbatch.geometry import BatchGeometry
from bigbatch.train.fixed_point import (
    GRADIENT_BITS,
    ExactReduction,
    GradientOverflow,
    dequantize,
    quantize,
)

CPU = DistContext(rank=0, world_size=1, local_rank=0, backend=None, device=torch.device("cpu"))

# The default recipe's model and settings (channels_last, fp32, LARS at its LR 20) on a slice of
# Fashion-MNIST: 1024-example steps of four 256-example micro-batches, 6 steps, evaluated on
# 1000 test images.
EXACT = ["--train-subset", "2048", "--val-subset", "1000", "--batch-size", "1024",
         "--micro-batch", "256", "--epochs", "3", "--lr", "20", "--warmup-epochs", "1",
         "--model", "small_resnet",
         "--set", "model.options.width=8", "--set", "channels_last=true",
         "--set", "precision=fp32", "--set", "eval_every=10", "--set", "exact_reduction=true"]


def test_quantize_is_exact_for_multiples_of_the_quantum_and_rounds_the_rest():
    values = torch.tensor([0.0, 1.0, -3.5, 2.0**-48, 5 * 2.0**-48], dtype=torch.float32)
    assert torch.equal(dequantize(quantize(values, GRADIENT_BITS), GRADIENT_BITS, torch.float32),
                       values)
    below_and_above_half = torch.tensor([0.4 * 2.0**-48, 0.6 * 2.0**-48])
    assert quantize(below_and_above_half, GRADIENT_BITS).tolist() == [0, 1]


def test_integer_sums_do_not_depend_on_grouping_where_float_sums_do():
    generator = torch.Generator().manual_seed(0)
    parts = [torch.randn(10000, generator=generator) * 10.0**k for k in range(-3, 4)]
    in_order = parts[0] + parts[1] + parts[2] + parts[3] + parts[4] + parts[5] + parts[6]
    grouped = (parts[6] + parts[0]) + (parts[5] + parts[1]) + ((parts[4] + parts[2]) + parts[3])
    assert not torch.equal(in_order, grouped)  # what the default mode lives with
    q = [quantize(p, GRADIENT_BITS) for p in parts]
    assert torch.equal(q[0] + q[1] + q[2] + q[3] + q[4] + q[5] + q[6],
                       (q[6] + q[0]) + (q[5] + q[1]) + ((q[4] + q[2]) + q[3]))


def one_process_step(model: nn.Module, micro_grads: list[dict[str, torch.Tensor]],
                     geometry: BatchGeometry) -> ExactReduction:
    """Feed ``micro_grads`` (one {name: gradient} per micro-batch) through ExactReduction."""
    reduction = ExactReduction(model, geometry, CPU)
    reduction.begin_step()
    for index, grads in enumerate(micro_grads):
        for name, param in model.named_parameters():
            param.grad = grads[name].clone()
        reduction.after_backward(last=index == len(micro_grads) - 1, synced_by_hook=False)
    return reduction


def test_one_process_step_gives_the_exact_sum_of_the_micro_batch_gradients():
    model = nn.Linear(3, 2)
    geometry = BatchGeometry(8, 2, 1, 8)  # four micro-batches
    generator = torch.Generator().manual_seed(1)
    micro = [{n: torch.randn(p.shape, generator=generator) for n, p in model.named_parameters()}
             for _ in range(4)]
    one_process_step(model, micro, geometry)
    for name, param in model.named_parameters():
        total = sum(quantize(grads[name], GRADIENT_BITS) for grads in micro)
        assert torch.equal(param.grad, dequantize(total, GRADIENT_BITS, torch.float32))


def test_a_gradient_beyond_the_fixed_point_range_stops_the_run_naming_the_tensor():
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2))
    geometry = BatchGeometry(8, 2, 1, 8)
    micro = [{n: torch.zeros(p.shape) for n, p in model.named_parameters()} for _ in range(4)]
    micro[2]["1.weight"][0, 1] = 2.0**14  # above 2^14 / 4 micro-batches
    reduction = one_process_step(model, micro, geometry)
    losses = [torch.tensor(1.0)] * 4
    with pytest.raises(GradientOverflow, match=r"gradient of 1\.weight exceeds the fixed-point"):
        reduction.reduce(losses, 8, stop=False, clock_vote=False)


def test_nan_in_a_gradient_or_the_loss_is_a_non_finite_step_not_an_overflow():
    model = nn.Linear(3, 2)
    geometry = BatchGeometry(8, 2, 1, 8)
    micro = [{n: torch.zeros(p.shape) for n, p in model.named_parameters()} for _ in range(4)]
    micro[1]["bias"][0] = float("nan")
    votes = one_process_step(model, micro, geometry).reduce(
        [torch.tensor(1.0)] * 4, 8, stop=False, clock_vote=False)
    assert votes.nonfinite and votes.mean_loss == pytest.approx(0.5)
    clean = [{n: torch.zeros(p.shape) for n, p in model.named_parameters()} for _ in range(4)]
    votes = one_process_step(model, clean, geometry).reduce(
        [torch.tensor(1.0), torch.tensor(float("inf"))] * 2, 8, stop=True, clock_vote=False)
    assert votes.nonfinite and votes.stop_votes == 1.0


def assert_same_run(run, reference):
    ours, theirs = final_state(run), final_state(reference)
    assert ours.keys() == theirs.keys()
    different = [name for name in ours if not torch.equal(ours[name], theirs[name])]
    assert different == []  # weights and BatchNorm statistics, bit for bit
    assert train_losses(run) == train_losses(reference)  # every step's logged loss


@pytest.fixture(scope="module")
def exact_run(tmp_path_factory):
    """``exact_run(n)``: the EXACT run's folder on ``n`` processes, trained once for the module
    (the 2-process run is both a layout compared and the uninterrupted reference of a resume)."""
    runs = {}

    def run(nproc: int):
        if nproc not in runs:
            runs[nproc] = tmp_path_factory.mktemp(f"exact{nproc}") / "run"
            run_bigbatch(["train", *EXACT, "--out", str(runs[nproc])], nproc=nproc, timeout=600,
                         agent=False)
        return runs[nproc]

    return run


@pytest.mark.slow
@pytest.mark.fashion_mnist
def test_one_two_and_four_processes_give_the_same_bits_at_the_recipes_lr(exact_run):
    runs = {nproc: exact_run(nproc) for nproc in (1, 2, 4)}
    for nproc, run in runs.items():
        assert summary(run)["accumulation_steps"] == 4 // nproc
    assert len(train_losses(runs[1])) == 6
    assert_same_run(runs[2], runs[1])
    assert_same_run(runs[4], runs[1])


@pytest.mark.slow
@pytest.mark.fashion_mnist
def test_a_run_killed_on_two_processes_and_resumed_on_one_gives_the_same_bits(exact_run,
                                                                             tmp_path):
    reference = exact_run(2)
    resumed = tmp_path / "resumed"
    common = ["train", *EXACT, "--out", str(resumed), "--checkpoint-every", "1"]
    crashed = run_bigbatch(common, nproc=2, env={"BIGBATCH_FAULT": "crash:step=3:rank=1"},
                           check=False, timeout=600)
    assert crashed.returncode != 0
    result = run_bigbatch([*common, "--resume", "auto"], nproc=1, timeout=600)
    assert "resumed from" in result.stderr and "at global step 3" in result.stderr
    assert summary(resumed)["world_size"] == 1
    assert_same_run(resumed, reference)
    steps = [json.loads(line)["step"] for line in (resumed / "metrics.jsonl").read_text().split(
        "\n") if line and json.loads(line)["kind"] == "train"]
    assert steps == [1, 2, 3, 4, 5, 6]


# bf16 autocast (emulated on a CPU without native bf16, so kept tiny): the gradients leave
# autocast in fp32 and are summed in fixed point like any others.
BF16 = ["--dataset", "synthetic", "--set", "data.synthetic_examples=192",
        "--set", "data.synthetic_classes=10", "--set", "data.image_size=28",
        "--batch-size", "64", "--micro-batch", "16", "--epochs", "1", "--lr", "20",
        "--warmup-epochs", "0", "--model", "small_resnet", "--set", "model.options.width=8",
        "--set", "channels_last=true", "--set", "precision=bf16", "--set", "eval_every=10",
        "--set", "exact_reduction=true"]


@pytest.mark.slow
def test_bf16_autocast_runs_give_the_same_bits_on_one_and_two_processes(tmp_path):
    runs = {nproc: tmp_path / f"bf16-{nproc}" for nproc in (1, 2)}
    for nproc, out in runs.items():
        run_bigbatch(["train", *BF16, "--out", str(out)], nproc=nproc, timeout=600, agent=False)
    assert summary(runs[1])["steps"] == 3 and summary(runs[2])["world_size"] == 2
    assert_same_run(runs[2], runs[1])
