"""Evaluate saved weights (``final.pt`` or a checkpoint) on their run's validation set."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bigbatch import checkpoint
from bigbatch.build import datasets_for, geometry_for, model_for
from bigbatch.config import RunConfig, apply_overrides, config_from_dict, validate
from bigbatch.distributed import DistContext
from bigbatch.errors import CheckpointError, ConfigError
from bigbatch.evaluate import evaluate
from bigbatch.precise_bn import PreciseBN
from bigbatch.threads import intra_op_threads


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
    path: str, data_path: str | None = None, batch_size: int | None = None,
    overrides: Sequence[str] = (),
) -> dict:
    """Top-1, top-5 and loss of the weights in ``path`` with the BatchNorm statistics it
    carries (final.pt of a run with eval.bn_recompute carries recomputed ones), or, with the
    override ``eval.bn_recompute=N``, with statistics recomputed from N micro-batches of the
    training set (bigbatch.precise_bn), as the run would have after its last step (after the
    checkpoint's step for a checkpoint) and the result with the file's own as ``trained_*``.
    Runs with the run's intra-op thread count (``threads``), since a CPU kernel's sums depend on
    it: so the numbers are the run's own to the last bit."""
    state = load_weights_file(path)
    cfg = eval_config(state["config"], overrides)
    if data_path is not None:
        cfg.data.path = data_path
    validate(cfg)
    with intra_op_threads(cfg.threads):
        return _evaluate_config(cfg, state, path, batch_size)


def _evaluate_config(cfg: RunConfig, state: dict, path: str, batch_size: int | None) -> dict:
    """evaluate_weights once the config is resolved and the threads are set."""
    train_set, val_set = datasets_for(cfg, uint8_train=cfg.data.normalize_on_device)
    model = model_for(cfg, train_set.num_classes, train_set.in_channels)
    checkpoint.load_model_state(model, state["model"], f"weights file {path}")
    ctx = DistContext(0, 1, 0, None, torch.device("cpu"))

    def evaluate_model() -> dict:
        return evaluate(model, val_set, ctx, batch_size or cfg.micro_batch,
                        hflip=cfg.eval.hflip)

    if not cfg.eval.bn_recompute:
        return evaluate_model()
    geometry = geometry_for(cfg, len(train_set), 1)
    precise = PreciseBN(cfg.eval.bn_recompute, train_set, geometry, cfg.seed, ctx)
    step = state.get("step", geometry.total_steps(cfg.epochs))
    return precise.evaluate(model, step, evaluate_model, evaluate_model())[0]


def eval_config(raw: dict[str, Any], overrides: Sequence[str]) -> RunConfig:
    """The weights' run config with the overrides of `bigbatch eval --set` (eval.* keys and
    data.val_subset). The run's own eval.bn_recompute is not applied (the file already carries
    the statistics it chose)."""
    raw = {**raw, "eval": {**(raw.get("eval") or {}), "bn_recompute": 0}}
    for assignment in overrides:
        key = assignment.split("=", 1)[0].strip()
        if not (key.startswith("eval.") or key == "data.val_subset"):
            raise ConfigError("bigbatch eval --set takes eval.* keys and data.val_subset only, "
                              f"got '{assignment}'")
    cfg = config_from_dict(apply_overrides(raw, list(overrides)))
    cfg.checkpoint.resume = None
    return cfg
