"""bigbatch.optim.base: LARS and LAMB keep PyTorch's bookkeeping without importing torch._dynamo."""

import subprocess
import sys

import pytest
import torch

from bigbatch.optim import LAMB, LARS

ROUND_TRIP = """
import sys
import torch
from bigbatch.optim import {name}
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
def build():
    opt = {name}([{{"params": [model[0].weight]}}, {{"params": [model[0].bias], "lars": False}}],
                 lr=0.1)
    opt.add_param_group({{"params": list(model[1].parameters())}})
    return opt
opt = build()
for _ in range(2):
    model(torch.randn(8, 4)).square().sum().backward()
    opt.step()
    opt.zero_grad()
build().load_state_dict(opt.state_dict())
print("torch._dynamo" in sys.modules)
"""


@pytest.mark.parametrize("name", ["LARS", "LAMB"])
def test_a_step_and_a_state_round_trip_import_no_dynamo(name):
    """torch.optim.Optimizer's wrapped methods import torch._dynamo (2 s of CPU) on first call."""
    done = subprocess.run([sys.executable, "-c", ROUND_TRIP.format(name=name)],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False", done.stdout + done.stderr


@pytest.mark.parametrize("kind", [LARS, LAMB])
def test_pytorch_bookkeeping_still_applies(kind):
    weight = torch.nn.Parameter(torch.ones(3))
    opt = kind([weight], lr=0.1)
    with pytest.raises(ValueError, match="some parameters appear in more than one"):
        opt.add_param_group({"params": [weight]})
    weight.grad = torch.ones(3)
    opt.zero_grad()
    assert weight.grad is None  # set_to_none, PyTorch's default
    state = opt.state_dict()
    assert state["param_groups"][0]["params"] == [0] and state["param_groups"][0]["lr"] == 0.1
