"""All-reduce time against message size for the current world, and its alpha-beta fit.

    torchrun --nproc-per-node 2 -m bigbatch bench allreduce --out allreduce.json
    python -m torch.distributed.run --nproc-per-node 4 -m bigbatch.commands.bench --max-bytes 64M

gloo on CPU, NCCL on GPUs (``--backend``). Each message size (float32 tensors, from
``--min-bytes`` to ``--max-bytes`` in steps of ``--factor``) is all-reduced ``--warmup`` times
untimed, then ``--repeats`` times timed; a repeat's time is the slowest rank's, and the size's time
is the median repeat.

Model and fit. The measured medians are fitted by t(n) = a + b n with a, b >= 0, a robust fit
that counts misses as factors (see fit_latency_bandwidth). For the ring algorithm used by the
planner (bigbatch.tools.plan), t(n) = 2(p-1) alpha + 2(p-1)/p n beta, hence

    alpha = a / (2(p-1))            seconds per message (one ring step)
    beta  = b p / (2(p-1))          seconds per byte on one link;  bandwidth = 8 / beta bit/s

Rank 0 prints the result as JSON and writes it to ``--out``; ``bigbatch plan --allreduce-json``
reads it.
"""

from __future__ import annotations

import logging
import math
import platform
import re
import statistics
import time

from bigbatch.errors import ConfigError

log = logging.getLogger(__name__)


_UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "KIB": 2**10, "M": 2**20, "MB": 2**20,
          "MIB": 2**20, "G": 2**30, "GB": 2**30, "GIB": 2**30}


MODEL = "t(n) = a + b n; ring: a = 2(p-1) alpha, b = 2(p-1)/p beta"


def parse_size(text: str) -> int:
    """Bytes in '4096', '1K', '64KB', '256M', '1GiB' (binary units)."""
    match = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS:
        raise ConfigError(f"cannot read the size '{text}'; write e.g. 1K, 64K, 256M")
    return int(match.group(1)) * _UNITS[unit]


def message_sizes(smallest: int, largest: int, factor: int) -> list[int]:
    """smallest, smallest*factor, ... up to largest (bytes; whole float32 elements)."""
    if factor not in (2, 4):
        raise ConfigError(f"--factor must be 2 or 4, got {factor}")
    if smallest < 4 or smallest % 4:
        raise ConfigError(f"--min must be a positive multiple of 4 bytes (one float32), "
                          f"got {smallest}")
    if largest < smallest:
        raise ConfigError(f"--max ({largest} bytes) is smaller than --min ({smallest} bytes)")
    sizes, size = [], smallest
    while size <= largest:
        sizes.append(size)
        size *= factor
    if len(sizes) < 2:
        raise ConfigError(f"--min {smallest} to --max {largest} gives one message size; the "
                          "fit needs at least two")
    return sizes


def log_deviation(a: float, b: float, sizes: list[float], seconds: list[float]) -> float:
    """sum |ln((a + b n) / t)| over the points: how far, by factors, the line misses them."""
    return sum(abs(math.log((a + b * n) / t)) for n, t in zip(sizes, seconds, strict=True))


def fit_latency_bandwidth(sizes: list[float], seconds: list[float]) -> tuple[float, float]:
    """(a, b) >= 0 for t = a + b n: the line through two measured points (or through one point
    with a = 0 or b = 0) that misses all points by the smallest sum of |ln(model / measured)|.

    Errors are counted as factors, so the small (latency-bound) messages fix a as much as the
    large ones fix b; absolute values of logs, so that an odd size, slow (a first message
    paying for TCP warm-up) or fast (a message that fits a token bucket's burst), does not drag
    the line away from the others, as a least-squares fit would.
    """
    if len(sizes) != len(seconds) or len(set(sizes)) < 2:
        raise ConfigError("the fit needs timings for at least two different message sizes")
    if any(not t > 0 for t in seconds) or any(not n > 0 for n in sizes):
        raise ConfigError("every message size and timing must be positive")
    candidates = []
    points = list(zip(sizes, seconds, strict=True))
    for i, (n1, t1) in enumerate(points):
        candidates += [(0.0, t1 / n1), (t1, 0.0)]
        for n2, t2 in points[i + 1:]:
            if n1 != n2:
                b = (t2 - t1) / (n2 - n1)
                candidates.append((t1 - b * n1, b))
    feasible = [(a, b) for a, b in candidates if a >= 0 and b >= 0 and a + b > 0]
    return min(feasible, key=lambda ab: log_deviation(ab[0], ab[1], sizes, seconds))


def ring_alpha_beta(a: float, b: float, world_size: int) -> tuple[float, float]:
    """alpha and beta of the ring model from the fitted intercept a and slope b."""
    if world_size < 2:
        raise ConfigError("alpha and beta need at least 2 processes")
    return a / (2 * (world_size - 1)), b * world_size / (2 * (world_size - 1))


def fit_record(sizes: list[int], seconds: list[float], world_size: int) -> dict:
    a, b = fit_latency_bandwidth([float(s) for s in sizes], seconds)
    alpha, beta = ring_alpha_beta(a, b, world_size)
    residuals = [abs(a + b * n - t) / t for n, t in zip(sizes, seconds, strict=True)]
    return {
        "latency_s": a,
        "seconds_per_byte": b,
        "alpha_s": alpha,
        "beta_s_per_byte": beta,
        "bandwidth_gbit_s": 8.0 / beta / 1e9 if beta > 0 else math.inf,
        "max_relative_residual": max(residuals),
    }


def time_allreduce(nbytes: int, repeats: int, warmup: int, device) -> list[float]:
    """Per-repeat all-reduce seconds of ``nbytes`` (the slowest rank's), after a warm-up."""
    import torch
    import torch.distributed as dist

    tensor = torch.ones(nbytes // 4, dtype=torch.float32, device=device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        dist.all_reduce(tensor)
    sync()
    local = []
    for _ in range(repeats):
        dist.barrier()
        started = time.perf_counter()
        dist.all_reduce(tensor)
        sync()
        local.append(time.perf_counter() - started)
    slowest = torch.tensor(local, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.cpu().tolist()


def run_benchmark(sizes: list[int], repeats: int, warmup: int, ctx) -> dict:
    """Median all-reduce time per size over the process group, and the alpha-beta fit."""
    import torch

    medians, minima = [], []
    for nbytes in sizes:
        times = time_allreduce(nbytes, repeats, warmup, ctx.device)
        medians.append(statistics.median(times))
        minima.append(min(times))
        log.info("%12d bytes: median %.6f s over %d repeats", nbytes, medians[-1], repeats)
    return {
        "benchmark": "allreduce",
        "backend": ctx.backend,
        "world_size": ctx.world_size,
        "device": str(ctx.device),
        "dtype": "float32",
        "repeats": repeats,
        "warmup": warmup,
        "host": platform.node(),
        "torch": torch.__version__,
        "sizes_bytes": sizes,
        "median_seconds": medians,
        "min_seconds": minima,
        "model": MODEL,
        "fit": fit_record(sizes, medians, ctx.world_size),
    }
