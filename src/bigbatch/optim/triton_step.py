"""The LARS and LAMB steps on a GPU as Triton kernels: two launches for all of a group's tensors.

The multi-tensor eager steps (``torch._foreach_*``) make some ten passes over the weights, the
gradients and the state, a launch for each; these kernels make two. Every tensor is cut into
``chunk``-element chunks by index, and each program of a launch takes one chunk, finding its
tensor's memory through a table of addresses (one row per role: weights, gradients, state):

1. the squared norms each chunk contributes (LARS: ‖w‖² and ‖g‖²; LAMB, which first updates the
   moments: ‖x‖² and ‖u‖²) into a buffer of partial sums, one pair a chunk (no atomics);
2. the update: each program sums its tensor's partials in a fixed order (the same reduction in
   every program), works out the trust ratio and updates its chunk. LAMB's u is recomputed there
   from the stored moments, the same operations on the same values, rather than kept.

So the norms, and the step, are a pure function of the values: the same bits every run, no
matter which program runs first; nothing waits for the host (the ratios stay on the device).
Arithmetic is in float32 (the tensors may be float32, bfloat16 or float16; LAMB rounds its
moments to their dtype before using them, as its eager step does), with correctly rounded square
roots and divisions. The steps match the eager ones to float32 rounding (tests/test_triton_step.py
holds both to float64 references of Algorithms 1 and 2).

Used by :class:`~bigbatch.optim.LARS` and :class:`~bigbatch.optim.LAMB` for CUDA tensors where
Triton is installed, unless ``BIGBATCH_TRITON_STEP=0``; a kernel that fails to build warns once
and the optimizers go back to their eager steps. With ``TRITON_INTERPRET=1`` Triton runs the
kernels on the CPU (how the tests run them).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from bigbatch.optim import native

CHUNK = 65536  # elements a program (a ResNet-50 step: about 550 programs a launch)
BLOCK = 1024  # elements an iteration of a program's loop
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SWITCH = "BIGBATCH_TRITON_STEP"
_enabled = os.environ.get(SWITCH, "1") != "0"


def interpreting() -> bool:
    """Whether Triton runs its kernels on the CPU (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def supports(*lists: list[Tensor]) -> bool:
    """Whether the kernels can step these tensors: switched on, one float32/bfloat16/float16
    dtype, on a CUDA device (the CPU when interpreting), each position's tensors of one shape
    and dense with the same strides, and no CUDA graph being captured (a step's tables come
    from the host)."""
    device = "cpu" if interpreting() else "cuda"
    if not (_enabled and native.same_dense_layout(*lists, dtypes=DTYPES, device_type=device)):
        return False
    return device == "cpu" or not torch.cuda.is_current_stream_capturing()


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Within the block, LARS and LAMB take their eager steps (to compare the two)."""
    global _enabled
    enabled, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = enabled


def enabled() -> bool:
    """Whether the kernels are on (not switched off, nor given up on)."""
    return _enabled


# What a kernel that cannot be built or launched here raises (the driver's "no kernel image for
# this device" is a RuntimeError); a step that raises one has written nothing (see lamb_step).
BUILD_ERRORS = (triton.CompilationError, triton.runtime.errors.TritonError, RuntimeError)


def give_up(error: Exception) -> None:
    """Switch the kernels off for this process, saying why once (the caller then steps eagerly);
    out-of-memory is raised as it came."""
    if isinstance(error, torch.OutOfMemoryError):
        raise error
    global _enabled
    _enabled = False
    warnings.warn(f"the Triton LARS/LAMB step failed ({type(error).__name__}: {error}); "
                  f"stepping with the multi-tensor path from now on (set {SWITCH}=0 to skip it)",
                  RuntimeWarning, stacklevel=3)


@dataclass(frozen=True)
class Plan:
    """The device tables of one list of tensors: ``addresses`` (roles × tensors), ``chunks``
    (tensor, start) pairs, ``numels``, ``firsts`` (each tensor's first chunk, and the total)."""

    addresses: Tensor
    chunks: Tensor
    numels: Tensor
    firsts: Tensor
    count: int
    total: int
    widest: int  # the most chunks one tensor has, as a power of two (a reduction's width)


def plan(roles: tuple[list[Tensor], ...], chunk: int, cache: dict) -> Plan:
    """The tables for these tensors, from ``cache`` while their addresses stay the same."""
    key = (chunk, roles[0][0].device,
           *[(t.data_ptr(), t.numel()) for tensors in roles for t in tensors])
    if cache.get("key") != key:
        cache.clear()
        cache["key"], cache["plan"] = key, _make_plan(roles, chunk)
    return cache["plan"]


def _make_plan(roles: tuple[list[Tensor], ...], chunk: int) -> Plan:
    if chunk < BLOCK or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two of at least {BLOCK}, got {chunk}")
    numels = [t.numel() for t in roles[0]]
    counts = [max(1, -(-n // chunk)) for n in numels]
    firsts = [0]
    for c in counts:
        firsts.append(firsts[-1] + c)
    chunks = [value for t, c in enumerate(counts) for k in range(c) for value in (t, k * chunk)]
    device = roles[0][0].device

    def table(values: list[int]) -> Tensor:
        return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)

    return Plan(table([t.data_ptr() for tensors in roles for t in tensors]), table(chunks),
                table(numels), table(firsts), len(numels), firsts[-1],
                max(2, triton.next_power_of_2(max(counts))))


def _on(device: torch.device) -> contextlib.AbstractContextManager:
    """Triton launches on the current CUDA device: make it the tensors'."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


@torch.compiler.disable  # the kernels write through addresses a traced graph cannot see
def lars_step(params: list[Tensor], grads: list[Tensor], bufs: list[Tensor], *, lr: float,
              momentum: float, weight_decay: float, trust_coefficient: float, eps: float,
              clip: bool, nesterov: bool, lars: bool, cache: dict,
              chunk: int | None = None) -> Tensor | None:
    """One LARS step (Algorithm 1, as :mod:`bigbatch.optim.lars`) of the tensors in place; the
    trust ratios (float32, on the device) if ``lars``; ``chunk``: elements a program (CHUNK, a
    power of two of at least BLOCK). Only the second launch writes the tensors."""
    chunk = chunk or CHUNK
    tables = plan((params, grads, bufs), chunk, cache)
    count, device = tables.count, params[0].device
    w, g, v = (tables.addresses[k * count:(k + 1) * count] for k in range(3))
    partial = torch.empty(2 * tables.total, dtype=torch.float32, device=device)
    ratios = torch.empty(count, dtype=torch.float32, device=device)
    settings = dict(chunks=tables.chunks, numels=tables.numels, CHUNK=chunk, BLOCK=BLOCK)
    with _on(device):
        if lars:
            _lars_norms[(tables.total,)](w, g, params[0], partial=partial, **settings)
        _lars_update[(tables.total,)](
            w, g, v, params[0], firsts=tables.firsts, partial=partial, ratios=ratios,
            lr=float(lr), momentum=float(momentum), weight_decay=float(weight_decay),
            trust=float(trust_coefficient), eps=float(eps), ADAPT=lars, CLIP=clip,
            NESTEROV=nesterov, WIDEST=tables.widest, **settings)
    torch.autograd.graph.increment_version(params + bufs)  # written behind autograd's back
    return ratios if lars else None


@torch.compiler.disable
def lamb_step(params: list[Tensor], grads: list[Tensor], avgs: list[Tensor],
              avg_sqs: list[Tensor], r1: list[float], r2: list[float], *, lr: float,
              betas: tuple[float, float], eps: float, weight_decay: float, lars: bool,
              cache: dict, chunk: int | None = None) -> None:
    """One LAMB step (Algorithm 2, as :mod:`bigbatch.optim.lamb`) of the tensors in place, with
    each tensor's reciprocal bias corrections r1 = 1/(1 − β₁ᵗ) and r2 = 1/√(1 − β₂ᵗ).

    The first launch writes the moments, so both kernels are built before it (a kernel that
    cannot be built raises before anything is written). Where every tensor has one step count
    (the usual case) the corrections are launch arguments; else a table copied each step.
    """
    chunk = chunk or CHUNK
    tables = plan((params, grads, avgs, avg_sqs), chunk, cache)
    count, device = tables.count, params[0].device
    x, g, m, v = (tables.addresses[k * count:(k + 1) * count] for k in range(4))
    partial = torch.empty(2 * tables.total, dtype=torch.float32, device=device)
    uniform = len(set(r1)) == 1 and len(set(r2)) == 1
    corrections = partial if uniform else torch.tensor(
        [*r1, *r2], dtype=torch.float32).to(device, non_blocking=True)
    beta1, beta2 = (float(beta) for beta in betas)
    common = dict(chunks=tables.chunks, numels=tables.numels, corrections=corrections,
                  count=count, r1=float(r1[0]), r2=float(r2[0]), eps=float(eps),
                  weight_decay=float(weight_decay), lr=float(lr), PER_TENSOR=not uniform,
                  CHUNK=chunk, BLOCK=BLOCK)
    first = dict(partial=partial, w1=1.0 - beta1, beta2=beta2, w2=1.0 - beta2,
                 SMALL=1.0 - beta1 < 0.5, ADAPT=lars, **common)
    second = dict(firsts=tables.firsts, partial=partial, WIDEST=tables.widest, **common)
    grid = (tables.total,)
    # What selects a compiled kernel (the plan's widest reduction is in the cache's key).
    variant = (lars, first["SMALL"], uniform, params[0].dtype, params[0].data_ptr() % 16)
    with _on(device):
        if lars and not interpreting() and cache.get("built") != variant:
            _lamb_moments.warmup(x, g, m, v, params[0], grid=grid, **first)
            _lamb_apply.warmup(x, m, v, params[0], grid=grid, **second)
            cache["built"] = variant
        _lamb_moments[grid](x, g, m, v, params[0], **first)
        if lars:
            _lamb_apply[grid](x, m, v, params[0], **second)
    torch.autograd.graph.increment_version(params + avgs + avg_sqs)


# --- the kernels --------------------------------------------------------------------------------


@triton.jit
def _chunk(chunks, numels, CHUNK: tl.constexpr):
    """This program's chunk: its tensor, its first element and its length (CHUNK, or what is
    left of the tensor)."""
    c = tl.program_id(0)
    t = tl.load(chunks + 2 * c)
    start = tl.load(chunks + 2 * c + 1)
    return t, start, tl.minimum(tl.load(numels + t) - start, CHUNK)


@triton.jit
def _tensor_sums(partial, firsts, t, WIDEST: tl.constexpr):
    """The two sums of tensor t's chunks' partials, in one fixed order."""
    first = tl.load(firsts + t)
    j = tl.arange(0, WIDEST)
    inside = j < tl.load(firsts + t + 1) - first
    a = tl.sum(tl.load(partial + 2 * (first + j), mask=inside, other=0.0), axis=0)
    b = tl.sum(tl.load(partial + 2 * (first + j) + 1, mask=inside, other=0.0), axis=0)
    return a, b


@triton.jit
def _store_sums(partial, a, b):
    """This program's two partial sums (of the lanes of ``a`` and of ``b``), in their slots."""
    c = tl.program_id(0)
    tl.store(partial + 2 * c, tl.sum(a, axis=0))
    tl.store(partial + 2 * c + 1, tl.sum(b, axis=0))


@triton.jit
def _corrections(corrections, count, t, r1, r2, PER_TENSOR: tl.constexpr):
    """Tensor t's bias corrections: its row of the table, or the launch's own."""
    if PER_TENSOR:
        r1 = tl.load(corrections + t)
        r2 = tl.load(corrections + count + t)
    return r1, r2


@triton.jit
def _lars_norms(w_addr, g_addr, like, chunks, numels, partial, CHUNK: tl.constexpr,
                BLOCK: tl.constexpr):
    t, start, n = _chunk(chunks, numels, CHUNK)
    w = tl.load(w_addr + t).to(like.dtype)
    g = tl.load(g_addr + t).to(like.dtype)
    acc_w = tl.zeros([BLOCK], tl.float32)
    acc_g = tl.zeros([BLOCK], tl.float32)
    for off in range(0, n, BLOCK):
        i = start + off + tl.arange(0, BLOCK)
        inside = i < start + n
        x = tl.load(w + i, mask=inside, other=0.0).to(tl.float32)
        y = tl.load(g + i, mask=inside, other=0.0).to(tl.float32)
        acc_w += x * x
        acc_g += y * y
    _store_sums(partial, acc_w, acc_g)


@triton.jit
def _lars_update(w_addr, g_addr, v_addr, like, chunks, numels, firsts, partial, ratios, lr,
                 momentum, weight_decay, trust, eps, ADAPT: tl.constexpr, CLIP: tl.constexpr,
                 NESTEROV: tl.constexpr, WIDEST: tl.constexpr, CHUNK: tl.constexpr,
                 BLOCK: tl.constexpr):
    t, start, n = _chunk(chunks, numels, CHUNK)
    ratio = 1.0
    if ADAPT:  # λ = η‖w‖ / (‖g‖ + β‖w‖ + eps), 1 where a norm is 0; min(λ, 1) with CLIP
        w2, g2 = _tensor_sums(partial, firsts, t, WIDEST)
        wn = tl.sqrt_rn(w2)
        gn = tl.sqrt_rn(g2)
        ratio = tl.where((wn > 0) & (gn > 0),
                         tl.div_rn(trust * wn, gn + weight_decay * wn + eps), 1.0)
        if CLIP:
            ratio = tl.minimum(ratio, 1.0)
        if start == 0:
            tl.store(ratios + t, ratio)
    cg = lr * ratio
    cw = cg * weight_decay
    w = tl.load(w_addr + t).to(like.dtype)
    g = tl.load(g_addr + t).to(like.dtype)
    v = tl.load(v_addr + t).to(like.dtype)
    for off in range(0, n, BLOCK):
        i = start + off + tl.arange(0, BLOCK)
        inside = i < start + n
        x = tl.load(w + i, mask=inside).to(tl.float32)
        y = tl.load(g + i, mask=inside).to(tl.float32)
        b = momentum * tl.load(v + i, mask=inside).to(tl.float32) + cg * y + cw * x
        if NESTEROV:
            x = x - (momentum * b + cg * y + cw * x)
        else:
            x = x - b
        tl.store(v + i, b.to(like.dtype.element_ty), mask=inside)
        tl.store(w + i, x.to(like.dtype.element_ty), mask=inside)


@triton.jit
def _adam_direction(x, m, v, r1, r2, eps, weight_decay):
    """u = (m · r1) / (√v · r2 + ε) + λ·x, one division an element (the eager step's order)."""
    return tl.div_rn(m * r1, tl.sqrt_rn(v) * r2 + eps) + weight_decay * x


@triton.jit
def _lamb_moments(x_addr, g_addr, m_addr, v_addr, like, chunks, numels, partial, corrections,
                  count, r1, r2, lr, w1, beta2, w2, eps, weight_decay, PER_TENSOR: tl.constexpr,
                  SMALL: tl.constexpr, ADAPT: tl.constexpr, CHUNK: tl.constexpr,
                  BLOCK: tl.constexpr):
    """The moments, and ‖x‖², ‖u‖² into the partials (ADAPT); without ADAPT also x ← x − η·u."""
    t, start, n = _chunk(chunks, numels, CHUNK)
    r1, r2 = _corrections(corrections, count, t, r1, r2, PER_TENSOR)
    xp = tl.load(x_addr + t).to(like.dtype)
    gp = tl.load(g_addr + t).to(like.dtype)
    mp = tl.load(m_addr + t).to(like.dtype)
    vp = tl.load(v_addr + t).to(like.dtype)
    acc_x = tl.zeros([BLOCK], tl.float32)
    acc_u = tl.zeros([BLOCK], tl.float32)
    for off in range(0, n, BLOCK):
        i = start + off + tl.arange(0, BLOCK)
        inside = i < start + n
        x = tl.load(xp + i, mask=inside, other=0.0).to(tl.float32)
        g = tl.load(gp + i, mask=inside, other=0.0).to(tl.float32)
        m = tl.load(mp + i, mask=inside, other=0.0).to(tl.float32)
        if SMALL:  # torch.lerp's two forms, by the weight w1 = 1 − β₁'s size
            m = m + w1 * (g - m)
        else:
            m = g - (g - m) * (1.0 - w1)
        v = beta2 * tl.load(vp + i, mask=inside, other=0.0).to(tl.float32) + w2 * g * g
        m = m.to(like.dtype.element_ty)
        v = v.to(like.dtype.element_ty)
        tl.store(mp + i, m, mask=inside)
        tl.store(vp + i, v, mask=inside)
        u = _adam_direction(x, m.to(tl.float32), v.to(tl.float32), r1, r2, eps, weight_decay)
        if ADAPT:
            u = tl.where(inside, u, 0.0)
            acc_x += x * x
            acc_u += u * u
        else:
            tl.store(xp + i, (x - lr * u).to(like.dtype.element_ty), mask=inside)
    if ADAPT:
        _store_sums(partial, acc_x, acc_u)


@triton.jit
def _lamb_apply(x_addr, m_addr, v_addr, like, chunks, numels, firsts, partial, corrections,
                count, r1, r2, lr, eps, weight_decay, PER_TENSOR: tl.constexpr,
                WIDEST: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """x ← x − η·(‖x‖/‖u‖)·u, u recomputed from the stored moments (1 where a norm is 0)."""
    t, start, n = _chunk(chunks, numels, CHUNK)
    x2, u2 = _tensor_sums(partial, firsts, t, WIDEST)
    xn = tl.sqrt_rn(x2)
    un = tl.sqrt_rn(u2)
    coef = -lr * tl.where((xn > 0) & (un > 0), tl.div_rn(xn, un), 1.0)
    r1, r2 = _corrections(corrections, count, t, r1, r2, PER_TENSOR)
    xp = tl.load(x_addr + t).to(like.dtype)
    mp = tl.load(m_addr + t).to(like.dtype)
    vp = tl.load(v_addr + t).to(like.dtype)
    for off in range(0, n, BLOCK):
        i = start + off + tl.arange(0, BLOCK)
        inside = i < start + n
        x = tl.load(xp + i, mask=inside).to(tl.float32)
        m = tl.load(mp + i, mask=inside).to(tl.float32)
        v = tl.load(vp + i, mask=inside).to(tl.float32)
        u = _adam_direction(x, m, v, r1, r2, eps, weight_decay)
        tl.store(xp + i, (x + coef * u).to(like.dtype.element_ty), mask=inside)

