"""Top-k accuracy counts and the run's metrics log (JSON lines)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch


def topk_correct(logits: torch.Tensor, labels: torch.Tensor, ks: tuple[int, ...] = (1, 5)) -> list:
    """Number of examples whose label is among the top-k logits, for each k (as tensors).

    k is capped at the number of classes, so top-5 on a 3-class problem counts every example.
    """
    top = min(max(ks), logits.shape[1])
    predicted = logits.topk(top, dim=1).indices
    hits = predicted.eq(labels.unsqueeze(1))
    return [hits[:, : min(k, top)].any(dim=1).sum() for k in ks]


def quantiles(values: torch.Tensor | None) -> dict[str, float]:
    """min / median / max of a 1-D tensor (LARS trust ratios), or nothing when there are none."""
    if values is None or values.numel() == 0:
        return {}
    stats = torch.stack([values.min(), values.median(), values.max()]).tolist()
    return dict(zip(("trust_min", "trust_median", "trust_max"), stats, strict=True))


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return round(value, 8)
    return value


class MetricsLog:
    """Appends one JSON object per line to ``metrics.jsonl`` (rank 0 only)."""

    def __init__(self, path: Path, enabled: bool = True) -> None:
        self.path = path
        self.enabled = enabled
        self._file = None
        if enabled:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class RecordSinks:
    """Writes each record of the run to every sink (metrics.jsonl, TensorBoard)."""

    def __init__(self, *sinks: Any) -> None:
        self.sinks = sinks

    def write(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.write(record)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def truncate_after_step(path: Path, step: int) -> None:
    """Drop records logged after ``step`` (a resumed run logs those steps again)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a crash
        if record.get("step", 0) <= step:
            kept.append(line)
    path.write_text("".join(f"{line}\n" for line in kept))


def read_metrics(path: Path) -> list[dict[str, Any]]:
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
