"""The compiled CPU LARS step (``_lars_kernel.c``), loaded through ctypes when it was built.

``pip install`` compiles it (setup.py; a C compiler is all it needs, no torch headers). Without it
— no compiler at install time, another platform, or ``BIGBATCH_LARS_KERNEL=0`` — :class:`LARS`
runs its multi-tensor eager path. The kernel does Algorithm 1 of You, Gitman & Ginsburg, "Large
Batch Training of Convolutional Networks" (2017) in one trip from memory per cache-sized bucket
(norms, ratios and update of a bucket before the next), with norms that are a pure function of
the values (fixed chunks and lanes by index). Every step reads the weights' norms from the weights
themselves: a weight written between steps in any way (``p.data``, ``copy_``, a loaded state
dict, numpy) steps from its new value.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys

import torch
from torch import Tensor

from bigbatch.optim import native


class _Options(ctypes.Structure):
    _fields_ = [("lr", ctypes.c_double), ("momentum", ctypes.c_double),
                ("weight_decay", ctypes.c_double), ("trust_coefficient", ctypes.c_double),
                ("eps", ctypes.c_double), ("clip", ctypes.c_int32), ("nesterov", ctypes.c_int32),
                ("lars", ctypes.c_int32), ("threads", ctypes.c_int32),
                ("bucket_elements", ctypes.c_int64)]


_KERNELS = native.load_kernels(
    "_lars_kernel", "BIGBATCH_LARS_KERNEL", "lars_step",
    [ctypes.c_void_p] * 4 + [ctypes.c_int64, ctypes.POINTER(_Options), ctypes.c_void_p])


def available() -> bool:
    """Whether the compiled kernel was built and loaded."""
    return _KERNELS is not None


def disabled() -> contextlib.AbstractContextManager[None]:
    """Within the block, LARS takes its eager path (to compare the two)."""
    return native.disabled(sys.modules[__name__])


def supports(params: list[Tensor], grads: list[Tensor], bufs: list[Tensor]) -> bool:
    """Whether the kernel can step these tensors (:func:`native.same_dense_layout`)."""
    return _KERNELS is not None and native.same_dense_layout(params, grads, bufs)


def step(params: list[Tensor], grads: list[Tensor], bufs: list[Tensor], *,
         lr: float, momentum: float, weight_decay: float, trust_coefficient: float, eps: float,
         clip: bool, nesterov: bool, lars: bool, bucket_bytes: int) -> Tensor | None:
    """One step of the tensors (see :func:`supports`) in place; the trust ratios if ``lars``."""
    count = len(params)
    dtype = params[0].dtype
    ratios = torch.empty(count, dtype=dtype) if lars else None
    options = _Options(float(lr), momentum, weight_decay, trust_coefficient, eps, clip, nesterov,
                       lars, torch.get_num_threads(),
                       max(1, bucket_bytes // params[0].element_size()))
    pointers = ctypes.c_void_p * count
    result = _KERNELS[dtype](
        *[pointers(*[t.data_ptr() for t in tensors]) for tensors in (params, grads, bufs)],
        (ctypes.c_int64 * count)(*[p.numel() for p in params]), count, ctypes.byref(options),
        ratios.data_ptr() if ratios is not None else None)
    if result != 0:
        raise MemoryError("LARS kernel: out of memory for its work plan")
    torch.autograd.graph.increment_version(params + bufs)  # written behind autograd's back
    return ratios
