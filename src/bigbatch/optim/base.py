"""The base of bigbatch's optimizers: ``torch.optim.Optimizer`` without a torch._dynamo import.

PyTorch wraps four bookkeeping methods of its optimizers (``add_param_group``, ``zero_grad``,
``state_dict``, ``load_state_dict``) in ``torch._disable_dynamo``, so that a compiled region never
traces into them; the wrapper's first call imports torch._dynamo, about 2 s of CPU on a 2-core
machine, in every training process, on every rank, whether anything is compiled or not. bigbatch
never calls these methods inside a compiled region, so its optimizers take the functions under
the wrapper (PyTorch's own, unchanged): a LARS or LAMB run that compiles nothing never imports
torch._dynamo, and one that does (``compile: true``, ``optim.fused_compile``) imports it when it
compiles. (``torch.optim.SGD`` imports it in its first step, through the same kind of wrapper
around its update function.)

It also holds what a step of each of them checks before it changes anything (a step that raises
leaves the weights and the state as they were), and :func:`keyword_defaults`, which reads an
optimizer's defaults from its signature.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

# The code of torch._disable_dynamo's wrapper (making one imports nothing; calling it would).
_DYNAMO_WRAPPER = torch._disable_dynamo(lambda: None).__code__


def _unwrapped(name: str):  # noqa: ANN202 (the function, whatever PyTorch's signature)
    """``torch.optim.Optimizer.<name>`` without its ``torch._disable_dynamo`` wrapper; the method
    itself where a PyTorch version wraps it otherwise or not at all."""
    method = getattr(torch.optim.Optimizer, name)
    if getattr(method, "__code__", None) is _DYNAMO_WRAPPER:
        return method.__wrapped__
    return method


def keyword_defaults(optimizer: type[torch.optim.Optimizer]) -> dict[str, Any]:
    """The defaults of ``optimizer``'s keyword arguments, read from its signature (their one
    home: whoever builds one with other defaults reads them here instead of copying them)."""
    parameters = inspect.signature(optimizer.__init__).parameters.values()
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


class Optimizer(torch.optim.Optimizer):
    """``torch.optim.Optimizer`` whose bookkeeping does not import torch._dynamo."""

    add_param_group = _unwrapped("add_param_group")
    zero_grad = _unwrapped("zero_grad")
    state_dict = _unwrapped("state_dict")
    load_state_dict = _unwrapped("load_state_dict")

    def _check_gradients(self) -> None:
        """RuntimeError if any gradient is sparse; called before a step touches any tensor."""
        for number, group in enumerate(self.param_groups):
            for index, p in enumerate(group["params"]):
                if p.grad is not None and p.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse "
                                       f"gradients (parameter {index} of group {number})")

