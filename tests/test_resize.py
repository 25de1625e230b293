"""Progressive resizing: the training image size as a function of the global step."""

from __future__ import annotations

import json

import pytest
import torch
from launch import final_state, run_bigbatch, summary, train_losses

from bigbatch.config import ResizeConfig, resolve_config
from bigbatch.errors import ConfigError
from bigbatch.train.resize import ProgressiveResize


def sides(initial_scale: float, finetune_fraction: float, steps: int, full: int = 28,
          multiple_of: int = 4) -> list[int]:
    resize = ProgressiveResize(ResizeConfig(initial_scale, finetune_fraction, multiple_of), steps)
    return [resize.side(step, full) for step in range(steps)]


def test_sides_rise_from_the_initial_scale_to_full_size_for_the_last_fraction():
    # 0.58 of 28 is 16.2, rounded down to 16; the ramp ends at step (1 - 0.5) * 12 = 6.
    assert sides(0.58, 0.5, 12) == [16, 16, 20, 20, 24, 24, 28, 28, 28, 28, 28, 28]
    assert sides(0.58, 0.0, 12)[-1] == 24  # no full-size phase: the ramp runs to the end
    assert sides(0.58, 1.0, 12) == [28] * 12  # all of it at full size


def test_sides_are_multiples_never_below_one_multiple_and_never_above_full_size():
    assert set(sides(0.05, 0.5, 10)) <= {4, 8, 12, 16, 20, 24, 28}
    assert sides(0.05, 0.5, 10)[0] == 4
    assert sides(0.9, 0.5, 10, full=30, multiple_of=8) == [24, 24, 24, 24, 24] + [30] * 5


def test_scale_one_leaves_every_step_at_full_size_and_the_images_untouched():
    resize = ProgressiveResize(ResizeConfig(), 100)
    assert not resize.enabled and sides(1.0, 0.5, 20) == [28] * 20
    images = torch.randn(2, 1, 28, 28)
    assert resize(images, 0) is images


def test_resized_batches_keep_the_layout_and_the_mean_and_are_the_same_every_time():
    resize = ProgressiveResize(ResizeConfig(initial_scale=0.5, finetune_fraction=0.5), 10)
    images = torch.rand(4, 3, 28, 28).contiguous(memory_format=torch.channels_last)
    resized = resize(images, 0, torch.channels_last)
    assert resized.shape == (4, 3, 12, 12)  # 14 rounded down to a multiple of 4
    assert resized.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(resized, resize(images, 0, torch.channels_last))
    # antialiased bilinear resizing averages: the mean brightness stays (to rounding)
    assert resized.mean().item() == pytest.approx(images.mean().item(), abs=0.01)
    assert resize(images, 5) is images  # the full-size phase


@pytest.mark.parametrize(("key", "value", "message"), [
    ("resize.initial_scale", "0", "'resize.initial_scale' must be a positive number"),
    ("resize.initial_scale", "1.5", r"'resize.initial_scale' must be in \[0.0, 1.0\]"),
    ("resize.finetune_fraction", "-0.1", r"'resize.finetune_fraction' must be in \[0.0, 1.0\]"),
    ("resize.multiple_of", "0", "'resize.multiple_of' must be a positive number"),
])
def test_out_of_range_settings_are_one_line_errors(key, value, message):
    with pytest.raises(ConfigError, match=message):
        resolve_config(overrides=[f"{key}={value}"])


@pytest.mark.slow
def test_a_run_records_the_size_of_every_step_and_trains_at_full_size_at_the_end(tmp_path):
    out = tmp_path / "run"
    result = run_bigbatch(
        ["train", "--dataset", "synthetic", "--set", "data.synthetic_examples=256",
         "--set", "data.synthetic_classes=10", "--set", "data.image_size=32",
         "--batch-size", "64", "--micro-batch", "32", "--epochs", "2", "--lr", "1",
         "--model", "small_resnet", "--set", "model.options.width=4",
         "--set", "resize.initial_scale=0.5", "--set", "resize.finetune_fraction=0.25",
         "--out", str(out)])
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "train"]
    # 8 steps, the ramp over the first 6 (scales 0.5, 0.58, 0.67, 0.75, 0.83, 0.92 of 32 pixels,
    # rounded down to multiples of 4), then full size for the last 2
    assert [r["image_size"] for r in steps] == [16, 16, 20, 24, 24, 28, 32, 32]
    assert "step 3: training images 20 pixels high" in result.stderr
    assert [r for r in records if r["kind"] == "eval"][-1]["examples"] > 0


# Synthetic 32x32 images, 8 steps of 64 in micro-batches of 16, sums in fixed point: the sides
# go 16, 16, 20, 24, 24, 28 over the first 6 steps, then 32.
EXACT_RESIZED = ["--dataset", "synthetic", "--set", "data.synthetic_examples=256",
                 "--set", "data.synthetic_classes=10", "--set", "data.image_size=32",
                 "--batch-size", "64", "--micro-batch", "16", "--epochs", "2", "--lr", "5",
                 "--model", "small_resnet", "--set", "model.options.width=4",
                 "--set", "channels_last=true", "--set", "eval_every=10",
                 "--set", "exact_reduction=true", "--set", "resize.initial_scale=0.5",
                 "--set", "resize.finetune_fraction=0.25"]


@pytest.mark.slow
def test_resized_steps_give_the_same_bits_on_two_processes_killed_and_resumed_on_one(tmp_path):
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    run_bigbatch(["train", *EXACT_RESIZED, "--out", str(reference)], agent=False)
    common = ["train", *EXACT_RESIZED, "--out", str(resumed), "--checkpoint-every", "1"]
    crashed = run_bigbatch(common, nproc=2, env={"BIGBATCH_FAULT": "crash:step=3:rank=1"},
                           check=False, agent=False)
    assert crashed.returncode != 0
    result = run_bigbatch([*common, "--resume", "auto"], agent=False)
    assert "at global step 3" in result.stderr  # steps 1-3 ran on two processes, at 16 and 20
    assert summary(resumed)["world_size"] == 1
    ours, theirs = final_state(resumed), final_state(reference)
    assert [name for name in ours if not torch.equal(ours[name], theirs[name])] == []
    assert train_losses(resumed) == train_losses(reference)
