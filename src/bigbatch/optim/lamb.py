"""LAMB: layer-wise adaptive moments, Algorithm 2 of You et al., "Large Batch Optimization for Deep
Learning: Training BERT in 76 Minutes" (ICLR 2020).

For every parameter tensor x with gradient g at step t (t = 1, 2, ...), LR η (``group["lr"]``, set
each step by the schedule), β₁, β₂, ε and weight decay λ:

    m ← β₁·m + (1 − β₁)·g             v ← β₂·v + (1 − β₂)·g²
    r = m̂ / (√v̂ + ε)                  m̂ = m / (1 − β₁ᵗ), v̂ = v / (1 − β₂ᵗ)
    u = r + λ·x
    x ← x − η · φ(‖x‖) / ‖u‖ · u      φ the identity; the ratio is 1 if ‖x‖ = 0 or ‖u‖ = 0

A group with ``lars=False`` (the key :func:`bigbatch.optim.parameter_groups` sets for BatchNorm
and bias tensors) takes the step without the ratio (x ← x − η·u), as LARS's excluded group does.

Implementation. On CPU, float32/float64 tensors go through a compiled kernel
(:mod:`bigbatch.optim.lamb_kernel`, built by ``pip install``): per cache-sized bucket, the moments,
u and the norms of x and u in one pass, the scaled update in a second. On a CUDA device with
Triton installed, two Triton kernels take the whole group (the moments and the norms, then the
update: :mod:`bigbatch.optim.triton_step`). Elsewhere, and where neither kernel can run, the step
is multi-tensor (``torch._foreach_*``) and free of host synchronisation: the ratios stay on the
device, the bias corrections come from a host-side step count; on CPU in the same cache-sized
buckets. Both CPU paths give the same bits for the same values wherever the tensors lie in
memory; they differ from each other in the last bits (their norms sum in different orders,
PyTorch's vectorized loops fuse some multiply-adds, and PyTorch's CPU square root is off by an ulp
for about one float32 value in six, where the kernel's is correctly rounded).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from bigbatch.optim import lamb_kernel, native
from bigbatch.optim.base import Optimizer
from bigbatch.optim.lars import _bucket_bounds, _bucket_limit

# Group keys that parametrise the update (the rest, e.g. "names", ride along untouched).
# What the compiled update's graph bakes in: changing one recompiles (the LR does not).
_GRAPH_KEYS = ("betas", "eps", "weight_decay", "lars")
_UPDATE_KEYS = ("lr", *_GRAPH_KEYS)


class LAMB(Optimizer):
    """LAMB optimizer (Algorithm 2 of the LAMB paper, φ the identity).

    Args:
        params: parameters or parameter-group dicts (group keys override the defaults; unknown
            keys such as ``"names"`` ride along).
        lr: η (the schedule overwrites ``group["lr"]`` every step).
        betas: (β₁, β₂), default (0.9, 0.999).
        eps: ε, added to √v̂, default 1e-6.
        weight_decay: λ, default 0.01, added to the Adam step before the trust ratio.
        lars: group key, default True; False skips the trust ratio for the group's tensors.
        fused_compile: default False (also a group key). Run the group's update through
            ``torch.compile`` (on a GPU: a few fused kernels in place of some twenty multi-tensor
            launches; a one-off compile first), the LR and the bias corrections passed as
            tensors so that neither the schedule nor the step count recompiles it. Matches the
            eager step to float32 rounding (the fused arithmetic rounds differently).
        bucket_bytes: cache-blocking size on CPU (as for LARS), None: 4 MiB on CPU.

    State per parameter: ``exp_avg`` (m), ``exp_avg_sq`` (v), ``step`` (t, a host integer); m
    and v in the parameter's dtype, as PyTorch's optimizers keep them. With float16 parameters,
    (1 − β₂)·g² under 3e-8 (half float16's smallest value: |g| under 5.5e-3 at β₂ = 0.999) is
    stored as v = 0 and that element's step becomes m̂/ε: keep float32 weights (and compute in
    bf16 under autocast) or use bfloat16 parameters, whose range is float32's.
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01, *, fused_compile: bool = False,
                 bucket_bytes: int | None = None) -> None:
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, lars=True,
                        fused_compile=fused_compile, bucket_bytes=bucket_bytes)
        super().__init__(params, defaults)
        for group in self.param_groups:
            _check_hyperparameters(group)
        self._compiled: Callable[..., None] | None = None

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One LAMB step over every group; returns the closure's loss if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_gradients()
        for index, group in enumerate(self.param_groups):
            params, grads, avgs, avg_sqs, steps = self._tensors_with_grad(group)
            if not params:
                continue
            if group["fused_compile"]:
                self._compiled_update(params, grads, avgs, avg_sqs, steps, group)
                continue
            limit = _bucket_limit(group, params[0].device)
            if limit is not None and lamb_kernel.supports(params, grads, avgs, avg_sqs):
                lamb_kernel.step(params, grads, avgs, avg_sqs, steps, bucket_bytes=limit,
                                 scratch=self.__dict__.setdefault("_kernel_scratch", {}),
                                 **{key: group[key] for key in _UPDATE_KEYS})
                continue
            if self._triton_step(index, params, grads, avgs, avg_sqs, steps, group):
                continue
            for lo, hi in _bucket_bounds(params, limit):
                _bucket_update(params[lo:hi], grads[lo:hi], avgs[lo:hi], avg_sqs[lo:hi],
                               steps[lo:hi], group)
        return loss

    def _triton_step(self, index: int, params: list[Tensor], grads: list[Tensor],
                     avgs: list[Tensor], avg_sqs: list[Tensor], steps: list[int],
                     group: dict[str, Any]) -> bool:
        """Group ``index``'s step through the GPU's Triton kernels; False where they cannot take
        it (another device, Triton missing, a kernel that failed to build: then the eager step)."""
        kernels = native.triton_steps(params[0].device)
        if kernels is None or not kernels.supports(params, grads, avgs, avg_sqs):
            return False
        plans = self.__dict__.setdefault("_triton_plans", collections.defaultdict(dict))
        try:
            kernels.lamb_step(params, grads, avgs, avg_sqs,
                              *_bias_corrections(group["betas"], steps), cache=plans[index],
                              **{key: group[key] for key in _UPDATE_KEYS})
        except kernels.BUILD_ERRORS as error:  # warned once, then the eager step
            kernels.give_up(error)
            return False
        return True

    def _tensors_with_grad(self, group: dict[str, Any]) -> tuple[list[Any], ...]:
        params, grads, avgs, avg_sqs, steps = [], [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] += 1
            params.append(p)
            grads.append(p.grad)
            avgs.append(state["exp_avg"])
            avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        return params, grads, avgs, avg_sqs, steps

    def _compiled_update(self, params: list[Tensor], grads: list[Tensor], avgs: list[Tensor],
                         avg_sqs: list[Tensor], steps: list[int], group: dict[str, Any]) -> None:
        """:func:`_lamb_update` through ``torch.compile`` over the whole group (it fuses per
        tensor by itself), the step-dependent numbers as tensors copied to the device."""
        if self._compiled is None:
            self._compiled = torch.compile(_lamb_update, fullgraph=True, dynamic=False)
        numbers = torch.tensor([*_bias_corrections(group["betas"], steps),
                                [group["lr"]] * len(steps)],
                               dtype=torch.promote_types(params[0].dtype, torch.float32))
        r1, r2, lr = numbers.to(params[0].device, non_blocking=True)
        self._compiled(params, grads, avgs, avg_sqs, list(r1.unbind(0)), list(r2.unbind(0)),
                       lr[0], **{key: group[key] for key in _GRAPH_KEYS})


def _check_hyperparameters(group: dict[str, Any]) -> None:
    beta1, beta2 = group["betas"]
    if not group["lr"] >= 0.0:
        raise ValueError(f"LAMB lr must be >= 0, got {group['lr']}")
    if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
        raise ValueError(f"LAMB betas must be in [0, 1), got {group['betas']}")
    if not group["eps"] > 0.0:
        raise ValueError(f"LAMB eps must be > 0, got {group['eps']}")
    if not group["weight_decay"] >= 0.0:
        raise ValueError(f"LAMB weight_decay must be >= 0, got {group['weight_decay']}")


def _bucket_update(params: list[Tensor], grads: list[Tensor], avgs: list[Tensor],
                   avg_sqs: list[Tensor], steps: list[int], group: dict[str, Any]) -> None:
    """Algorithm 2 on a list of same-device, same-dtype tensors."""
    _lamb_update(params, grads, avgs, avg_sqs, *_bias_corrections(group["betas"], steps),
                 group["lr"], **{key: group[key] for key in _GRAPH_KEYS})


def _bias_corrections(betas: tuple[float, float],
                      steps: list[int]) -> tuple[list[float], list[float]]:
    """r1 = 1/(1 − β₁ᵗ) and r2 = 1/√(1 − β₂ᵗ) of each tensor's step count t."""
    beta1, beta2 = betas
    return ([1.0 / (1.0 - beta1**t) for t in steps],
            [1.0 / math.sqrt(1.0 - beta2**t) for t in steps])


def _lamb_update(params: list[Tensor], grads: list[Tensor], avgs: list[Tensor],
                 avg_sqs: list[Tensor], r1: list[float] | list[Tensor],
                 r2: list[float] | list[Tensor], lr: float | Tensor, *,
                 betas: tuple[float, float], eps: float, weight_decay: float,
                 lars: bool) -> None:
    """Algorithm 2 with the reciprocal bias corrections r1 = 1/(1 − β₁ᵗ), r2 = 1/√(1 − β₂ᵗ), one
    per tensor: Python numbers in the eager step, 0-d tensors (as is the LR) in the compiled one,
    which is then traced once for the whole run."""
    beta1, beta2 = betas
    torch._foreach_lerp_(avgs, grads, 1.0 - beta1)
    torch._foreach_mul_(avg_sqs, beta2)
    torch._foreach_addcmul_(avg_sqs, grads, grads, value=1.0 - beta2)
    # r = (m · r1) / (√v · r2 + ε): one division an element
    denom = torch._foreach_sqrt(avg_sqs)
    torch._foreach_mul_(denom, r2)
    torch._foreach_add_(denom, eps)
    update = torch._foreach_mul(avgs, r1)
    torch._foreach_div_(update, denom)
    if weight_decay != 0.0:
        torch._foreach_add_(update, params, alpha=weight_decay)
    if lars:
        ratios = lamb_trust_ratio(torch.stack(torch._foreach_norm(params)),
                                  torch.stack(torch._foreach_norm(update)))
        torch._foreach_mul_(update, (ratios * -lr).unbind(0))
    else:
        torch._foreach_mul_(update, -lr)
    torch._foreach_add_(params, update)


def lamb_trust_ratio(w_norm: Tensor, u_norm: Tensor) -> Tensor:
    """φ(‖x‖)/‖u‖ with φ the identity, and 1 where ‖x‖ = 0 or ‖u‖ = 0 (no host sync)."""
    ratio = w_norm / u_norm
    return torch.where((w_norm > 0) & (u_norm > 0), ratio, torch.ones_like(ratio))
