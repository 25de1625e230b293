"""LARS and LAMB under PyTorch's optimizer conventions, each on its compiled CPU kernel and on its
eager path, against a float64 reference of its algorithm (Algorithm 1 of You, Gitman & Ginsburg,
"Large Batch Training of Convolutional Networks", 2017; Algorithm 2 of You et al., "Large Batch
Optimization for Deep Learning: Training BERT in 76 Minutes", ICLR 2020).

The model has three groups (the default options; a group with its own LR, weight decay and
momentum; an excluded ``lars=False`` group without decay), tensors of one kernel chunk and of
several, and a tensor that never gets a gradient.
"""

from __future__ import annotations

import copy
import io
import math
import pickle
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from layouts import kernel_or_eager
from torch import nn

from bigbatch.optim import LAMB, LARS, lamb_kernel, lars_kernel

SHAPES = {"conv": (8, 3, 3, 3), "wide": (20, 1000), "fc": (10, 12), "scale": (12,),
          "bias": (10,)}
GROUPS = (("conv", "wide"), ("fc",), ("scale", "bias"))  # default, own options, excluded
STEPS = 4


def lars_reference(w, g, state, group):
    """Algorithm 1 for one float64 tensor (LR inside the momentum buffer)."""
    wd, momentum = group["weight_decay"], group["momentum"]
    w_norm, g_norm = w.norm().item(), g.norm().item()
    ratio = 1.0
    if group["lars"] and w_norm > 0 and g_norm > 0:
        ratio = group["trust_coefficient"] * w_norm / (g_norm + wd * w_norm + group["eps"])
    if group["clip"]:
        ratio = min(ratio, 1.0)
    step = group["lr"] * ratio * (g + wd * w)
    state["v"] = momentum * state.get("v", torch.zeros_like(w)) + step
    return w - (momentum * state["v"] + step if group["nesterov"] else state["v"])


def lamb_reference(w, g, state, group):
    """Algorithm 2 for one float64 tensor (φ the identity)."""
    beta1, beta2 = group["betas"]
    t = state["t"] = state.get("t", 0) + 1
    state["m"] = beta1 * state.get("m", torch.zeros_like(w)) + (1 - beta1) * g
    state["v"] = beta2 * state.get("v", torch.zeros_like(w)) + (1 - beta2) * g * g
    r = (state["m"] / (1 - beta1**t)) / ((state["v"] / (1 - beta2**t)).sqrt() + group["eps"])
    u = r + group["weight_decay"] * w
    w_norm, u_norm = w.norm().item(), u.norm().item()
    ratio = w_norm / u_norm if group["lars"] and w_norm > 0 and u_norm > 0 else 1.0
    return w - group["lr"] * ratio * u


@dataclass(frozen=True)
class Kind:
    name: str
    make: Callable[..., torch.optim.Optimizer]
    own_options: dict  # the second group's options
    reference: Callable
    kernel: object
    source: str


KINDS = {
    "lars": Kind("lars", lambda groups: LARS(groups, lr=0.8, trust_coefficient=0.02),
                 {"lr": 0.3, "momentum": 0.8, "weight_decay": 1e-2, "trust_coefficient": 0.05},
                 lars_reference, lars_kernel, "_lars_kernel.c"),
    "lamb": Kind("lamb", lambda groups: LAMB(groups, lr=0.01),
                 {"lr": 0.03, "betas": (0.8, 0.99), "weight_decay": 0.1},
                 lamb_reference, lamb_kernel, "_lamb_kernel.c"),
}


@pytest.fixture(params=[(name, path) for name in KINDS for path in ("kernel", "eager")],
                ids=lambda p: "-".join(p))
def kind(request, monkeypatch) -> Kind:
    """Each test runs for LARS and LAMB, on the compiled CPU kernel and on the eager path."""
    name, path = request.param
    found = KINDS[name]
    kernel_or_eager(path, found.kernel, monkeypatch, found.source)
    return found


class Model(nn.Module):
    def __init__(self, dtype: torch.dtype = torch.float32, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        for name, shape in SHAPES.items():
            value = torch.randn(shape, generator=gen, dtype=torch.float64) * 0.5
            self.register_parameter(name, nn.Parameter(value.to(dtype)))
        self.frozen = nn.Parameter(torch.ones(3, dtype=dtype))  # never gets a gradient


def optimizer_for(kind: Kind, model: Model) -> torch.optim.Optimizer:
    default, own, excluded = ([getattr(model, n) for n in names] for names in GROUPS)
    return kind.make([{"params": default + [model.frozen]}, {"params": own, **kind.own_options},
                      {"params": excluded, "lars": False, "weight_decay": 0.0}])


def gradients(step: int) -> dict[str, torch.Tensor]:
    """Gradient values at least 0.02 from 0: LAMB's second moment of a smaller one underflows
    in float16 (see the LAMB docstring)."""
    gen = torch.Generator().manual_seed(100 + step)
    grads = {}
    for name, shape in SHAPES.items():
        g = torch.randn(shape, generator=gen, dtype=torch.float64)
        grads[name] = (g + 0.1 * g.sign()) * (0.2 + step)
    return grads


def set_gradients(model: Model, step: int) -> None:
    for name, g in gradients(step).items():
        param = getattr(model, name)
        param.grad = g.to(param.dtype)


class Reference:
    """The optimizer's groups' algorithm in float64 over a copy of the model's weights."""

    def __init__(self, kind: Kind, model: Model, opt: torch.optim.Optimizer) -> None:
        self.kind = kind
        names = {id(p): n for n, p in model.named_parameters()}
        self.groups = [(g, [names[id(p)] for p in g["params"]]) for g in opt.param_groups]
        self.weights = {n: p.detach().double().clone() for n, p in model.named_parameters()}
        self.states: dict[str, dict] = {n: {} for n in self.weights}

    def step(self, step: int) -> None:
        grads = gradients(step)
        for group, names in self.groups:
            for n in names:
                if n in grads:
                    self.weights[n] = self.kind.reference(self.weights[n], grads[n],
                                                          self.states[n], group)


def assert_weights(model: Model, weights: dict[str, torch.Tensor], rtol: float, atol: float,
                   why: str = "") -> None:
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.detach().double(), weights[name], rtol=rtol, atol=atol,
                                   msg=lambda m, name=name: f"{name} {why}: {m}")


def run(model: Model, opt: torch.optim.Optimizer, steps: range) -> None:
    for step in steps:
        set_gradients(model, step)
        opt.step()


# --------------------------------------------------------------------------- the update

def test_groups_with_their_own_options_follow_the_float64_reference(kind):
    model = Model(torch.float64)
    opt = optimizer_for(kind, model)
    reference = Reference(kind, model, opt)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    for step in range(STEPS):
        set_gradients(model, step)
        opt.step()
        reference.step(step)
    assert_weights(model, reference.weights, rtol=1e-12, atol=1e-12)
    for name in SHAPES:  # every group moved: the comparison is not of unchanged tensors
        assert (getattr(model, name).detach() - start[name]).abs().max() > 1e-4, name


EDITS = {
    # name: (what a user's code does to the model between steps, the same on a float64 dict)
    "p.data": lambda m: [p.data.mul_(0.5) for p in m.parameters()],
    "p.data =": lambda m: [setattr(p, "data", p.data * 0.5) for p in m.parameters()],
    "copy_": lambda m: _no_grad(lambda: [p.copy_(p * 0.5) for p in m.parameters()]),
    "no_grad op": lambda m: _no_grad(lambda: [p.mul_(0.5) for p in m.parameters()]),
    "load_state_dict": lambda m: m.load_state_dict({k: v * 0.5
                                                    for k, v in m.state_dict().items()}),
}


def _no_grad(fn: Callable[[], object]) -> None:
    with torch.no_grad():
        fn()


@pytest.mark.parametrize("edit", EDITS)
def test_weights_edited_between_steps_step_from_their_new_values(kind, edit):
    """The update is a function of the tensors' current values, however they were written."""
    model = Model(torch.float32)
    opt = optimizer_for(kind, model)
    reference = Reference(kind, model, opt)
    for step in range(STEPS):
        if step == 2:
            EDITS[edit](model)
            reference.weights = {n: w * 0.5 for n, w in reference.weights.items()}
        set_gradients(model, step)
        opt.step()
        reference.step(step)
        assert_weights(model, reference.weights, rtol=2e-5, atol=1e-6, why=f"after step {step}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_every_float_dtype_steps_as_the_reference_in_its_precision(kind, dtype):
    model = Model(dtype)
    opt = optimizer_for(kind, model)
    reference = Reference(kind, model, opt)
    run(model, opt, range(2))
    for step in range(2):
        reference.step(step)
    tolerance = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2,
                 torch.float16: 2e-3}[dtype]
    assert_weights(model, reference.weights, rtol=tolerance, atol=tolerance)
    for state in opt.state.values():
        assert all(t.dtype == dtype for t in state.values() if isinstance(t, torch.Tensor))


# --------------------------------------------------------------------------- conventions

def test_parameter_without_gradient_is_skipped_with_no_state(kind):
    model = Model()
    opt = optimizer_for(kind, model)
    before = model.frozen.detach().clone()
    run(model, opt, range(2))
    assert torch.equal(model.frozen.detach(), before)
    assert model.frozen not in opt.state
    assert all(getattr(model, name) in opt.state for name in SHAPES)


def test_zero_grad_to_none_skips_and_to_zero_steps_with_zero_gradients(kind):
    model, twin = Model(torch.float64), Model(torch.float64)
    opt, twin_opt = optimizer_for(kind, model), optimizer_for(kind, twin)
    run(model, opt, range(1))
    run(twin, twin_opt, range(1))
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in model.parameters())
    before = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    opt.step()
    assert_same(model.state_dict(), before[0])
    assert_same(opt.state_dict(), before[1])

    twin_opt.zero_grad(set_to_none=False)
    grads = [p.grad for p in twin.parameters() if p.grad is not None]
    assert len(grads) == len(SHAPES) and all(not g.any() for g in grads)
    reference = Reference(kind, twin, twin_opt)
    for group, names in reference.groups:
        for n in names:
            if n in SHAPES:
                reference.weights[n] = kind.reference(
                    reference.weights[n], torch.zeros(SHAPES[n], dtype=torch.float64),
                    _reference_state(kind, twin_opt, getattr(twin, n)), group)
    twin_opt.step()
    assert_weights(twin, reference.weights, rtol=1e-12, atol=1e-12)


def _reference_state(kind: Kind, opt: torch.optim.Optimizer, p: nn.Parameter) -> dict:
    """The optimizer's state of ``p`` under the reference's names."""
    state = opt.state.get(p, {})
    if not state:
        return {}
    if kind.name == "lars":
        return {"v": state["momentum_buffer"].clone()}
    return {"t": state["step"], "m": state["exp_avg"].clone(), "v": state["exp_avg_sq"].clone()}


def loss_closure(model: Model, opt: torch.optim.Optimizer, calls: list[bool]):
    x = torch.randn(5, 12, generator=torch.Generator().manual_seed(3))

    def closure() -> torch.Tensor:
        calls.append(torch.is_grad_enabled())
        opt.zero_grad()
        loss = (x @ model.fc.T + model.bias).square().mean() + model.wide.square().mean()
        loss.backward()
        return loss

    return closure


def test_closure_is_called_once_with_grad_enabled_and_its_loss_returned(kind):
    model, twin = Model(), Model()
    opt, twin_opt = optimizer_for(kind, model), optimizer_for(kind, twin)
    calls: list[bool] = []
    with torch.no_grad():
        loss = opt.step(loss_closure(model, opt, calls))
    assert calls == [True] and loss.requires_grad
    twin_loss = loss_closure(twin, twin_opt, [])()  # the same loss and gradients, by hand
    twin_opt.step()
    assert torch.equal(loss.detach(), twin_loss.detach())
    assert not torch.equal(model.fc.detach(), Model().fc.detach())
    assert_same(model.state_dict(), twin.state_dict())


# --------------------------------------------------------------------------- state

def assert_same(got: dict, want: dict, where: str = "") -> None:
    """Bit-identical nested state (tensors by value, everything else by ==)."""
    assert type(got) is type(want) or isinstance(got, dict), where
    if isinstance(want, dict):
        assert got.keys() == want.keys(), where
        for key in want:
            assert_same(got[key], want[key], f"{where}/{key}")
    elif isinstance(want, torch.Tensor):
        assert torch.equal(got, want), where
    elif isinstance(want, list | tuple):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
    else:
        assert got == want, where


def test_state_dict_round_trip_mid_run_continues_bit_identically(kind):
    model = Model()
    opt = optimizer_for(kind, model)
    run(model, opt, range(2))
    saved = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, saved)
    saved.seek(0)
    loaded = torch.load(saved, weights_only=True)
    resumed = Model(seed=9)  # other weights, overwritten by the load
    resumed.load_state_dict(loaded["model"])
    resumed_opt = optimizer_for(kind, resumed)
    resumed_opt.load_state_dict(loaded["opt"])
    run(model, opt, range(2, STEPS))
    run(resumed, resumed_opt, range(2, STEPS))
    assert_same(resumed.state_dict(), model.state_dict())
    assert_same(resumed_opt.state_dict(), opt.state_dict())


@pytest.mark.parametrize("clone", ["deepcopy", "pickle"])
def test_copied_optimizer_continues_bit_identically(kind, clone):
    model = Model()
    opt = optimizer_for(kind, model)
    run(model, opt, range(2))
    pair = {"model": model, "opt": opt}  # one memo: the copy's optimizer holds the copy's weights
    twin = copy.deepcopy(pair) if clone == "deepcopy" else pickle.loads(pickle.dumps(pair))
    assert twin["opt"].param_groups[1]["lr"] == kind.own_options["lr"]
    run(model, opt, range(2, STEPS))
    run(twin["model"], twin["opt"], range(2, STEPS))
    assert_same(twin["model"].state_dict(), model.state_dict())
    assert_same(twin["opt"].state_dict(), opt.state_dict())


@pytest.mark.parametrize("bad", ["first group", "last group"])
def test_a_step_that_raises_changes_nothing(kind, bad):
    model = Model()
    opt = optimizer_for(kind, model)
    run(model, opt, range(1))
    set_gradients(model, 1)
    sparse = model.conv if bad == "first group" else model.bias
    sparse.grad = sparse.grad.to_sparse()
    before = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()
    assert_same(model.state_dict(), before[0])
    assert_same(opt.state_dict(), before[1])


@pytest.mark.slow
def test_compiled_step_matches_the_eager_step(kind):
    """``torch.compile(opt.step)`` (with graph breaks where the kernel is called) steps alike."""
    model, twin = Model(), Model()
    opt, twin_opt = optimizer_for(kind, model), optimizer_for(kind, twin)
    compiled = torch.compile(opt.step)
    for step in range(2):
        set_gradients(model, step)
        set_gradients(twin, step)
        compiled()
        twin_opt.step()
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7, msg=name)


def test_reference_checks_are_not_vacuous():
    """The float64 references differ from plain momentum SGD and from each other."""
    w, g = torch.ones(4, dtype=torch.float64) * 3, torch.ones(4, dtype=torch.float64)
    group = {"lr": 1.0, "momentum": 0.9, "weight_decay": 0.0, "trust_coefficient": 0.1,
             "eps": 0.0, "clip": False, "nesterov": False, "lars": True, "betas": (0.9, 0.999)}
    # ‖w‖ = 6, ‖g‖ = 2: λ = 0.1·6/2 = 0.3, so w − 0.3·g; LAMB: u = sign(g), ratio ‖w‖/‖u‖ = 3
    assert torch.allclose(lars_reference(w, g, {}, group), w - 0.3)
    assert torch.allclose(lamb_reference(w, g, {}, {**group, "eps": 1e-12}), w - 3.0,
                          atol=1e-9)
    assert math.isclose(float(lars_reference(w, g, {}, {**group, "lars": False})[0]), 2.0)
