"""The statistics every results table in the docs prints, named once, and how a record's machine
is named.

- A measurement over several runs is the **median of the runs with their range**:
  :func:`runs_text` prints ``median (min–max, N runs)``.
- A ratio of two methods timed side by side is, within one run, the **median of the paired
  (round-by-round) ratios** (``median_paired`` in the records, written by
  ``common.paired_ratio``) with their range over the rounds (:func:`paired_text`); over several
  runs it is the median of the runs' values with their range (:func:`ratio_text`).

Records are read with :func:`read_jsonl`; a record that is not there raises
:class:`NoRecord`, which the renderer prints as "no record yet".
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class NoRecord(Exception):
    """The record a table is drawn from does not exist (yet)."""


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise NoRecord(path)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_json(path: Path) -> Any:
    if not path.is_file():
        raise NoRecord(path)
    return json.loads(path.read_text())


def runs_text(values: Sequence[float], digits: int = 2, unit: str = "") -> str:
    """Median of the runs with their range: '91.36 (91.06–91.43, 3 runs)'."""
    if not values:
        raise NoRecord("no runs")
    mid = statistics.median(values)
    if len(values) == 1:
        return f"{mid:,.{digits}f}{unit} (1 run)"
    return (f"{mid:,.{digits}f}{unit} ({min(values):,.{digits}f}–{max(values):,.{digits}f}, "
            f"{len(values)} runs)")


def ratio_text(per_run: Sequence[float], digits: int = 2) -> str:
    """Over runs of the runs' median paired ratios: '1.26× (1.20–1.37, 6 runs)'."""
    return runs_text(per_run, digits, unit="×")


def paired_text(ratio: dict[str, float], rounds: int) -> str:
    """One run's ratio: the median of its paired ratios with their range over the rounds,
    '1.62× (1.33–1.69 over 3 rounds)'."""
    return (f"{ratio['median_paired']:.2f}× ({ratio['min_paired']:.2f}–"
            f"{ratio['max_paired']:.2f} over {rounds} rounds)")


def minutes_text(seconds: float) -> str:
    """'2 min 11 s' (rounded to the second)."""
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def duration_runs_text(seconds: Sequence[float]) -> str:
    """Median of the runs with their range, as durations: '2 min 11 s (2 min 10 s – 2 min 16 s)'."""
    mid = statistics.median(seconds)
    if len(seconds) == 1:
        return minutes_text(mid)
    return f"{minutes_text(mid)} ({minutes_text(min(seconds))} – {minutes_text(max(seconds))})"


def machine_label(machine: dict[str, Any]) -> str:
    """How a table names the machine a record was measured on, from the record alone."""
    if machine.get("gpu"):
        return f"one {machine['gpu']}"
    cores = machine.get("cores_available") or machine.get("cpu_count") or machine.get("cpus")
    cpu = machine.get("cpu") or machine.get("processor") or "unknown CPU"
    label = f"{cores}-core {cpu}" if cores else cpu
    features = []
    if machine.get("cpu_avx512") is not None:
        features.append("AVX-512" if machine["cpu_avx512"] else "no AVX-512")
    if machine.get("cpu_native_bf16") is not None:
        features.append("native bf16" if machine["cpu_native_bf16"] else "no native bf16")
    return f"{label} ({', '.join(features)})" if features else label


def load_1min(record: dict[str, Any]) -> float | None:
    """The 1-minute load average a record carries, wherever its script put it."""
    machine = record.get("machine", {})
    for source in (record.get("load_before"), machine.get("load_average")):
        if isinstance(source, dict) and "1min" in source:
            return float(source["1min"])
    for value in (machine.get("loadavg_1min"), machine.get("load_average_1min")):
        if value is not None:
            return float(value)
    return None


def loads_text(records: Sequence[dict[str, Any]]) -> str:
    loads = [load for load in map(load_1min, records) if load is not None]
    if not loads:
        return "load not recorded"
    low, high = min(loads), max(loads)
    return f"load {low:.1f}" if low == high else f"load {low:.1f}–{high:.1f}"


def commits_text(records: Sequence[dict[str, Any]]) -> str:
    commits = sorted({str(record.get("machine", {}).get("commit") or record.get("commit"))
                      for record in records} - {"None"})
    return ", ".join(commits) if commits else "commit not recorded"
