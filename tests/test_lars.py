"""LARS against a float64 hand computation of Algorithm 1, and the optimizer plumbing around it."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from layouts import (
    LAYOUT_SHAPES,
    assert_column_major_gradients_step_alike,
    kernel_or_eager,
    odd_offset_views,
)
from torch import nn

from bigbatch.optim import LARS, build_optimizer, lars_kernel, parameter_groups

SHAPES = [(6, 4), (3, 2, 3, 3), (5,), (7, 1)]


@pytest.fixture(autouse=True, params=["kernel", "eager"])
def lars_path(request, monkeypatch):
    """Every test runs on the compiled CPU kernel and on the eager fallback."""
    return kernel_or_eager(request.param, lars_kernel, monkeypatch, "_lars_kernel.c")


def make_params(dtype: torch.dtype = torch.float64, seed: int = 0) -> list[nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64).to(dtype))
            for s in SHAPES]


def grads_for(step: int, dtype: torch.dtype = torch.float64) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    return [(torch.randn(s, generator=gen, dtype=torch.float64) * (0.1 + step)).to(dtype)
            for s in SHAPES]


def hand_lars_step(ws, gs, vs, *, lr, momentum, wd, eta, eps=0.0, clip=False, nesterov=False,
                   lars=True):
    """Algorithm 1, one tensor at a time with Python floats for the norms; returns the ratios."""
    ratios = []
    for i, (w, g) in enumerate(zip(ws, gs, strict=True)):
        w_norm, g_norm = math.sqrt(float((w * w).sum())), math.sqrt(float((g * g).sum()))
        ratio = 1.0
        if lars and w_norm > 0 and g_norm > 0:
            ratio = eta * w_norm / (g_norm + wd * w_norm + eps)
        if clip:
            ratio = min(ratio, 1.0)
        step = lr * ratio * (g + wd * w)
        vs[i] = momentum * vs[i] + step
        ws[i] = w - (momentum * vs[i] + step if nesterov else vs[i])
        ratios.append(ratio)
    return ratios


def run_lars(params, steps, lrs, **options):
    opt = LARS(params, lr=lrs[0], **options)
    ratios = []
    for step in range(steps):
        for p, g in zip(params, grads_for(step, params[0].dtype), strict=True):
            p.grad = g
        for group in opt.param_groups:
            group["lr"] = lrs[step]
        opt.step()
        ratios.append(opt.trust_ratios())
    return opt, ratios


def run_hand(steps, lrs, **options):
    ws = [p.detach().clone() for p in make_params()]
    vs = [torch.zeros_like(w) for w in ws]
    ratios = [hand_lars_step(ws, grads_for(step), vs, lr=lrs[step], **options)
              for step in range(steps)]
    return ws, ratios


LRS = [0.5, 1.0, 2.0, 1.5, 0.25]


@pytest.mark.parametrize("variant", [{}, {"nesterov": True}, {"clip": True, "eta": 3.0},
                                     {"eps": 1e-3}])
def test_update_equals_algorithm_1_by_hand_over_several_steps(variant):
    variant = dict(variant)
    eta = variant.pop("eta", 0.02)
    params = make_params()
    start = [p.detach().clone() for p in params]
    _, ratios = run_lars(params, 5, LRS, momentum=0.9, weight_decay=5e-3, trust_coefficient=eta,
                         **variant)
    ws, hand_ratios = run_hand(5, LRS, momentum=0.9, wd=5e-3, eta=eta, **variant)
    for p, w, w0 in zip(params, ws, start, strict=True):
        assert (w - w0).abs().max() > 1e-3  # the comparison is not between two unchanged tensors
        torch.testing.assert_close(p.detach(), w, rtol=1e-12, atol=1e-12)
    for got, want in zip(ratios, hand_ratios, strict=True):
        torch.testing.assert_close(got, torch.tensor(want, dtype=got.dtype))


def test_float32_update_matches_float64_hand_computation():
    params = make_params(torch.float32)
    run_lars(params, 5, LRS, momentum=0.9, weight_decay=5e-4, trust_coefficient=0.02)
    ws, _ = run_hand(5, LRS, momentum=0.9, wd=5e-4, eta=0.02)
    for p, w in zip(params, ws, strict=True):
        torch.testing.assert_close(p.detach().double(), w, rtol=1e-5, atol=1e-6)


def test_weight_decay_changes_the_update_and_the_ratio():
    with_decay, without = make_params(), make_params()
    _, ratios_decay = run_lars(with_decay, 2, LRS, weight_decay=1e-2, trust_coefficient=0.02)
    _, ratios_plain = run_lars(without, 2, LRS, weight_decay=0.0, trust_coefficient=0.02)
    ws, hand = run_hand(2, LRS, momentum=0.9, wd=0.0, eta=0.02)
    for p, q, w in zip(with_decay, without, ws, strict=True):
        assert (p - q).abs().max() > 1e-4
        torch.testing.assert_close(q.detach(), w, rtol=1e-12, atol=1e-12)
    assert torch.all(ratios_decay[-1] < ratios_plain[-1])  # β‖w‖ enlarges the denominator
    torch.testing.assert_close(ratios_plain[-1], torch.tensor(hand[-1], dtype=torch.float64))


def test_zero_initialised_bias_moves_in_an_excluded_group_and_with_ratio_one():
    excluded_bias = nn.Parameter(torch.zeros(4, dtype=torch.float64))
    adapted_bias = nn.Parameter(torch.zeros(4, dtype=torch.float64))
    grad = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    opt = LARS([{"params": [excluded_bias], "lars": False, "weight_decay": 0.0},
                {"params": [adapted_bias], "lars": True}], lr=0.1)
    excluded_bias.grad, adapted_bias.grad = grad.clone(), grad.clone()
    opt.step()
    # v = γ·λ·(g + β·0) with λ = 1: the first step is plain SGD in both groups.
    torch.testing.assert_close(excluded_bias.detach(), -0.1 * grad)
    torch.testing.assert_close(adapted_bias.detach(), -0.1 * grad)
    assert opt.trust_ratios().tolist() == [1.0]  # only the lars=True tensor is reported


def test_zero_grad_and_zero_weight_give_ratio_one_without_nan():
    weight = nn.Parameter(torch.full((3, 3), 2.0, dtype=torch.float64))
    dead = nn.Parameter(torch.zeros(5, dtype=torch.float64))
    opt = LARS([weight, dead], lr=0.5, weight_decay=0.1, eps=0.0)
    weight.grad, dead.grad = torch.zeros_like(weight), torch.zeros_like(dead)
    opt.step()
    assert opt.trust_ratios().tolist() == [1.0, 1.0]
    # With g = 0 and λ = 1 only the decay acts: w − γ·β·w.
    torch.testing.assert_close(weight.detach(), torch.full((3, 3), 2.0 - 0.5 * 0.1 * 2.0,
                                                           dtype=torch.float64))
    assert torch.equal(dead.detach(), torch.zeros(5, dtype=torch.float64))
    assert all(torch.isfinite(opt.state[p]["momentum_buffer"]).all() for p in (weight, dead))


def test_update_is_invariant_to_loss_scale_without_weight_decay():
    # λ·g = η‖w‖·g/‖g‖ when β = 0: scaling the loss (hence g) by any c > 0 changes nothing.
    params, scaled = make_params(), make_params()
    opt = LARS(params, lr=1.0, weight_decay=0.0, trust_coefficient=0.02)
    opt_scaled = LARS(scaled, lr=1.0, weight_decay=0.0, trust_coefficient=0.02)
    start = [p.detach().clone() for p in params]
    for step in range(3):
        for p, q, g in zip(params, scaled, grads_for(step), strict=True):
            p.grad, q.grad = g, g * 1e4
        opt.step()
        opt_scaled.step()
    for p, q, w0 in zip(params, scaled, start, strict=True):
        assert (p - w0).abs().max() > 1e-3
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-12, atol=1e-14)


def test_excluded_group_is_plain_momentum_sgd_with_lr_inside_the_buffer():
    params = make_params()
    opt = LARS([{"params": params, "lars": False, "weight_decay": 1e-2}], lr=LRS[0],
               momentum=0.9, trust_coefficient=0.02)
    ws = [p.detach().clone() for p in params]
    vs = [torch.zeros_like(w) for w in ws]
    for step in range(5):
        for p, g in zip(params, grads_for(step), strict=True):
            p.grad = g
        opt.param_groups[0]["lr"] = LRS[step]
        opt.step()
        hand_lars_step(ws, grads_for(step), vs, lr=LRS[step], momentum=0.9, wd=1e-2, eta=0.02,
                       lars=False)
    for p, w in zip(params, ws, strict=True):
        torch.testing.assert_close(p.detach(), w, rtol=1e-12, atol=1e-12)
    assert opt.trust_ratios() is None


def test_excluded_group_equals_torch_sgd_at_constant_lr():
    # At a constant LR, LR inside or outside the buffer is the same trajectory.
    ours, theirs = make_params(), make_params()
    opt = LARS([{"params": ours, "lars": False}], lr=0.3, weight_decay=1e-3)
    ref = torch.optim.SGD(theirs, lr=0.3, momentum=0.9, weight_decay=1e-3)
    for step in range(4):
        for p, q, g in zip(ours, theirs, grads_for(step), strict=True):
            p.grad, q.grad = g, g.clone()
        opt.step()
        ref.step()
    for p, q in zip(ours, theirs, strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-12, atol=1e-12)


def test_clip_caps_the_local_rate_at_one():
    clipped, free = make_params(), make_params()
    _, ratios_free = run_lars(free, 1, [0.1], trust_coefficient=50.0)
    _, ratios_clipped = run_lars(clipped, 1, [0.1], trust_coefficient=50.0, clip=True)
    assert torch.all(ratios_free[0] > 1.0)  # a huge η makes every λ exceed 1 ...
    assert ratios_clipped[0].tolist() == [1.0] * len(SHAPES)  # ... and clip brings it to 1
    ws, _ = run_hand(1, [0.1], momentum=0.9, wd=5e-4, eta=50.0, lars=False)  # effective LR γ
    for p, w in zip(clipped, ws, strict=True):
        torch.testing.assert_close(p.detach(), w, rtol=1e-12, atol=1e-12)


def test_clip_leaves_small_ratios_alone():
    clipped, free = make_params(), make_params()
    run_lars(free, 3, LRS, trust_coefficient=0.02)
    run_lars(clipped, 3, LRS, trust_coefficient=0.02, clip=True)
    for p, q in zip(clipped, free, strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=0)


def test_state_dict_round_trip_continues_like_an_uninterrupted_run():
    params = make_params()
    opt, _ = run_lars(params, 3, LRS)
    saved_params = [p.detach().clone() for p in params]
    saved_state = copy.deepcopy(opt.state_dict())
    assert all("momentum_buffer" in s for s in saved_state["state"].values())

    resumed = [nn.Parameter(p.clone()) for p in saved_params]
    opt_resumed = LARS(resumed, lr=0.0)
    opt_resumed.load_state_dict(saved_state)
    assert opt_resumed.trust_ratios() is None
    for step in range(3, 5):
        for p, q, g in zip(params, resumed, grads_for(step), strict=True):
            p.grad, q.grad = g, g.clone()
        for o in (opt, opt_resumed):
            o.param_groups[0]["lr"] = LRS[step]
            o.step()
    for p, q in zip(params, resumed, strict=True):
        assert torch.equal(p.detach(), q.detach())
    assert torch.equal(opt.trust_ratios(), opt_resumed.trust_ratios())


def test_step_leaves_grads_untouched_and_skips_params_without_grad():
    params = make_params()
    opt = LARS(params, lr=1.0, trust_coefficient=0.02)
    grads = grads_for(0)
    params[0].grad, params[2].grad = grads[0].clone(), grads[2].clone()
    untouched = [params[1].detach().clone(), params[3].detach().clone()]
    opt.step()
    assert torch.equal(params[0].grad, grads[0]) and torch.equal(params[2].grad, grads[2])
    assert torch.equal(params[1].detach(), untouched[0])
    assert torch.equal(params[3].detach(), untouched[1])
    assert params[1] not in opt.state and params[3] not in opt.state
    assert opt.trust_ratios().shape == (2,)


def test_trust_ratios_equal_hand_ratios_in_parameter_order():
    params = make_params()
    opt = LARS(params, lr=1.0, weight_decay=1e-3)
    assert opt.trust_ratios() is None
    grads = grads_for(0)
    for p, g in zip(params, grads, strict=True):
        p.grad = g
    opt.step()
    want = [0.001 * p.norm().item() / (g.norm().item() + 1e-3 * p.norm().item())
            for p, g in zip(make_params(), grads, strict=True)]
    got = opt.trust_ratios()
    assert got.ndim == 1 and got.device == params[0].device
    torch.testing.assert_close(got, torch.tensor(want, dtype=got.dtype))


def test_trust_ratio_parameters_name_each_reported_ratio():
    """Only lars=True tensors that had a gradient are reported, in order, one ratio each."""
    adapted, excluded, frozen, last = (nn.Parameter(torch.ones(n)) for n in (2, 3, 4, 5))
    opt = LARS([{"params": [adapted, frozen, last], "lars": True},
                {"params": [excluded], "lars": False}], lr=0.1, bucket_bytes=1)
    assert opt.trust_ratio_parameters() == []
    adapted.grad, excluded.grad, last.grad = (torch.ones(n) for n in (2, 3, 5))
    opt.step()
    reported = opt.trust_ratio_parameters()
    assert [p is q for p, q in zip(reported, [adapted, last], strict=True)] == [True, True]
    assert opt.trust_ratios().shape == (2,)
    opt.load_state_dict(opt.state_dict())
    assert opt.trust_ratio_parameters() == []


@pytest.mark.parametrize("bucket_bytes", [1, 100, 10**9])
def test_cache_buckets_do_not_change_the_result(bucket_bytes):
    reference, bucketed = make_params(), make_params()
    _, want = run_lars(reference, 3, LRS, trust_coefficient=0.02, bucket_bytes=None)
    _, got = run_lars(bucketed, 3, LRS, trust_coefficient=0.02, bucket_bytes=bucket_bytes)
    for p, q in zip(reference, bucketed, strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(got[-1], want[-1], rtol=0, atol=0)


def test_mixed_dtypes_in_one_group_keep_ratio_order():
    params = [nn.Parameter(torch.full((4,), 3.0, dtype=torch.float64)),
              nn.Parameter(torch.full((2, 2), 1.0, dtype=torch.float32)),
              nn.Parameter(torch.full((3,), 2.0, dtype=torch.float64))]
    opt = LARS(params, lr=1.0, weight_decay=0.0)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    # λ = η‖w‖/‖g‖ with ‖g‖ = √n: 3·2/2, 1·2/2, 2·√3/√3; concatenated in the widest dtype.
    torch.testing.assert_close(opt.trust_ratios(),
                               torch.tensor([3e-3, 1e-3, 2e-3], dtype=torch.float64))


def test_step_needs_no_host_synchronisation(monkeypatch):
    """No tensor is turned into a Python value (the CPU stand-in for a CUDA sync check)."""
    params = make_params(torch.float32)
    opt = LARS([{"params": params[:2]}, {"params": params[2:], "lars": False}], lr=1.0,
               nesterov=True, clip=True)
    for p, g in zip(params, grads_for(0, torch.float32), strict=True):
        p.grad = g

    def forbidden(*args, **kwargs):
        raise AssertionError("host synchronisation in LARS.step")

    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    opt.step()
    opt.step()
    ratios = opt.trust_ratios()
    monkeypatch.undo()
    assert ratios.shape == (2,) and bool(torch.isfinite(ratios).all())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_step_does_not_synchronise():
    params = [nn.Parameter(p.detach().float().cuda()) for p in make_params()]
    opt = LARS(params, lr=1.0)
    for p, g in zip(params, grads_for(0, torch.float32), strict=True):
        p.grad = g.cuda()
    opt.step()  # buffers are allocated on the first step
    torch.cuda.set_sync_debug_mode("error")
    try:
        opt.step()
        opt.trust_ratios()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_invalid_hyperparameters_are_rejected():
    params = make_params()
    with pytest.raises(ValueError, match="lr must be >= 0"):
        LARS(params, lr=-1.0)
    with pytest.raises(ValueError, match="momentum"):
        LARS(params, lr=1.0, momentum=1.0)
    with pytest.raises(ValueError, match="trust_coefficient"):
        LARS(params, lr=1.0, trust_coefficient=0.0)
    with pytest.raises(ValueError, match="nesterov"):
        LARS([{"params": params, "momentum": 0.0}], lr=1.0, nesterov=True)


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.bn(self.conv(x)).mean(dim=(2, 3)))


def test_parameter_groups_put_bn_and_bias_in_the_excluded_group():
    model = ConvBN()
    adapted, excluded = parameter_groups(model, weight_decay=5e-4)
    assert adapted["names"] == ["conv.weight", "fc.weight"]
    assert adapted["lars"] is True and adapted["weight_decay"] == 5e-4
    assert excluded["names"] == ["bn.weight", "bn.bias", "fc.bias"]
    assert excluded["lars"] is False and excluded["weight_decay"] == 0.0
    assert excluded["params"][0] is model.bn.weight

    (everything,) = parameter_groups(model, weight_decay=5e-4, exclude_bn_and_bias=False)
    assert len(everything["params"]) == 5 and everything["lars"] is True
    assert everything["weight_decay"] == 5e-4

    groups = parameter_groups(nn.Conv2d(3, 4, 3, bias=False), weight_decay=1e-4)
    assert [g["names"] for g in groups] == [["weight"]]  # the empty excluded group is dropped


def test_build_optimizer_lars_and_sgd_train_a_conv_bn_model():
    torch.manual_seed(0)
    x, y = torch.randn(8, 3, 6, 6), torch.randint(0, 2, (8,))
    for name, kind in (("lars", LARS), ("sgd", torch.optim.SGD)):
        model = ConvBN()
        opt = build_optimizer(model, name, 0.1, weight_decay=1e-4, trust_coefficient=0.01)
        assert type(opt) is kind
        assert [g["weight_decay"] for g in opt.param_groups] == [1e-4, 0.0]
        losses = []
        for _ in range(5):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[-1] < losses[0], name
    sgd = build_optimizer(ConvBN(), "sgd", 0.1, nesterov=True)
    assert sgd.defaults["foreach"] is True and sgd.defaults["nesterov"] is True
    assert sgd.defaults["momentum"] == 0.9
    with pytest.raises(ValueError,
                       match="^unknown optimizer 'adam'; choose one of: lars, lamb, sgd$"):
        build_optimizer(ConvBN(), "adam", 0.1)


def test_lars_has_a_default_lr_for_factories_that_build_by_keyword():
    opt = LARS(make_params())
    assert opt.defaults["lr"] == 1.0 and opt.defaults["trust_coefficient"] == 0.001


def test_build_optimizer_and_the_run_config_take_lars_defaults():
    """bigbatch.lars_defaults is the defaults' one home: LARS's signature, build_optimizer and
    the run config (which stays free of torch) all read them."""
    import dataclasses

    from bigbatch.config import OptimConfig
    from bigbatch.lars_defaults import LARS_DEFAULTS
    from bigbatch.optim.base import keyword_defaults

    defaults = keyword_defaults(LARS)
    assert {k: defaults[k] for k in dataclasses.asdict(LARS_DEFAULTS)} == dataclasses.asdict(
        LARS_DEFAULTS)
    config = OptimConfig()
    assert {k: getattr(config, k) for k in defaults if hasattr(config, k)} == {
        k: v for k, v in defaults.items() if hasattr(config, k)}
    assert {"lr", "momentum", "weight_decay", "trust_coefficient", "eps", "clip", "nesterov",
            "fused_compile"} <= set(vars(config))
    for name in ("lars", "lamb", "sgd"):
        opt = build_optimizer(ConvBN(), name, 0.1)
        assert opt.param_groups[0]["weight_decay"] == defaults["weight_decay"], name
    lamb = build_optimizer(ConvBN(), "lamb", 0.1)
    assert lamb.defaults["betas"] == (defaults["momentum"], 0.999)
    with pytest.raises(TypeError, match="^build_optimizer got options LARS does not take: betas$"):
        build_optimizer(ConvBN(), "sgd", 0.1, betas=(0.9, 0.99))


def test_zero_lr_still_moves_the_weights_by_the_earlier_steps_momentum():
    """Algorithm 1 keeps the LR inside the buffer: at γ = 0, w ← w − m·v (timm's Lars and
    PyTorch's SGD, LR outside, stop at once)."""
    params = make_params()
    opt, _ = run_lars(params, 1, [1.0], momentum=0.9)
    buffers = [opt.state[p]["momentum_buffer"].clone() for p in params]
    before = [p.detach().clone() for p in params]
    for p, g in zip(params, grads_for(1), strict=True):
        p.grad = g
    opt.param_groups[0]["lr"] = 0.0
    opt.step()
    for p, w, v in zip(params, before, buffers, strict=True):
        assert v.abs().max() > 0
        torch.testing.assert_close(p.detach(), w - 0.9 * v, rtol=1e-12, atol=1e-12)


def test_build_optimizer_without_exclusion_adapts_every_tensor():
    opt = build_optimizer(ConvBN(), "lars", 0.1, exclude_bn_and_bias=False, clip=True)
    (group,) = opt.param_groups
    assert group["lars"] is True and group["clip"] is True and len(group["params"]) == 5


@pytest.mark.slow
def test_fused_compile_matches_eager():
    eager, compiled = make_params(torch.float32), make_params(torch.float32)
    _, want = run_lars(eager, 3, LRS, trust_coefficient=0.02)
    _, got = run_lars(compiled, 3, LRS, trust_coefficient=0.02, fused_compile=True)
    for p, q in zip(eager, compiled, strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[-1], want[-1])


def test_deepcopy_keeps_options_and_continues_identically():
    params = make_params()
    opt, _ = run_lars(params, 2, LRS, clip=True, bucket_bytes=64)
    twin = copy.deepcopy({"params": params, "opt": opt})  # one memo: twin["opt"] holds the copies
    twin_params, twin_opt = twin["params"], twin["opt"]
    assert twin_opt.param_groups[0]["clip"] is True
    assert twin_opt.param_groups[0]["bucket_bytes"] == 64
    assert twin_opt.trust_ratios() is None  # a per-process cache, not state
    for p, q, g in zip(params, twin_params, grads_for(7), strict=True):
        p.grad, q.grad = g, g.clone()
    opt.step()
    twin_opt.step()
    for p, q in zip(params, twin_params, strict=True):
        assert torch.equal(p.detach(), q.detach())


def layout_run(fresh: bool, steps: int = 3, dtype: torch.dtype = torch.float32):
    """LARS with BN/bias-style exclusion over LAYOUT_SHAPES: weights and gradients either freshly
    allocated or views into flat buffers at odd offsets; the same values either way."""
    gen = torch.Generator().manual_seed(5)
    values = [torch.randn(s, generator=gen, dtype=dtype) for s in LAYOUT_SHAPES]
    weights = values if fresh else odd_offset_views(values)
    params = [nn.Parameter(w) for w in weights]
    opt = LARS([{"params": [p for p in params if p.ndim > 1]},
                {"params": [p for p in params if p.ndim <= 1], "lars": False,
                 "weight_decay": 0.0}], lr=2.0, trust_coefficient=0.02, weight_decay=5e-4)
    ratios = []
    for step in range(steps):
        grads = [torch.randn(s, generator=gen, dtype=dtype) * (1 + step) for s in LAYOUT_SHAPES]
        for p, g in zip(params, grads if fresh else odd_offset_views(grads), strict=True):
            p.grad = g
        opt.step()
        ratios.append(opt.trust_ratios())
    return params, opt, ratios


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_step_is_the_same_bits_whatever_the_memory_alignment(dtype):
    """A pure function of the values: DDP bucket views at odd offsets give fresh tensors' bits."""
    fresh, fresh_opt, fresh_ratios = layout_run(True, dtype=dtype)
    views, views_opt, views_ratios = layout_run(False, dtype=dtype)
    assert any(p.storage_offset() % 16 for p in views)
    for p, q, shape in zip(fresh, views, LAYOUT_SHAPES, strict=True):
        assert torch.equal(p.detach(), q.detach()), f"weights of shape {shape}"
        assert torch.equal(fresh_opt.state[p]["momentum_buffer"],
                           views_opt.state[q]["momentum_buffer"]), f"momentum of shape {shape}"
    for step, (got, want) in enumerate(zip(views_ratios, fresh_ratios, strict=True)):
        assert torch.equal(got, want), f"trust ratios at step {step}: {got - want}"


def test_kernel_takes_the_cpu_float_tensors_and_leaves_the_rest_to_eager(lars_path):
    params = make_params(torch.float32)
    grads = grads_for(0, torch.float32)
    bufs = [torch.zeros_like(p) for p in params]
    assert lars_kernel.supports(params, grads, bufs) == (lars_path == "kernel")
    transposed = [g.t() if g.ndim == 2 else g for g in grads]
    assert not lars_kernel.supports(params, transposed, bufs)  # other strides than the weight
    halves = [p.detach().bfloat16() for p in params]
    assert not lars_kernel.supports(halves, [g.bfloat16() for g in grads], halves)


def test_non_contiguous_gradient_takes_the_eager_path_with_the_same_result():
    params, reference = make_params(), make_params()
    opt, ref = LARS(params, lr=1.0, trust_coefficient=0.02), LARS(reference, lr=1.0,
                                                                   trust_coefficient=0.02)
    assert_column_major_gradients_step_alike(opt, ref, params, reference, grads_for(0))


def test_kernel_bits_do_not_depend_on_the_thread_count(lars_path):
    runs = []
    for threads in (1, 2, 3):
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            runs.append(layout_run(True, dtype=torch.float32))
        finally:
            torch.set_num_threads(before)
    for params, _, ratios in runs[1:]:
        assert all(torch.equal(p, q) for p, q in zip(params, runs[0][0], strict=True))
        assert all(torch.equal(r, s) for r, s in zip(ratios, runs[0][2], strict=True))


def test_kernel_matches_the_eager_path(monkeypatch, lars_path):
    if lars_path == "eager":
        pytest.skip("compares the two paths once")
    kernel, _, kernel_ratios = layout_run(True, steps=4)
    monkeypatch.setattr(lars_kernel, "_KERNELS", None)
    eager, _, eager_ratios = layout_run(True, steps=4)
    for p, q in zip(kernel, eager, strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(kernel_ratios[-1], eager_ratios[-1], rtol=1e-6, atol=0)


def test_step_bumps_the_version_of_weights_and_buffers():
    """Autograd sees the in-place update (an old graph using the weight then refuses to run)."""
    params = make_params(torch.float32)
    opt = LARS(params, lr=1.0)
    for p, g in zip(params, grads_for(0, torch.float32), strict=True):
        p.grad = g
    opt.step()
    versions = [p._version for p in params]
    opt.step()
    assert all(p._version > v for p, v in zip(params, versions, strict=True))


def test_channels_last_weights_step_like_contiguous_ones():
    dense, channels_last = ConvBN(), ConvBN()
    channels_last.load_state_dict(dense.state_dict())
    channels_last.to(memory_format=torch.channels_last)
    assert channels_last.conv.weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(4, 3, 6, 6)
    for model in (dense, channels_last):
        opt = LARS(model.parameters(), lr=1.0, trust_coefficient=0.02)
        for _ in range(3):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    for p, q in zip(dense.parameters(), channels_last.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("change", [None, "p.data", "in_place", "new_storage", "load_state_dict"])
def test_weights_changed_between_steps_step_as_in_a_fresh_optimizer(change, lars_path):
    """Every step reads the weights' norms from the weights: one changed in between (through
    ``p.data``, in place, moved to new storage, loaded) gives the bits of an optimizer built
    afresh at every step from the same state."""
    kept, fresh = make_params(torch.float32), make_params(torch.float32)
    opt = LARS(kept, lr=1.0, trust_coefficient=0.02)
    fresh_state = LARS(fresh, lr=1.0, trust_coefficient=0.02).state_dict()
    for step in range(4):
        for ps in (kept, fresh):
            for p, g in zip(ps, grads_for(step, torch.float32), strict=True):
                p.grad = g
            if step == 2 and change is not None:
                change_weights(ps, change)
        fresh_opt = LARS(fresh, lr=1.0, trust_coefficient=0.02)
        fresh_opt.load_state_dict(fresh_state)
        opt.step()
        fresh_opt.step()
        fresh_state = fresh_opt.state_dict()
        for p, q in zip(kept, fresh, strict=True):
            assert torch.equal(p.detach(), q.detach()), f"step {step}"
        assert torch.equal(opt.trust_ratios(), fresh_opt.trust_ratios())


def change_weights(params: list[nn.Parameter], change: str) -> None:
    with torch.no_grad():
        scaled = {i: p * 1.5 for i, p in enumerate(params)}
        if change == "p.data":
            params[0].data.mul_(1.5)
        elif change == "in_place":
            params[0].mul_(1.5)
        elif change == "new_storage":
            params[0].data = scaled[0]
        else:
            nn.ParameterList(params).load_state_dict({str(i): t for i, t in scaled.items()})
