"""Evaluate saved weights (``final.pt`` or a checkpoint) on their run's validation set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from bigbatch import checkpoint
from bigbatch.build import datasets_for, model_for
from bigbatch.config import config_from_dict, validate
from bigbatch.distributed import DistContext
from bigbatch.errors import CheckpointError
from bigbatch.evaluate import evaluate


def load_weights_file(path: str) -> dict[str, Any]:
    """A final.pt (plain torch.save) or a verified checkpoint: a dict with model and config.

    Either is read with weights_only=True (checkpoint.read_state): a file that would run code
    while loading is refused.
    """
    file = Path(path)
    if not file.is_file():
        raise CheckpointError(f"weights file {path} does not exist")
    if file.read_bytes()[: len(checkpoint.MAGIC)] == checkpoint.MAGIC:
        return checkpoint.load(file)
    state = checkpoint.read_state(file, f"weights file {path}")
    if not isinstance(state, dict) or "model" not in state or "config" not in state:
        raise CheckpointError(f"{path} holds no bigbatch weights (expected keys 'model', 'config')")
    return state


def evaluate_weights(
    path: str, data_path: str | None = None, batch_size: int | None = None
) -> dict:
    state = load_weights_file(path)
    cfg = config_from_dict(state["config"])
    cfg.checkpoint.resume = None
    if data_path is not None:
        cfg.data.path = data_path
    validate(cfg)
    train_set, val_set = datasets_for(cfg)
    model = model_for(cfg, train_set.num_classes, train_set.in_channels)
    checkpoint.load_model_state(model, state["model"], f"weights file {path}")
    ctx = DistContext(0, 1, 0, None, torch.device("cpu"))
    return evaluate(model, val_set, ctx, batch_size or cfg.micro_batch)
