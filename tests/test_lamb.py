"""LAMB against a float64 hand computation of Algorithm 2 and against timm's Lamb, on the compiled
CPU kernel and on the eager fallback."""

from __future__ import annotations

import math

import pytest
import torch
from layouts import (
    LAYOUT_SHAPES,
    assert_column_major_gradients_step_alike,
    kernel_or_eager,
    odd_offset_views,
)
from timm.optim import Lamb
from torch import nn

from bigbatch.optim import LAMB, build_optimizer, lamb_kernel

SHAPES = [(6, 4), (3, 2, 3, 3), (5,), (7, 1)]
LRS = [0.01, 0.02, 0.05, 0.03, 0.01]


@pytest.fixture(autouse=True, params=["kernel", "eager"])
def lamb_path(request, monkeypatch):
    """Every test runs on the compiled CPU kernel and on the eager fallback."""
    return kernel_or_eager(request.param, lamb_kernel, monkeypatch, "_lamb_kernel.c")


def make_params(seed: int = 0) -> list[nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    params = [nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64)) for s in SHAPES]
    with torch.no_grad():
        params[2].zero_()  # a zero-initialised bias: ratio 1 where it is adapted
    return params


def grads_for(step: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(s, generator=gen, dtype=torch.float64) * (0.1 + step) for s in SHAPES]


def hand_lamb(steps: int, adapted: list[bool], decays: list[float], beta1=0.9, beta2=0.999,
              eps=1e-6) -> list[torch.Tensor]:
    """Algorithm 2, one tensor at a time, the norms as Python floats."""
    xs = [p.detach().clone() for p in make_params()]
    ms = [torch.zeros_like(x) for x in xs]
    vs = [torch.zeros_like(x) for x in xs]
    for t in range(1, steps + 1):
        for i, g in enumerate(grads_for(t - 1)):
            ms[i] = beta1 * ms[i] + (1 - beta1) * g
            vs[i] = beta2 * vs[i] + (1 - beta2) * g * g
            r = (ms[i] / (1 - beta1**t)) / ((vs[i] / (1 - beta2**t)).sqrt() + eps)
            u = r + decays[i] * xs[i]
            x_norm, u_norm = math.sqrt(float((xs[i] ** 2).sum())), math.sqrt(float((u**2).sum()))
            ratio = x_norm / u_norm if adapted[i] and x_norm > 0 and u_norm > 0 else 1.0
            xs[i] = xs[i] - LRS[t - 1] * ratio * u
    return xs


def run(opt: torch.optim.Optimizer, params: list[nn.Parameter], steps: int) -> None:
    for step in range(steps):
        for p, g in zip(params, grads_for(step), strict=True):
            p.grad = g
        for group in opt.param_groups:
            group["lr"] = LRS[step]
        opt.step()


def groups(params: list[nn.Parameter], wd: float = 0.01) -> list[dict]:
    """BN/bias-style exclusion: matrices adapted and decayed, vectors neither."""
    return [{"params": [p for p in params if p.ndim > 1], "weight_decay": wd},
            {"params": [p for p in params if p.ndim <= 1], "lars": False, "weight_decay": 0.0}]


@pytest.mark.parametrize("exclusion", [False, True])
def test_update_equals_algorithm_2_by_hand_over_several_steps(exclusion):
    params = make_params()
    start = [p.detach().clone() for p in params]
    opt = LAMB(groups(params) if exclusion else params, lr=LRS[0], weight_decay=0.01)
    run(opt, params, 5)
    adapted = [p.ndim > 1 or not exclusion for p in params]
    decays = [0.01 if a else 0.0 for a in adapted]
    for p, x, x0 in zip(params, hand_lamb(5, adapted, decays), start, strict=True):
        assert (x - x0).abs().max() > 1e-3
        torch.testing.assert_close(p.detach(), x, rtol=1e-12, atol=1e-12)
    assert all(opt.state[p]["step"] == 5 for p in params)


def test_float32_update_matches_float64_hand_computation():
    params = [nn.Parameter(p.detach().float()) for p in make_params()]
    opt = LAMB(params, lr=LRS[0])
    for step in range(5):
        for p, g in zip(params, grads_for(step), strict=True):
            p.grad = g.float()
        opt.param_groups[0]["lr"] = LRS[step]
        opt.step()
    want = hand_lamb(5, [True] * 4, [0.01] * 4)
    for p, x in zip(params, want, strict=True):
        torch.testing.assert_close(p.detach().double(), x, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("exclusion", [False, True])
def test_trajectory_equals_timm_lamb_without_its_global_grad_clipping(exclusion):
    """timm's Lamb is Algorithm 2 with max_grad_norm=None (its default 1.0 first divides every
    gradient by max(1, global norm)), non-decoupled decay, bias correction, and adaptation only
    of tensors with weight decay (always_adapt=False) — our excluded group has none."""
    ours, theirs = make_params(), make_params()
    opt = LAMB(groups(ours) if exclusion else ours, lr=LRS[0], weight_decay=0.01)
    ref = Lamb(groups(theirs) if exclusion else theirs, lr=LRS[0], weight_decay=0.01,
               max_grad_norm=None, eps=1e-6)
    run(opt, ours, 5)
    run(ref, theirs, 5)
    for p, q in zip(ours, theirs, strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-12, atol=1e-12)


def test_timm_default_clipping_is_another_update():
    ours, theirs = make_params(), make_params()
    run(LAMB(ours, lr=LRS[0]), ours, 2)
    run(Lamb(theirs, lr=LRS[0]), theirs, 2)  # max_grad_norm=1.0; these gradients' norm is > 1
    assert max((p - q).abs().max() for p, q in zip(ours, theirs, strict=True)) > 1e-4


def test_step_needs_no_host_synchronisation(monkeypatch):
    params = [nn.Parameter(p.detach().float()) for p in make_params()]
    opt = LAMB(groups(params), lr=0.01)
    for p, g in zip(params, grads_for(0), strict=True):
        p.grad = g.float()

    def forbidden(*args, **kwargs):
        raise AssertionError("host synchronisation in LAMB.step")

    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    opt.step()
    opt.step()
    monkeypatch.undo()
    assert all(bool(torch.isfinite(p).all()) for p in params)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_step_does_not_synchronise():
    params = [nn.Parameter(p.detach().float().cuda()) for p in make_params()]
    opt = LAMB(groups(params), lr=0.01)
    for p, g in zip(params, grads_for(0), strict=True):
        p.grad = g.float().cuda()
    opt.step()
    torch.cuda.set_sync_debug_mode("error")
    try:
        opt.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("bucket_bytes", [1, 10**9])
def test_cache_buckets_do_not_change_the_result(bucket_bytes):
    reference, bucketed = make_params(), make_params()
    run(LAMB(reference, lr=LRS[0]), reference, 3)
    run(LAMB(bucketed, lr=LRS[0], bucket_bytes=bucket_bytes), bucketed, 3)
    for p, q in zip(reference, bucketed, strict=True):
        assert torch.equal(p, q)


def test_build_optimizer_lamb_uses_the_exclusion_groups():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    opt = build_optimizer(model, "lamb", 0.01, weight_decay=0.01)
    assert type(opt) is LAMB
    assert [(g["lars"], g["weight_decay"]) for g in opt.param_groups] == [(True, 0.01),
                                                                          (False, 0.0)]
    assert opt.defaults["eps"] == 1e-6  # LARS's eps 0 means LAMB's default


def test_invalid_hyperparameters_are_rejected():
    with pytest.raises(ValueError, match="betas"):
        LAMB(make_params(), betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="eps must be > 0"):
        LAMB(make_params(), eps=0.0)
    with pytest.raises(ValueError, match="lr must be >= 0"):
        LAMB(make_params(), lr=-1.0)


def layout_run(fresh: bool, steps: int = 3, dtype: torch.dtype = torch.float32,
               bucket_bytes: int | None = None) -> list[nn.Parameter]:
    """LAMB with BN/bias-style exclusion over LAYOUT_SHAPES: weights and gradients either freshly
    allocated or views into flat buffers at odd offsets; the same values either way."""
    gen = torch.Generator().manual_seed(5)
    values = [torch.randn(s, generator=gen, dtype=dtype) for s in LAYOUT_SHAPES]
    params = [nn.Parameter(w) for w in (values if fresh else odd_offset_views(values))]
    opt = LAMB(groups(params), lr=0.01, bucket_bytes=bucket_bytes)
    for step in range(steps):
        grads = [torch.randn(s, generator=gen, dtype=dtype) * (1 + step) for s in LAYOUT_SHAPES]
        for p, g in zip(params, grads if fresh else odd_offset_views(grads), strict=True):
            p.grad = g
        opt.step()
    return params


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_step_is_the_same_bits_whatever_the_memory_alignment(dtype):
    """A pure function of the values: DDP bucket views at odd offsets give fresh tensors' bits."""
    fresh, views = layout_run(True, dtype=dtype), layout_run(False, dtype=dtype)
    assert any(p.storage_offset() % 16 for p in views)
    for p, q, shape in zip(fresh, views, LAYOUT_SHAPES, strict=True):
        assert torch.equal(p.detach(), q.detach()), f"weights of shape {shape}"


def test_kernel_bits_do_not_depend_on_the_thread_count_or_the_buckets():
    runs = []
    for threads, bucket_bytes in ((1, None), (2, 4096), (3, 10**9)):
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            runs.append(layout_run(True, bucket_bytes=bucket_bytes))
        finally:
            torch.set_num_threads(before)
    for params in runs[1:]:
        assert all(torch.equal(p, q) for p, q in zip(params, runs[0], strict=True))


def test_kernel_matches_the_eager_path(monkeypatch, lamb_path):
    if lamb_path == "eager":
        pytest.skip("compares the two paths once")
    calls = []
    step = lamb_kernel.step
    monkeypatch.setattr(lamb_kernel, "step", lambda *a, **k: calls.append(1) or step(*a, **k))
    kernel = layout_run(True, steps=4)
    assert len(calls) == 4 * 2  # every step of both groups
    monkeypatch.setattr(lamb_kernel, "_KERNELS", None)
    eager = layout_run(True, steps=4)
    assert len(calls) == 4 * 2
    for p, q in zip(kernel, eager, strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)


def test_kernel_takes_the_cpu_float_tensors_and_leaves_the_rest_to_eager(lamb_path):
    params = [p.detach().float() for p in make_params()]
    grads = [g.float() for g in grads_for(0)]
    states = [torch.zeros_like(p) for p in params]
    assert lamb_kernel.supports(params, grads, states, states) == (lamb_path == "kernel")
    transposed = [g.t() if g.ndim == 2 else g for g in grads]
    assert not lamb_kernel.supports(params, transposed, states, states)
    halves = [p.bfloat16() for p in params]
    assert not lamb_kernel.supports(halves, [g.bfloat16() for g in grads], halves, halves)


def test_non_contiguous_gradient_takes_the_eager_path_with_the_same_result():
    params, reference = make_params(), make_params()
    opt, ref = LAMB(params, lr=0.01), LAMB(reference, lr=0.01)
    assert_column_major_gradients_step_alike(opt, ref, params, reference, grads_for(0))


def test_step_bumps_the_version_of_weights_and_moments():
    """Autograd sees the in-place update (an old graph using the weight then refuses to run)."""
    params = make_params()
    opt = LAMB(params, lr=0.01)
    for p, g in zip(params, grads_for(0), strict=True):
        p.grad = g
    opt.step()
    tensors = params + [opt.state[p][k] for p in params for k in ("exp_avg", "exp_avg_sq")]
    versions = [t._version for t in tensors]
    opt.step()
    assert all(t._version > v for t, v in zip(tensors, versions, strict=True))


@pytest.mark.slow
def test_fused_compile_follows_algorithm_2_and_compiles_once_per_group(lamb_path):
    """The compiled update over five steps of changing LR: Algorithm 2 by hand to float32
    rounding, the eager step alike, and one graph per group however the LR and step move."""
    if lamb_path == "kernel":
        pytest.skip("fused_compile bypasses the CPU kernel: one run is enough")
    from torch._dynamo.utils import counters

    compiled = [nn.Parameter(p.detach().float()) for p in make_params()]
    eager = [nn.Parameter(p.detach().float()) for p in make_params()]
    opts = [LAMB(groups(compiled), lr=LRS[0], fused_compile=True), LAMB(groups(eager), lr=LRS[0])]
    torch._dynamo.reset()
    counters.clear()
    for step in range(5):
        for opt, params in zip(opts, (compiled, eager), strict=True):
            for p, g in zip(params, grads_for(step), strict=True):
                p.grad = g.float()
            for group in opt.param_groups:
                group["lr"] = LRS[step]
            opt.step()
    assert counters["stats"]["unique_graphs"] == 2  # the adapted group and the excluded one
    adapted = [p.ndim > 1 for p in compiled]
    want = hand_lamb(5, adapted, [0.01 if a else 0.0 for a in adapted])
    for p, q, x in zip(compiled, eager, want, strict=True):
        torch.testing.assert_close(p.detach().double(), x, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)
