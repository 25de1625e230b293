"""The compiled CPU LAMB step (``_lamb_kernel.c``), loaded through ctypes when it was built.

``pip install`` compiles it (setup.py; a C compiler is all it needs). Without it — no compiler at
install time, another platform, or ``BIGBATCH_LAMB_KERNEL=0`` — :class:`~bigbatch.optim.LAMB`
runs its multi-tensor eager path. The kernel does Algorithm 2 of You et al., "Large Batch
Optimization for Deep Learning: Training BERT in 76 Minutes" (ICLR 2020) per cache-sized bucket
in two passes: the moments, the update u and the squared norms of x and u in one, the
trust-ratio-scaled update in the other while u is still in cache. The norms are a pure function
of the values (fixed chunks and lanes by index, as in the LARS kernel).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import sys

import torch
from torch import Tensor

from bigbatch.optim import native


class _Options(ctypes.Structure):
    _fields_ = [("lr", ctypes.c_double), ("beta1", ctypes.c_double), ("beta2", ctypes.c_double),
                ("eps", ctypes.c_double), ("weight_decay", ctypes.c_double),
                ("adapt", ctypes.c_int32), ("threads", ctypes.c_int32),
                ("bucket_elements", ctypes.c_int64), ("scratch", ctypes.c_void_p),
                ("scratch_elements", ctypes.c_int64)]


_KERNELS = native.load_kernels(
    "_lamb_kernel", "BIGBATCH_LAMB_KERNEL", "lamb_step",
    [ctypes.c_void_p] * 5 + [ctypes.c_int64, ctypes.POINTER(_Options), ctypes.c_void_p,
                             ctypes.c_void_p])


def available() -> bool:
    """Whether the compiled kernel was built and loaded."""
    return _KERNELS is not None


def disabled() -> contextlib.AbstractContextManager[None]:
    """Within the block, LAMB takes its eager path (to compare the two)."""
    return native.disabled(sys.modules[__name__])


def supports(params: list[Tensor], grads: list[Tensor], avgs: list[Tensor],
             avg_sqs: list[Tensor]) -> bool:
    """Whether the kernel can step these tensors (:func:`native.same_dense_layout`)."""
    return _KERNELS is not None and native.same_dense_layout(params, grads, avgs, avg_sqs)


def scratch_elements(numels: list[int], bucket_elements: int) -> int:
    """The scratch the kernel needs: two of its widest bucket (consecutive tensors of at most
    ``bucket_elements`` values, or one larger tensor alone), and one value."""
    widest = size = 0
    for n in numels:
        if size and size + n > bucket_elements:
            size = 0
        size += n
        widest = max(widest, size)
    return 2 * widest + 1


def step(params: list[Tensor], grads: list[Tensor], avgs: list[Tensor], avg_sqs: list[Tensor],
         steps: list[int], *, lr: float, betas: tuple[float, float], eps: float,
         weight_decay: float, lars: bool, bucket_bytes: int, scratch: dict) -> None:
    """One step of the tensors (see :func:`supports`) in place; ``lars=False``: no trust ratio.

    ``steps``: each tensor's step count t (after this step's increment), for the bias
    corrections 1 − β₁ᵗ and √(1 − β₂ᵗ), computed here as the eager step computes them.
    ``scratch``: the caller's, where the kernel's scratch buffer is kept from step to step.
    """
    count = len(params)
    beta1, beta2 = betas
    bucket_elements = max(1, bucket_bytes // params[0].element_size())
    buffer = None
    if lars:
        needed = scratch_elements([p.numel() for p in params], bucket_elements)
        buffer = scratch.get(params[0].dtype)
        if buffer is None or buffer.numel() < needed:
            buffer = scratch[params[0].dtype] = torch.empty(needed, dtype=params[0].dtype)
    options = _Options(float(lr), beta1, beta2, eps, weight_decay, lars, torch.get_num_threads(),
                       bucket_elements, buffer.data_ptr() if buffer is not None else None,
                       buffer.numel() if buffer is not None else 0)
    doubles = ctypes.c_double * count
    pointers = ctypes.c_void_p * count
    result = _KERNELS[params[0].dtype](
        *[pointers(*[t.data_ptr() for t in tensors]) for tensors in (params, grads, avgs, avg_sqs)],
        (ctypes.c_int64 * count)(*[p.numel() for p in params]), count, ctypes.byref(options),
        doubles(*[1.0 - beta1**t for t in steps]),
        doubles(*[math.sqrt(1.0 - beta2**t) for t in steps]))
    if result != 0:
        raise MemoryError("LAMB kernel: out of memory for its work plan")
    torch.autograd.graph.increment_version(params + avgs + avg_sqs)  # written behind autograd
