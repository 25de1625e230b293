"""The GPU's Triton LARS and LAMB steps (bigbatch.optim.triton_step), run on the CPU by Triton's
interpreter: through the optimizers, against the float64 references of Algorithms 1 and 2, the
eager steps, every layout the kernels take, and their failure path.

Triton reads TRITON_INTERPRET when it is first imported (torch imports it), so the suite runs this
file again in a child process with the variable set; there the tests below run.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from layouts import odd_offset_views
from test_optim_conformance import (
    KINDS,
    SHAPES,
    Model,
    Reference,
    assert_weights,
    gradients,
    optimizer_for,
    run,
)

from bigbatch.optim import LAMB, LARS, lamb_kernel, lars_kernel, native

pytest.importorskip("triton")

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
CHUNK, BLOCK = 512, 128  # a program's elements and its loop's step in these tests: the wide
# tensor (20,000 values) spans 40 chunks of 4 blocks


@pytest.mark.skipif(INTERPRETED, reason="the child process itself")
def test_the_kernels_in_triton_s_interpreter():
    """This file's tests, in a child process where Triton interprets its kernels on the CPU."""
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-p", "no:randomly", __file__],
        env={**os.environ, "TRITON_INTERPRET": "1"}, cwd=Path(__file__).parent,
        capture_output=True, text=True, timeout=900)
    summary = child.stdout.strip().splitlines()[-1] if child.stdout.strip() else ""
    assert child.returncode == 0, child.stdout[-6000:] + child.stderr[-3000:]
    # every test ran there but this one and the three compile tests (run here instead)
    assert " passed" in summary and "4 skipped" in summary and "failed" not in summary, summary


@pytest.fixture
def triton_step(monkeypatch):
    """The kernels (interpreted), with the CPU kernels off so that the optimizers reach them."""
    if not INTERPRETED:
        pytest.skip("runs in the child process (test_the_kernels_in_triton_s_interpreter)")
    from bigbatch.optim import triton_step as module
    monkeypatch.setattr(module, "CHUNK", CHUNK)
    monkeypatch.setattr(module, "BLOCK", BLOCK)
    monkeypatch.setattr(lars_kernel, "_KERNELS", None)
    monkeypatch.setattr(lamb_kernel, "_KERNELS", None)
    return module


def kernel_calls(module, monkeypatch) -> list[str]:
    """The names of the module's step functions as they are called."""
    calls: list[str] = []
    for name in ("lars_step", "lamb_step"):
        original = getattr(module, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("name", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_optimizers_step_through_the_kernels_as_the_float64_reference(triton_step, name,
                                                                          dtype, monkeypatch):
    """Three groups (default options; their own LR, decay and momentum or betas; an excluded
    group), tensors of one chunk and of many, a tensor without a gradient, four steps."""
    calls = kernel_calls(triton_step, monkeypatch)
    kind = KINDS[name]
    model = Model(dtype)
    opt = optimizer_for(kind, model)
    reference = Reference(kind, model, opt)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    run(model, opt, range(4))
    for step in range(4):
        reference.step(step)
    assert calls == [f"{name}_step"] * 3 * 4  # each group, each step, through the kernels
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    assert_weights(model, reference.weights, rtol=tolerance, atol=tolerance)
    for n in SHAPES:
        assert (getattr(model, n).detach() - start[n]).abs().max() > 1e-3, n
    assert torch.equal(model.frozen.detach(), start["frozen"])
    for state in opt.state.values():
        assert all(t.dtype == dtype for t in state.values() if isinstance(t, torch.Tensor))


@pytest.mark.parametrize("options", [{"nesterov": True}, {"clip": True}, {"eps": 1e-3}])
def test_lars_variants_follow_the_reference(triton_step, options):
    kind = KINDS["lars"]
    model = Model(torch.float32)
    opt = LARS([{"params": [getattr(model, n) for n in SHAPES]}], lr=0.8,
               trust_coefficient=0.02, **options)
    reference = Reference(kind, model, opt)
    run(model, opt, range(3))
    for step in range(3):
        reference.step(step)
    assert_weights(model, reference.weights, rtol=1e-5, atol=1e-5)
    assert opt._triton_plans  # the kernels stepped it


def make_lars(params: list[torch.Tensor], **options) -> LARS:
    return LARS(params, lr=0.5, trust_coefficient=0.01, weight_decay=1e-3, **options)


def fresh_and_viewed(dtype: torch.dtype = torch.float32) -> tuple[list, list]:
    gen = torch.Generator().manual_seed(1)
    shapes = [(3000,), (17, 31), (5,), (600, 2)]
    values = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
    fresh = [torch.nn.Parameter(v.clone()) for v in values]
    viewed = [torch.nn.Parameter(v) for v in odd_offset_views(values)]
    return fresh, viewed


@pytest.mark.parametrize("make", [make_lars, lambda ps: LAMB(ps, lr=0.01)], ids=["lars", "lamb"])
def test_the_same_bits_wherever_the_tensors_lie_and_run_after_run(triton_step, make):
    """Weights and gradients as views into one flat buffer at odd offsets step to the same bits
    as fresh tensors, and a second run repeats the first bit for bit."""
    results = []
    for _ in range(2):
        fresh, viewed = fresh_and_viewed()
        for params in (fresh, viewed):
            opt = make(params)
            for step in range(3):
                gen = torch.Generator().manual_seed(step)
                grads = [torch.randn(p.shape, generator=gen) for p in params]
                views = odd_offset_views(grads) if params is viewed else grads
                for p, g in zip(params, views, strict=True):
                    p.grad = g
                opt.step()
        results.append(([p.detach().clone() for p in fresh], [p.detach() for p in viewed]))
        for a, b in zip(*results[-1], strict=True):
            assert torch.equal(a, b)
    for a, b in zip(results[0][0], results[1][0], strict=True):
        assert torch.equal(a, b)


def test_channels_last_weights_step_as_contiguous_ones(triton_step):
    """Alike to rounding: the norms sum in memory order, which channels-last changes."""
    gen = torch.Generator().manual_seed(2)
    value, grad = torch.randn(8, 4, 5, 5, generator=gen), torch.randn(8, 4, 5, 5, generator=gen)
    plain = torch.nn.Parameter(value.clone())
    last = torch.nn.Parameter(value.clone().contiguous(memory_format=torch.channels_last))
    plain.grad, last.grad = grad.clone(), grad.contiguous(memory_format=torch.channels_last)
    for p in (plain, last):
        make_lars([p]).step()
    assert last.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(plain.detach(), last.detach(), rtol=1e-6, atol=1e-7)


def test_trust_ratios_match_the_eager_ones_and_zero_norms_give_one(triton_step):
    params = [torch.nn.Parameter(torch.randn(40, 30)), torch.nn.Parameter(torch.zeros(50)),
              torch.nn.Parameter(torch.randn(700))]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, q in zip(params, twins, strict=True):
        p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()))
        q.grad = p.grad.clone()
    opt, twin = make_lars(params), make_lars(twins)
    opt.step()
    with triton_step.disabled():
        twin.step()
    assert not twin._triton_plans[0] and opt._triton_plans[0]  # one path each
    ratios = opt.trust_ratios()
    assert ratios[1] == 1.0  # ‖w‖ = 0: Intel Caffe's rule
    torch.testing.assert_close(ratios, twin.trust_ratios(), rtol=1e-6, atol=0)
    for p, q in zip(params, twins, strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)


def test_what_the_kernels_do_not_take_goes_to_the_eager_step(triton_step):
    """float64, mixed strides (a column-major gradient) and CPU tensors outside the interpreter
    are not the kernels'."""
    w = torch.randn(6, 4)
    assert triton_step.supports([w], [torch.randn(6, 4)])
    assert not triton_step.supports([w.double()], [torch.randn(6, 4).double()])
    assert not triton_step.supports([w], [torch.randn(4, 6).t()])
    assert not triton_step.supports([w], [torch.randn(6, 4, dtype=torch.bfloat16)])


def test_outside_the_interpreter_only_cuda_tensors_are_stepped(triton_step, monkeypatch):
    assert native.triton_steps(torch.device("cpu")) is triton_step
    monkeypatch.delenv("TRITON_INTERPRET")
    assert native.triton_steps(torch.device("cpu")) is None
    assert native.triton_steps(torch.device("cuda")) is triton_step


def test_a_kernel_that_fails_to_build_warns_once_and_the_eager_step_takes_over(triton_step,
                                                                               monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no kernel for this GPU")

    monkeypatch.setattr(triton_step, "lars_step", broken)
    monkeypatch.setattr(triton_step, "_enabled", True)
    params = [torch.nn.Parameter(torch.randn(300))]
    twin = [torch.nn.Parameter(params[0].detach().clone())]
    opt, ref = make_lars(params), make_lars(twin)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(2):
            for p in (params[0], twin[0]):
                p.grad = torch.full((300,), 0.1 * (step + 1))
            opt.step()
            with triton_step.disabled():
                ref.step()
    said = [str(w.message) for w in caught if "Triton" in str(w.message)]
    assert len(said) == 1 and "no kernel for this GPU" in said[0]
    assert torch.equal(params[0].detach(), twin[0].detach())


def test_a_chunk_that_is_not_a_power_of_two_of_blocks_is_refused(triton_step):
    """A chunk ending inside a block would let its last block spill into the next chunk."""
    params = [torch.nn.Parameter(torch.randn(3000))]
    params[0].grad = torch.randn(3000)
    with pytest.raises(ValueError, match="power of two of at least 128"):
        triton_step.lars_step(params, [params[0].grad], [torch.zeros(3000)], lr=0.1,
                              momentum=0.9, weight_decay=0.0, trust_coefficient=0.01, eps=0.0,
                              clip=False, nesterov=False, lars=True, cache={}, chunk=384)


def test_per_tensor_step_counts_take_the_corrections_table(triton_step, monkeypatch):
    """A tensor that joined later (its own step count) steps as the reference, each with its
    own bias corrections."""
    kind = KINDS["lamb"]
    model = Model(torch.float32)
    opt = LAMB([{"params": [model.conv, model.wide, model.fc]}], lr=0.01)
    reference = Reference(kind, model, opt)
    model.fc.grad = None
    for step in range(3):
        grads = gradients(step)
        for name in ("conv", "wide", "fc"):
            if name != "fc" or step > 0:
                getattr(model, name).grad = grads[name].float()
        opt.step()
        for group, names in reference.groups:
            for n in names:
                if n != "fc" or step > 0:
                    reference.weights[n] = kind.reference(reference.weights[n], grads[n],
                                                          reference.states[n], group)
    assert [opt.state[p]["step"] for p in (model.conv, model.fc)] == [3, 2]
    for n in ("conv", "wide", "fc"):
        torch.testing.assert_close(getattr(model, n).detach().double(), reference.weights[n],
                                   rtol=1e-5, atol=1e-5)


# The kernels' arguments by name: pointer tables, the element type's pointer, float scalars.
ARGUMENT_TYPES = {**dict.fromkeys(["w_addr", "g_addr", "v_addr", "x_addr", "m_addr", "chunks",
                                   "numels", "firsts"], "*i64"),
                  **dict.fromkeys(["partial", "ratios", "corrections"], "*fp32"), "count": "i32",
                  **dict.fromkeys(["lr", "momentum", "weight_decay", "trust", "eps", "w1",
                                   "beta2", "w2", "r1", "r2"], "fp32")}


def kernel_variants(module):
    """Each kernel with each combination of its switches (constexprs)."""
    sizes = {"CHUNK": module.CHUNK, "BLOCK": module.BLOCK, "WIDEST": 64}
    switches = {module._lars_norms: [], module._lars_update: ["ADAPT", "CLIP", "NESTEROV"],
                module._lamb_moments: ["PER_TENSOR", "SMALL", "ADAPT"],
                module._lamb_apply: ["PER_TENSOR"]}
    for kernel, names in switches.items():
        for values in itertools.product((True, False), repeat=len(names)):
            yield kernel, {**{k: v for k, v in sizes.items() if k in kernel.arg_names},
                           **dict(zip(names, values, strict=True))}


@pytest.mark.skipif(INTERPRETED, reason="compiles, which the interpreter does not")
@pytest.mark.parametrize("element", ["fp32", "bf16", "fp16"])
def test_every_kernel_compiles_for_a_hopper_gpu(element):
    """Triton's compiler, not its interpreter, takes every kernel variant to sm_90 machine code
    (no GPU needed): what the interpreter accepts and the compiler would refuse shows here."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    from bigbatch.optim import triton_step as module
    target = GPUTarget("cuda", 90, 32)
    built = 0
    for kernel, constants in kernel_variants(module):
        types = {**ARGUMENT_TYPES, "like": f"*{element}"}
        signature = {name: "constexpr" if name in constants else types[name]
                     for name in kernel.arg_names}
        compiled = compile(ASTSource(fn=kernel, signature=signature, constexprs=constants),
                           target=target)
        assert "sm_90" in compiled.asm["ptx"] and compiled.asm.get("cubin")
        built += 1
    assert built == 1 + 8 + 8 + 2
