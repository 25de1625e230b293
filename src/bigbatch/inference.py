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
    """A final.pt (plain torch.save) or a verified checkpoint: a dict with model and config."""
    file = Path(path)
    if not file.is_file():
        raise CheckpointError(f"weights file {path} does not exist")
    if file.read_bytes()[: len(checkpoint.MAGIC)] == checkpoint.MAGIC:
        return checkpoint.load(file)
    try:
        state = torch.load(file, map_location="cpu", weights_only=False)
    except Exception as error:  # a damaged zip or pickle surfaces as many exception types
        raise CheckpointError(f"cannot read weights file {path}: {error}") from None
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
    model.load_state_dict(state["model"])
    ctx = DistContext(0, 1, 0, None, torch.device("cpu"))
    return evaluate(model, val_set, ctx, batch_size or cfg.micro_batch)
