"""LARS: layer-wise adaptive rate scaling, with the semantics of Algorithm 1 of the LARS paper.

You, Gitman & Ginsburg, "Large Batch Training of Convolutional Networks" (2017), Algorithm 1, as
used by "ImageNet Training in Minutes" (You et al. 2018). For every parameter tensor w with
gradient g, global LR γ (``group["lr"]``, set each step by the schedule), momentum m, weight
decay β and trust coefficient η:

    λ = η·‖w‖ / (‖g‖ + β·‖w‖ + eps)          trust ratio (local LR); λ = 1 if ‖w‖ = 0 or ‖g‖ = 0
    v ← m·v + γ·λ·(g + β·w)                  LR *inside* the momentum buffer
    w ← w − v

The ``λ = 1`` rule for zero norms is Intel Caffe's (the authors' release); it lets a
zero-initialised tensor start moving and never divides by zero. A group with ``lars=False`` runs
the same update with λ = 1 (plain momentum SGD, LR inside the buffer): that is how BatchNorm and
bias tensors are excluded from adaptation (see :func:`bigbatch.optim.parameter_groups`).

Because the LR is inside the buffer, v carries the LRs of the steps that built it: a step at
γ = 0 still moves w by m·v (then m²·v, ...), and a change of γ acts on new contributions only.
PyTorch's SGD and timm's ``Lars`` keep the LR outside (``v ← m·v + g'``; ``w ← w − γ·v``), where
γ = 0 stops the weights at once and a change of γ rescales the whole buffer.

Implementation. On CPU, float32/float64 tensors go through a compiled kernel
(:mod:`bigbatch.optim.lars_kernel`, built by ``pip install``): per cache-sized bucket, the norms
and then the update in one pass each. On a CUDA device with Triton installed, two Triton kernels
take the whole group (the norms, then the update: :mod:`bigbatch.optim.triton_step`).
Elsewhere, and where neither kernel can run, the step is multi-tensor (``torch._foreach_*``)
and free of host synchronisation — the trust ratios stay on the device and enter the update as
0-d tensors, the zero-norm rule is a ``torch.where``; on CPU in the same cache-sized buckets.
Both CPU paths give the same bits for the same values wherever the tensors lie in memory (a view
into a DDP bucket at any offset or a fresh tensor); they differ from each other in the last bits
(their norms sum in different orders).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import Tensor

from bigbatch.lars_defaults import LARS_DEFAULTS
from bigbatch.optim import lars_kernel, native
from bigbatch.optim.base import Optimizer

# One bucket's working set is ~3x this (weights, grads, momentum buffers): it stays in a typical
# L3 between the bucket's six passes. 1-8 MiB measured alike on ResNet-50 (docs/results).
_CPU_BUCKET_BYTES = 4 * 2**20

# Group keys that parametrise the update (the rest, e.g. "names", ride along untouched).
_UPDATE_KEYS = ("lr", "momentum", "weight_decay", "trust_coefficient", "eps", "clip", "nesterov",
                "lars")


class LARS(Optimizer):
    """LARS / LARC optimizer (Algorithm 1 of the LARS paper by default).

    Args:
        params: parameters or parameter-group dicts. Group keys override the defaults below;
            unknown keys (e.g. ``"names"`` from :func:`parameter_groups`) are kept and ignored.
        lr: global learning rate γ, default 1.0 (the schedule overwrites ``group["lr"]`` every
            step). γ = 0 still moves the weights by the momentum of earlier steps (module doc).
        momentum: m, default 0.9.
        weight_decay: β, default 5e-4; added to the gradient *before* the trust-ratio scaling
            and also part of the ratio's denominator, as in Algorithm 1.
        trust_coefficient: η, default 0.001 (the paper keeps it fixed for every batch size).
        eps: added to the ratio's denominator, default 0.0 (the paper has none; the zero-norm
            rule already avoids division by zero).
        clip: LARC clipping, default False. With ``clip=True`` the local rate is min(λ, 1), so
            the effective LR of a tensor is ``min(γ, γ·λ)``: LARS can only lower a layer's rate,
            never raise it above the global one. (NVIDIA apex's LARC clip scales the gradient
            by ``min(λ/γ, 1)`` instead, an effective LR of ``min(λ, γ)``: a different rule.)
        nesterov: Nesterov momentum in the same LR-inside-momentum form, default False:
            ``v ← m·v + γλ(g + βw); w ← w − (m·v + γλ(g + βw))``.
        lars: group key, default True. ``lars=False`` means λ = 1 (plain momentum SGD with the
            group's own weight decay, LR inside the buffer).
        fused_compile: default False (also a group key). Run the update of ``lars=True`` groups
            through ``torch.compile`` (one fused loop per tensor instead of several passes).
            The first step compiles (about a minute for ResNet-50 on a 2-core CPU); the LR enters
            as a 0-d tensor, so schedule changes do not recompile.
        bucket_bytes: cache-blocking size in bytes of parameters per bucket (also a group key).
            None (default): 4 MiB on CPU; whole groups on other devices, where the number of
            kernel launches matters more than cache reuse.

    State per parameter: ``momentum_buffer`` (created as zeros on the first step, i.e. v₀ = 0).
    Parameters whose ``grad`` is None are skipped; ``p.grad`` is never modified.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = LARS_DEFAULTS.lr,
        momentum: float = LARS_DEFAULTS.momentum,
        weight_decay: float = LARS_DEFAULTS.weight_decay,
        trust_coefficient: float = LARS_DEFAULTS.trust_coefficient,
        eps: float = LARS_DEFAULTS.eps,
        clip: bool = LARS_DEFAULTS.clip,
        nesterov: bool = LARS_DEFAULTS.nesterov,
        *,
        fused_compile: bool = LARS_DEFAULTS.fused_compile,
        bucket_bytes: int | None = None,
    ) -> None:
        _check_hyperparameters(lr, momentum, weight_decay, trust_coefficient, eps, nesterov)
        if bucket_bytes is not None and bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive or None, got {bucket_bytes}")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                        trust_coefficient=trust_coefficient, eps=eps, clip=clip,
                        nesterov=nesterov, lars=True, fused_compile=fused_compile,
                        bucket_bytes=bucket_bytes)
        super().__init__(params, defaults)
        for group in self.param_groups:
            _check_hyperparameters(group["lr"], group["momentum"], group["weight_decay"],
                                   group["trust_coefficient"], group["eps"], group["nesterov"])
        self._init_runtime_caches()

    def _init_runtime_caches(self) -> None:
        """Per-process helpers, not part of the optimizer's state (pickling drops them)."""
        self._ratio_parts: list[Tensor] = []
        self._ratio_params: list[Tensor] = []
        self._compiled: Callable[..., Tensor | None] | None = None
        self._lr_tensors: dict[tuple[torch.device, torch.dtype], Tensor] = {}
        self._triton_plans: collections.defaultdict[int, dict] = collections.defaultdict(dict)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            for key in ("lars", "fused_compile", "bucket_bytes"):
                group.setdefault(key, self.defaults.get(key, key == "lars"))
        self._init_runtime_caches()

    def trust_ratios(self) -> Tensor | None:
        """Local rates applied at the last step to the ``lars=True`` tensors that had a gradient.

        1-D, in parameter order (groups in order), on the parameters' device, in float32 or the
        widest parameter dtype; λ after the zero-norm rule and, with ``clip=True``, after
        clipping. None before the first step (and after ``load_state_dict``). Reading it costs
        no host synchronisation.
        """
        if not self._ratio_parts:
            return None
        device = self._ratio_parts[0].device
        return torch.cat([r.to(device, non_blocking=True) for r in self._ratio_parts])

    def trust_ratio_parameters(self) -> list[Tensor]:
        """The parameters that ``trust_ratios()`` describes, in the same order."""
        return list(self._ratio_params)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._ratio_parts = []
        self._ratio_params = []

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One LARS step over every group (Algorithm 1); returns the closure's loss if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_gradients()
        ratio_parts: list[Tensor] = []
        ratio_params: list[Tensor] = []
        for index, group in enumerate(self.param_groups):
            params, grads, bufs = self._tensors_with_grad(group)
            if not params:
                continue
            compiled = group["fused_compile"] and group["lars"]
            # The compiled graph fuses per tensor by itself: it only needs one device and dtype.
            limit = None if compiled else _bucket_limit(group, params[0].device)
            if not compiled and limit is not None and lars_kernel.supports(params, grads, bufs):
                ratios = lars_kernel.step(params, grads, bufs, bucket_bytes=limit,
                                          **_update_options(group))
                if ratios is not None:
                    ratio_parts.append(ratios)
                    ratio_params.extend(params)
                continue
            if not compiled and self._triton_step(index, params, grads, bufs, group,
                                                  ratio_parts, ratio_params):
                continue
            for lo, hi in _bucket_bounds(params, limit):
                update = self._compiled_update if compiled else _bucket_update
                ratios = update(params[lo:hi], grads[lo:hi], bufs[lo:hi],
                                **_update_options(group))
                if ratios is not None:
                    ratio_parts.append(ratios)
                    ratio_params.extend(params[lo:hi])
        self._ratio_parts = ratio_parts
        self._ratio_params = ratio_params
        return loss

    def _triton_step(self, index: int, params: list[Tensor], grads: list[Tensor],
                     bufs: list[Tensor], group: dict[str, Any], ratio_parts: list[Tensor],
                     ratio_params: list[Tensor]) -> bool:
        """Group ``index``'s step through the GPU's Triton kernels; False where they cannot take
        it (another device, Triton missing, a kernel that failed to build: then the eager step)."""
        kernels = native.triton_steps(params[0].device)
        if kernels is None or not kernels.supports(params, grads, bufs):
            return False
        try:
            ratios = kernels.lars_step(params, grads, bufs, cache=self._triton_plans[index],
                                       **_update_options(group))
        except kernels.BUILD_ERRORS as error:  # warned once, then the eager step
            kernels.give_up(error)
            return False
        if ratios is not None:
            ratio_parts.append(ratios)
            ratio_params.extend(params)
        return True

    def _tensors_with_grad(self, group: dict[str, Any]) -> tuple[list[Tensor], ...]:
        params, grads, bufs = [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            params.append(p)
            grads.append(p.grad)
            bufs.append(state["momentum_buffer"])
        return params, grads, bufs

    def _compiled_update(self, params: list[Tensor], grads: list[Tensor], bufs: list[Tensor],
                         **options: Any) -> Tensor | None:
        """``_bucket_update`` through ``torch.compile``, the LR passed as a 0-d tensor."""
        if self._compiled is None:
            self._compiled = torch.compile(_bucket_update, fullgraph=True, dynamic=False)
        key = (params[0].device, torch.promote_types(params[0].dtype, torch.float32))
        if key not in self._lr_tensors:
            self._lr_tensors[key] = torch.zeros((), dtype=key[1], device=key[0])
        # A Python float LR would be baked into the graph and recompile on every schedule change.
        lr = self._lr_tensors[key].fill_(options.pop("lr"))
        return self._compiled(params, grads, bufs, lr=lr, **options)


def _check_hyperparameters(lr: Any, momentum: float, weight_decay: float,
                           trust_coefficient: float, eps: float, nesterov: bool) -> None:
    if not lr >= 0.0:
        raise ValueError(f"LARS lr must be >= 0, got {lr}")
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"LARS momentum must be in [0, 1), got {momentum}")
    if not weight_decay >= 0.0:
        raise ValueError(f"LARS weight_decay must be >= 0, got {weight_decay}")
    if not trust_coefficient > 0.0:
        raise ValueError(f"LARS trust_coefficient must be > 0, got {trust_coefficient}")
    if not eps >= 0.0:
        raise ValueError(f"LARS eps must be >= 0, got {eps}")
    if nesterov and momentum <= 0.0:
        raise ValueError("LARS nesterov=True needs momentum > 0")


def _update_options(group: dict[str, Any]) -> dict[str, Any]:
    return {key: group[key] for key in _UPDATE_KEYS}


def _bucket_limit(group: dict[str, Any], device: torch.device) -> int | None:
    if group["bucket_bytes"] is not None:
        return group["bucket_bytes"]
    return _CPU_BUCKET_BYTES if device.type == "cpu" else None


def _bucket_bounds(params: list[Tensor], limit: int | None) -> Iterator[tuple[int, int]]:
    """Consecutive index ranges of one device and dtype, each <= ``limit`` bytes (or one tensor).

    Consecutive runs keep the trust ratios in parameter order without a permutation.
    """
    start, size = 0, 0
    for i, p in enumerate(params):
        nbytes = p.numel() * p.element_size()
        same_kind = p.device == params[start].device and p.dtype == params[start].dtype
        if i > start and (not same_kind or (limit is not None and size + nbytes > limit)):
            yield start, i
            start, size = i, 0
        size += nbytes
    yield start, len(params)


def trust_ratio(w_norm: Tensor, g_norm: Tensor, trust_coefficient: float, weight_decay: float,
                eps: float) -> Tensor:
    """λ = η‖w‖ / (‖g‖ + β‖w‖ + eps), and 1 where ‖w‖ = 0 or ‖g‖ = 0 (Intel Caffe's rule).

    Elementwise over 1-D tensors of norms; ``torch.where`` keeps it free of host syncs (the 0/0 in
    the discarded branch is never used).
    """
    ratio = trust_coefficient * w_norm / (g_norm + weight_decay * w_norm + eps)
    return torch.where((w_norm > 0) & (g_norm > 0), ratio, torch.ones_like(ratio))


def _bucket_update(params: list[Tensor], grads: list[Tensor], bufs: list[Tensor], *,
                   lr: float | Tensor, momentum: float, weight_decay: float,
                   trust_coefficient: float, eps: float, clip: bool, nesterov: bool,
                   lars: bool) -> Tensor | None:
    """Algorithm 1 on a list of same-device, same-dtype tensors; returns the local rates (or None).

    ``v = m·v + c_g·g + c_w·w`` with per-tensor 0-d coefficients ``c_g = γλ`` and ``c_w = γλβ``:
    weight decay is folded into the buffer update instead of materialising g + βw.
    """
    if not lars:
        _sgd_update(params, grads, bufs, lr, momentum, weight_decay, nesterov)
        return None
    w_norms, g_norms = _norms(params), _norms(grads)
    ratios = trust_ratio(w_norms, g_norms, trust_coefficient, weight_decay, eps)
    if clip:
        ratios = ratios.clamp(max=1.0)
    grad_coef = ratios * lr
    grad_coefs = grad_coef.unbind(0)
    torch._foreach_mul_(bufs, momentum)
    torch._foreach_addcmul_(bufs, grads, grad_coefs)
    if weight_decay != 0.0:
        decay_coefs = (grad_coef * weight_decay).unbind(0)
        torch._foreach_addcmul_(bufs, params, decay_coefs)
    if not nesterov:
        torch._foreach_sub_(params, bufs)
        return ratios
    # w ← w − m·v_new − c_g·g − c_w·w, with v_new already holding the old w's contribution.
    if weight_decay != 0.0:
        torch._foreach_mul_(params, (1.0 - grad_coef * weight_decay).unbind(0))
    torch._foreach_addcmul_(params, grads, (-grad_coef).unbind(0))
    torch._foreach_add_(params, bufs, alpha=-momentum)
    return ratios


def _norms(tensors: list[Tensor]) -> Tensor:
    """1-D tensor of the L2 norms, in float32 or wider (half-precision norms would make λ coarse).

    ``_foreach_norm`` gives the same bits for the same values wherever they lie in memory; CPU
    BLAS ``dot`` does not (its vector loop starts at the first aligned address, so a view at a
    DDP bucket offset sums in another order than a fresh copy of the same values).
    """
    dtype = torch.promote_types(tensors[0].dtype, torch.float32)
    return torch.stack(torch._foreach_norm(tensors)).to(dtype)


def _sgd_update(params: list[Tensor], grads: list[Tensor], bufs: list[Tensor], lr: float,
                momentum: float, weight_decay: float, nesterov: bool) -> None:
    """Momentum SGD, LR inside the buffer: v = m·v + γ(g + βw); w −= v (λ = 1, no adaptation)."""
    torch._foreach_mul_(bufs, momentum)
    torch._foreach_add_(bufs, grads, alpha=lr)
    if weight_decay != 0.0:
        torch._foreach_add_(bufs, params, alpha=lr * weight_decay)
    if nesterov:
        if weight_decay != 0.0:
            torch._foreach_mul_(params, 1.0 - lr * weight_decay)
        torch._foreach_add_(params, grads, alpha=-lr)
        torch._foreach_add_(params, bufs, alpha=-momentum)
    else:
        torch._foreach_sub_(params, bufs)
