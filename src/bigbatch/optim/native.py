"""What the compiled optimizer steps share on the Python side: loading a CPU kernel library built
by ``pip install`` (setup.py) through ctypes and declaring its step functions, switching it off,
the tensor layouts a kernel takes, and finding the GPU's Triton steps.

Each kernel module (:mod:`~bigbatch.optim.lars_kernel`, :mod:`~bigbatch.optim.lamb_kernel`)
keeps its loaded functions in a module global ``_KERNELS`` (None: not built, or switched off by
its environment variable set to 0); the optimizer then runs its eager multi-tensor path.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import importlib.machinery
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

DTYPES = (torch.float32, torch.float64)


def load(stem: str, switch: str) -> ctypes.CDLL | None:
    """The library ``bigbatch/optim/<stem><extension suffix>``, or None where it was not built,
    does not load, or the environment variable ``switch`` is 0."""
    if os.environ.get(switch, "1") == "0":
        return None
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"{stem}{suffix}"
        if path.is_file():
            try:
                return ctypes.CDLL(str(path))
            except OSError:
                return None
    return None


def load_kernels(stem: str, switch: str, function: str,
                 argtypes: list[Any]) -> dict[torch.dtype, ctypes._CFuncPtr] | None:
    """The float32 and float64 step functions ``<function>_f32`` and ``<function>_f64`` of the
    library ``stem`` (see :func:`load`), declared with ``argtypes`` and an int result, by dtype;
    None where the library is not there."""
    lib = load(stem, switch)
    if lib is None:
        return None
    kernels = {}
    for dtype, suffix in ((torch.float32, "f32"), (torch.float64, "f64")):
        fn = getattr(lib, f"{function}_{suffix}")
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
        kernels[dtype] = fn
    return kernels


@contextlib.contextmanager
def disabled(module: ModuleType) -> Iterator[None]:
    """Within the block, ``module``'s kernels are off (its optimizer takes the eager path)."""
    kernels, module._KERNELS = module._KERNELS, None
    try:
        yield
    finally:
        module._KERNELS = kernels


def triton_steps(device: torch.device) -> ModuleType | None:
    """:mod:`bigbatch.optim.triton_step` for tensors on ``device``, imported on first use: for a
    CUDA device, or the CPU when Triton interprets its kernels there (``TRITON_INTERPRET=1``);
    None for other devices, where Triton is not installed, or where it does not import."""
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        return None
    try:  # imported by name, on first use: triton_step itself imports this module
        return importlib.import_module("bigbatch.optim.triton_step")
    except Exception:  # not installed, or an install that does not import: the eager steps
        return None


def same_dense_layout(*lists: list[Tensor], dtypes: tuple[torch.dtype, ...] = DTYPES,
                      device_type: str = "cpu") -> bool:
    """Whether the tensors can go to a kernel: on a ``device_type`` device, one of ``dtypes``,
    and the tensors at each position (a weight, its gradient, its state) of one shape and dense
    with the same strides (contiguous or channels-last alike), so that one index walks them
    all."""
    if not lists[0] or lists[0][0].dtype not in dtypes:
        return False
    dtype, device = lists[0][0].dtype, lists[0][0].device
    if device.type != device_type:
        return False
    for same in zip(*lists, strict=True):
        first = same[0]
        shape, stride = first.shape, first.stride()
        for t in same:
            if not (t.dtype == dtype and t.device == device and t.shape == shape
                    and t.stride() == stride):
                return False
        if not _dense(first):
            return False
    return True


def _dense(t: Tensor) -> bool:
    return t.is_contiguous() or (t.dim() == 4 and t.is_contiguous(
        memory_format=torch.channels_last))
