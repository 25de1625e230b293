"""The run's records as TensorBoard scalars in ``RUN_DIR/tensorboard/`` (``log.tensorboard``).

The writer is a second sink for the very records that go to metrics.jsonl: whatever field a
train or eval record holds becomes a scalar, so there is no list of fields to keep in step.
Tags are grouped so related curves sit together: ``train/loss``, ``train/lr``,
``train/images_per_second``, ``step_time/data`` (and compute, comm_exposed, optimizer),
``eval/top1``, ``eval/top5``, ``eval/loss``, and one ``trust_ratio/<parameter name>`` per
LARS-adapted tensor.

A resumed run starts its writer with ``purge_step`` one past the checkpoint's step: TensorBoard
then hides what the interrupted run wrote beyond the checkpoint, the rule metrics.jsonl follows
(records after the checkpoint's step are dropped and logged again).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bigbatch.errors import ConfigError

NOT_SCALARS = ("kind", "step", "epoch", "examples")
GROUPS = {"trust_layers": "trust_ratio"}  # a record's dict field -> the tag group of its entries


def check_available() -> None:
    """log.tensorboard=true without the package: one line before any work starts."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise ConfigError(
            "log.tensorboard=true needs the tensorboard package: "
            "pip install 'bigbatch[tensorboard]' (or set log.tensorboard=false)"
        ) from None


def scalars(record: dict[str, Any]) -> list[tuple[str, float]]:
    """(tag, value) of every number in a metrics record."""
    kind = record.get("kind", "train")
    found = []
    for key, value in record.items():
        if key in NOT_SCALARS:
            continue
        if isinstance(value, dict):
            group = GROUPS.get(key, key)
            found += [(f"{group}/{name}", float(v)) for name, v in value.items() if _number(v)]
        elif _number(value):
            tag = f"step_time/{key[5:]}" if key.startswith("time_") else f"{kind}/{key}"
            found.append((tag, float(value)))
    return found


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class TensorBoardLog:
    """Writes records as scalars at their ``step`` (rank 0); flushed per record, so a crash
    loses no more than metrics.jsonl does."""

    def __init__(self, folder: Path, start_step: int, enabled: bool = True) -> None:
        self.writer = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(folder), purge_step=start_step + 1)

    def write(self, record: dict[str, Any]) -> None:
        if self.writer is None:
            return
        for tag, value in scalars(record):
            self.writer.add_scalar(tag, value, global_step=record["step"])
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
