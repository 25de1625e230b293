"""The compiled CPU LARS step (``_lars_kernel.c``), loaded through ctypes when it was built.

``pip install`` compiles it (setup.py; a C compiler is all it needs, no torch headers). Without it
— no compiler at install time, another platform, or ``BIGBATCH_LARS_KERNEL=0`` — :class:`LARS`
runs its multi-tensor eager path. The kernel does Algorithm 1 of You, Gitman & Ginsburg, "Large
Batch Training of Convolutional Networks" (2017) in one trip from memory per cache-sized bucket
(norms, ratios and update of a bucket before the next), with norms that are a pure function of
the values (fixed chunks and lanes by index). The update pass hands back ‖w‖² of the new weights,
summed exactly as the norm pass sums them; :class:`WeightNorms` keeps them for the next step while
PyTorch sees no other write to the weight, so the norm pass reads only the gradients.
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


def _load() -> dict[torch.dtype, ctypes._CFuncPtr] | None:
    lib = native.load("_lars_kernel", "BIGBATCH_LARS_KERNEL")
    if lib is None:
        return None
    return {torch.float32: _declare(lib.lars_step_f32), torch.float64: _declare(lib.lars_step_f64)}


def _declare(fn: ctypes._CFuncPtr) -> ctypes._CFuncPtr:
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_int64, ctypes.POINTER(_Options), ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


_KERNELS = _load()


def available() -> bool:
    """Whether the compiled kernel was built and loaded."""
    return _KERNELS is not None


def disabled() -> contextlib.AbstractContextManager[None]:
    """Within the block, LARS takes its eager path (to compare the two)."""
    return native.disabled(sys.modules[__name__])


def supports(params: list[Tensor], grads: list[Tensor], bufs: list[Tensor]) -> bool:
    """Whether the kernel can step these tensors (:func:`native.same_dense_layout`)."""
    return _KERNELS is not None and native.same_dense_layout(params, grads, bufs)


class WeightNorms:
    """‖w‖² of each weight as the kernel's last update left it, for the next step's ratio.

    An entry holds while the weight's version counter and address are the ones recorded after
    that update: any in-place change through PyTorch (``copy_``, ``load_state_dict``, another
    optimizer) bumps the version, and ``p.data = ...`` moves the address. A write PyTorch cannot
    see (through ``p.data.copy_``, numpy or raw pointers) must call :meth:`clear` or
    ``torch.autograd.graph.increment_version(p)`` — as it must for autograd anyway.
    """

    def __init__(self) -> None:
        self._entries: dict[Tensor, tuple[int, int, float]] = {}

    def clear(self) -> None:
        self._entries.clear()

    def lookup(self, params: list[Tensor], addresses: list[int]) -> list[float]:
        """The kept ‖w‖² of each weight (at ``addresses``), or -1.0 where it changed since."""
        found = []
        for p, address in zip(params, addresses, strict=True):
            entry = self._entries.get(p)
            valid = entry is not None and entry[0] == p._version and entry[1] == address
            found.append(entry[2] if valid else -1.0)
        return found

    def store(self, params: list[Tensor], addresses: list[int], squares: list[float]) -> None:
        for p, address, square in zip(params, addresses, squares, strict=True):
            self._entries[p] = (p._version, address, square)


def step(params: list[Tensor], grads: list[Tensor], bufs: list[Tensor], norms: WeightNorms, *,
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
    addresses = [p.data_ptr() for p in params]
    squares = (ctypes.c_double * count)(*norms.lookup(params, addresses))
    result = _KERNELS[dtype](
        pointers(*addresses), pointers(*[g.data_ptr() for g in grads]),
        pointers(*[v.data_ptr() for v in bufs]),
        (ctypes.c_int64 * count)(*[p.numel() for p in params]), count, ctypes.byref(options),
        squares, ratios.data_ptr() if ratios is not None else None)
    if result != 0:
        raise MemoryError("LARS kernel: out of memory for its work plan")
    torch.autograd.graph.increment_version(params + bufs)  # written behind autograd's back
    norms.store(params, addresses, list(squares))
    return ratios
