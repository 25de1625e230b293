"""LR schedules as pure functions of the step, and the batch-size LR scaling rules."""

from __future__ import annotations

import math

import pytest

from bigbatch.optim import LRSchedule, scale_lr


def test_warmup_is_linear_from_start_lr_to_base_lr():
    s = LRSchedule(base_lr=3.2, total_steps=100, warmup_steps=10, warmup_start_lr=0.2)
    assert s.lr(0) == 0.2
    assert s.lr(5) == pytest.approx(0.2 + 3.0 * 0.5)
    assert s.lr(9) == pytest.approx(0.2 + 3.0 * 0.9)
    assert s.lr(10) == pytest.approx(3.2)


def test_poly_decay_by_hand():
    s = LRSchedule(base_lr=2.0, total_steps=110, warmup_steps=10, end_lr=0.0, power=2.0)
    assert s.lr(10) == pytest.approx(2.0)
    assert s.lr(60) == pytest.approx(2.0 * 0.5**2)  # t/T = 50/100
    assert s.lr(35) == pytest.approx(2.0 * 0.75**2)
    assert s.lr(110) == 0.0
    assert s.lr(500) == 0.0


def test_poly_with_end_lr_and_power():
    s = LRSchedule(base_lr=1.0, total_steps=10, end_lr=0.1, power=1.0)
    assert s.lr(5) == pytest.approx(0.1 + 0.9 * 0.5)
    assert s.lr(10) == pytest.approx(0.1)
    assert s.lr(20) == pytest.approx(0.1)


def test_cosine_values():
    s = LRSchedule(base_lr=1.0, total_steps=104, warmup_steps=4, kind="cosine", end_lr=0.2)
    assert s.lr(4) == pytest.approx(1.0)
    assert s.lr(54) == pytest.approx(0.6)  # halfway: cos = 0
    assert s.lr(29) == pytest.approx(0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi / 4)))
    assert s.lr(104) == pytest.approx(0.2)


def test_step_decay_counts_milestones_at_or_before_the_step():
    s = LRSchedule(base_lr=1.0, total_steps=100, kind="step", milestones=(30, 60), gamma=0.1)
    assert [s.lr(k) for k in (0, 29, 30, 59)] == pytest.approx([1.0, 1.0, 0.1, 0.1])
    assert s.lr(60) == pytest.approx(0.01)
    assert s.lr(99) == pytest.approx(0.01)


def test_step_decay_accepts_a_list_and_warmup_comes_first():
    s = LRSchedule(base_lr=1.0, total_steps=100, warmup_steps=10, kind="step",
                   milestones=[50], gamma=0.5)
    assert s.milestones == (50,)
    assert s.lr(5) == pytest.approx(0.5)
    assert s.lr(49) == 1.0 and s.lr(50) == 0.5


def test_constant_after_warmup():
    s = LRSchedule(base_lr=0.7, total_steps=20, warmup_steps=2, kind="constant")
    assert [s.lr(k) for k in (0, 1, 2, 19, 40)] == pytest.approx([0.0, 0.35, 0.7, 0.7, 0.7])


def test_all_warmup_schedule_ends_at_end_lr():
    s = LRSchedule(base_lr=1.0, total_steps=5, warmup_steps=5, end_lr=0.0)
    assert s.lr(4) == pytest.approx(0.8)
    assert s.lr(5) == 0.0


@pytest.mark.parametrize(("rule", "want"), [("linear", 3.2), ("sqrt", 0.1 * math.sqrt(32)),
                                            ("none", 0.1)])
def test_scale_lr_rules(rule, want):
    assert scale_lr(0.1, 8192, 256, rule) == pytest.approx(want)


def test_scale_lr_rejects_bad_input():
    with pytest.raises(ValueError, match="rule 'cubic' is unknown; choose one of: linear, sqrt"):
        scale_lr(0.1, 8192, 256, "cubic")
    with pytest.raises(ValueError, match="reference_batch"):
        scale_lr(0.1, 8192, 0, "linear")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"base_lr": -0.1}, "base_lr must be a finite number >= 0"),
    ({"warmup_steps": 200}, r"warmup_steps \(200\) exceeds total_steps \(100\)"),
    ({"kind": "exp"}, "kind 'exp' is unknown; choose one of: poly, cosine, step, constant"),
    ({"total_steps": 0}, "total_steps must be an integer >= 1"),
    ({"warmup_steps": -1}, "warmup_steps must be an integer >= 0"),
    ({"end_lr": float("nan")}, "end_lr must be a finite number"),
    ({"power": 0.0}, "power must be > 0"),
    ({"gamma": -1.0}, "gamma must be > 0"),
    ({"milestones": (60, 30)}, "milestones must be in increasing order"),
    ({"milestones": (-5,)}, "milestones must be integer steps >= 0"),
])
def test_validation_errors_name_the_field(kwargs, message):
    args = {"base_lr": 1.0, "total_steps": 100, **kwargs}
    with pytest.raises(ValueError, match=message) as info:
        LRSchedule(**args)
    assert "\n" not in str(info.value)


def test_negative_step_is_rejected_and_schedule_is_pure():
    s = LRSchedule(base_lr=1.0, total_steps=10)
    with pytest.raises(ValueError, match="step must be >= 0"):
        s.lr(-1)
    assert [s.lr(3) for _ in range(3)] == [s.lr(3)] * 3
    assert hash(s) == hash(LRSchedule(base_lr=1.0, total_steps=10))
