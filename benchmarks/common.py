"""Shared pieces of the benchmark scripts: the machine's description, interleaved timing, medians
and paired ratios, and appending a JSON record to docs/results/.

The machine these benchmarks run on is often shared and noisy, so every figure is a ratio of
methods timed side by side in one process run: repetitions interleaved (the order rotated each
round, so a slow spell hits every method alike), warm-up dropped, medians reported, and the load
average recorded before and after so that a reader can judge how noisy the run was.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where it is used: scripts that only read records start fast
    import torch

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "docs" / "results"
# PyTorch's and oneDNN's kernels held to AVX2 on a CPU that has more (AVX-512): a stand-in for an
# AVX2-only CPU that keeps its instruction set, not its clock, caches or memory.
AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
# CPU flags that decide which reduced-precision paths run natively.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_model() -> str:
    for line in _cpuinfo_lines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def cpu_flags() -> set[str]:
    for line in _cpuinfo_lines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _cpuinfo_lines() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def cpu_has_native_bf16(flags: set[str] | None = None) -> bool:
    """True when the CPU computes bf16 dot products in hardware (AVX512-BF16 or AMX): only then can
    bf16 autocast beat fp32 on a CPU; elsewhere bf16 is emulated and slower."""
    flags = cpu_flags() if flags is None else flags
    return any(flag in flags for flag in BF16_FLAGS)


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def load_average() -> dict[str, float]:
    """1-, 5- and 15-minute load averages (runnable processes; compare with the core count)."""
    one, five, fifteen = os.getloadavg()
    return {"1min": round(one, 2), "5min": round(five, 2), "15min": round(fifteen, 2)}


def process_tree_memory_mib(pid: int) -> dict[str, float]:
    """The memory of a process and all its descendants now (Linux): the sum of their
    proportional set sizes (shared pages divided among the processes sharing them, so libraries
    mapped by several processes count once) and the sum of their resident set sizes."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError, ValueError):
            continue  # not a process, or one that just ended
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, kib = [pid], {"Pss:": 0.0, "Rss:": 0.0}
    while tree:
        current = tree.pop()
        tree.extend(children.get(current, []))
        try:
            rollup = Path(f"/proc/{current}/smaps_rollup").read_text().splitlines()
        except OSError:
            continue
        for line in rollup:
            field, _, value = line.partition(" ")  # "Pss:      1234 kB"
            if field in kib:
                kib[field] += float(value.split()[0])
    return {"pss": kib["Pss:"] / 1024.0, "rss": kib["Rss:"] / 1024.0}


def git_commit(repo: Path = REPO) -> str | None:
    """The commit the benchmark ran at, with '+dirty' when tracked files were modified (records
    under docs/results, which benchmarks append to, do not count)."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain",
                                "--untracked-files=no", "--", ".", ":!docs/results"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def package_versions(names: Iterable[str] = ("torchvision", "timm", "PIL", "numpy")) -> dict:
    from importlib import import_module

    import torch

    versions = {"torch": torch.__version__}
    for name in names:
        try:
            versions[name] = getattr(import_module(name), "__version__", "?")
        except ImportError:
            versions[name] = None
    return versions


def machine_info(device: torch.device | str = "cpu") -> dict[str, Any]:
    """What a reader needs to place a figure: CPU, cores, native bf16, threads, GPU, versions,
    the commit measured and the load average at the time."""
    import torch

    flags = cpu_flags()
    info: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cores_available": available_cores(),
        "cpu_avx512": "avx512f" in flags,
        "cpu_native_bf16": cpu_has_native_bf16(flags),
        "cpu_amx": "amx_tile" in flags,
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": package_versions(),
        "commit": git_commit(),
        "load_average": load_average(),
    }
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


# ----------------------------------------------------------------------------- timing


def rotated(names: Sequence[str], round_index: int) -> list[str]:
    """``names`` rotated by the round number, so no method always runs first (or last)."""
    shift = round_index % max(1, len(names))
    return list(names[shift:]) + list(names[:shift])


def interleaved_rounds(methods: Mapping[str, Callable[[], Any]], rounds: int,
                       on_round: Callable[[int], None] | None = None) -> dict[str, list[Any]]:
    """Call every method once per round, in rotated order; the results of each, in round order.

    Warm-up is the caller's business (drop it inside the method, or drop round 0)."""
    results: dict[str, list[Any]] = {name: [] for name in methods}
    names = list(methods)
    for round_index in range(rounds):
        for name in rotated(names, round_index):
            results[name].append(methods[name]())
        if on_round is not None:
            on_round(round_index)
    return results


def median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Over several runs: the median (3 decimals), the range and every run's value."""
    return {"median": round(median(values), 3), "min": min(values), "max": max(values),
            "runs": list(values)}


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> dict[str, float]:
    """Ratio of two interleaved series: of their medians, and the median of round-by-round ratios
    (the latter is robust when the machine's speed drifts between rounds)."""
    pairs = [a / b for a, b in zip(numerator, denominator, strict=True) if b]
    return {"of_medians": round(median(numerator) / median(denominator), 4),
            "median_paired": round(median(pairs), 4),
            "min_paired": round(min(pairs), 4), "max_paired": round(max(pairs), 4)}


# ----------------------------------------------------------------------------- records


def report(name: str, record: Mapping[str, Any], save: bool, indent: int | None = None) -> None:
    """Print ``record`` as JSON (flushed, so a long benchmark shows each record as it comes) and,
    with ``save``, append it to docs/results/<name>.jsonl."""
    print(json.dumps(record, indent=indent), flush=True)
    if save:
        append_result(name, record)


def append_result(name: str, record: Mapping[str, Any], results_dir: Path = RESULTS_DIR) -> Path:
    """Append ``record`` as one JSON line to results_dir/<name>.jsonl, with what a reader needs to
    place it (:func:`with_machine`); returns the path."""
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{name}.jsonl"
    with path.open("a") as file:
        file.write(json.dumps(with_machine(record), sort_keys=False) + "\n")
    return path


def with_machine(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` with a ``machine`` entry holding every field of :func:`machine_info` (CPU model,
    AVX-512, native bf16, GPU, commit marked dirty, load, torch version): the record's own
    values are kept, the missing ones filled in now."""
    machine = dict(record.get("machine") or {})
    device = machine.get("device", "cuda" if machine.get("gpu") else "cpu")
    for key, value in machine_info(device).items():
        machine.setdefault(key, value)
    return {**record, "machine": machine}
