"""Evaluate a run's final.pt with however many processes torchrun started; rank 0 prints JSON."""

import json
import sys

import torch

from bigbatch.build import datasets_for, model_for
from bigbatch.config import config_from_dict
from bigbatch.distributed import init_distributed, shutdown
from bigbatch.evaluate import evaluate

state = torch.load(sys.argv[1], map_location="cpu", weights_only=True)
cfg = config_from_dict(state["config"])
ctx = init_distributed("gloo")
train_set, val_set = datasets_for(cfg)
model = model_for(cfg, train_set.num_classes, train_set.in_channels)
model.load_state_dict(state["model"])
result = evaluate(model, val_set, ctx, batch_size=int(sys.argv[2]))
if ctx.is_main:
    print(json.dumps({**result, "world_size": ctx.world_size}))
shutdown()
