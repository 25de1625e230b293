"""The all-reduce benchmark: size parsing, the alpha-beta fit, a real 2-process gloo run."""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from bigbatch.commands.bench import add_commands, run_allreduce_bench
from bigbatch.errors import ConfigError
from bigbatch.local_launch import free_port
from bigbatch.tools.allreduce_bench import (
    fit_latency_bandwidth,
    fit_record,
    message_sizes,
    parse_size,
    ring_alpha_beta,
)
from bigbatch.tools.plan.network import ring_allreduce_seconds

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_parse_size_reads_binary_units():
    assert parse_size("4096") == 4096
    assert parse_size("1K") == 1024
    assert parse_size("64KB") == 65536
    assert parse_size("256M") == 256 * 2**20
    assert parse_size("1GiB") == 2**30
    for bad in ("", "1.5M", "12Q", "-4K"):
        with pytest.raises(ConfigError, match="cannot read the size"):
            parse_size(bad)


def test_message_sizes_are_powers_of_the_factor():
    assert message_sizes(1024, 16384, 2) == [1024, 2048, 4096, 8192, 16384]
    assert message_sizes(1024, 2**28, 4)[-1] == 2**28
    assert len(message_sizes(1024, 2**28, 4)) == 10
    with pytest.raises(ConfigError, match="2 or 4"):
        message_sizes(1024, 4096, 3)
    with pytest.raises(ConfigError, match="smaller than"):
        message_sizes(4096, 1024, 2)
    with pytest.raises(ConfigError, match="multiple of 4"):
        message_sizes(6, 1024, 2)
    with pytest.raises(ConfigError, match="at least two"):
        message_sizes(1024, 2047, 2)


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_fit_recovers_alpha_and_beta_from_ring_timings(world_size):
    alpha, beta = 50e-6, 8.0 / 10e9  # 50 us, 10 Gbit/s
    rng = random.Random(world_size)
    sizes = [1024 * 4**k for k in range(10)]
    times = [ring_allreduce_seconds(n, world_size, alpha, beta) * (1 + rng.uniform(-0.02, 0.02))
             for n in sizes]
    a, b = fit_latency_bandwidth([float(n) for n in sizes], times)
    fitted_alpha, fitted_beta = ring_alpha_beta(a, b, world_size)
    assert fitted_alpha == pytest.approx(alpha, rel=0.05)
    assert fitted_beta == pytest.approx(beta, rel=0.05)


def test_fit_ignores_one_odd_size():
    alpha, beta = 100e-6, 1e-9
    sizes = [1024 * 4**k for k in range(8)]
    times = [ring_allreduce_seconds(n, 2, alpha, beta) for n in sizes]
    times[0] *= 30  # a first message that paid for connection warm-up
    times[3] /= 10  # a message that fit in a token bucket's burst
    a, b = fit_latency_bandwidth([float(n) for n in sizes], times)
    assert ring_alpha_beta(a, b, 2) == pytest.approx((alpha, beta), rel=1e-6)


def test_fit_is_exact_on_noiseless_data_and_keeps_parameters_non_negative():
    sizes = [1e3, 1e4, 1e5, 1e6]
    a, b = fit_latency_bandwidth(sizes, [1e-4 + 2e-9 * n for n in sizes])
    assert a == pytest.approx(1e-4) and b == pytest.approx(2e-9)
    # Timings that fall with size would need b < 0: the fit keeps b = 0 (a constant).
    a, b = fit_latency_bandwidth(sizes, [4e-3, 3e-3, 2e-3, 1e-3])
    assert b == 0.0 and a > 0
    # A pure bandwidth line through the origin gives a = 0.
    a, b = fit_latency_bandwidth(sizes, [3e-9 * n for n in sizes])
    assert a == pytest.approx(0.0, abs=1e-12) and b == pytest.approx(3e-9)


def test_fit_rejects_too_little_or_bad_data():
    with pytest.raises(ConfigError, match="two different"):
        fit_latency_bandwidth([1e3, 1e3], [1e-3, 1e-3])
    with pytest.raises(ConfigError, match="positive"):
        fit_latency_bandwidth([1e3, 1e4], [1e-3, 0.0])


def parse_bench(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bigbatch")
    add_commands(parser.add_subparsers())
    return parser.parse_args(["bench", "allreduce", *argv])


def test_bench_needs_two_processes(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    args = parse_bench(["--max-bytes", "64K"])
    with pytest.raises(ConfigError, match="at least 2 processes"):
        args.handler(args)


@pytest.mark.parametrize("argv, message", [
    (["--min-bytes", "64K", "--max-bytes", "1K"], "smaller than"),
    (["--max", "lots"], "cannot read"),
    (["--factor", "8"], "2 or 4"),
    (["--repeats", "0"], "repeats"),
])
def test_bad_bench_options_are_config_errors(argv, message):
    with pytest.raises(ConfigError, match=message):
        run_allreduce_bench(parse_bench(argv))


@pytest.mark.slow
def test_two_gloo_processes_produce_a_fit(tmp_path):
    out = tmp_path / "ar.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
               "-m", "bigbatch.commands.bench", "--min-bytes", "1K", "--max-bytes", "4M",
               "--repeats", "5", "--backend", "gloo", "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    printed = json.loads(result.stdout)
    saved = json.loads(out.read_text())
    assert printed == saved
    assert saved["world_size"] == 2 and saved["backend"] == "gloo"
    assert saved["sizes_bytes"] == message_sizes(1024, 4 * 2**20, 4)
    assert all(t > 0 for t in saved["median_seconds"])
    fit = saved["fit"]
    assert fit["alpha_s"] > 0 and fit["beta_s_per_byte"] > 0
    assert fit["bandwidth_gbit_s"] == pytest.approx(8 / fit["beta_s_per_byte"] / 1e9)
    assert fit["alpha_s"] == pytest.approx(fit["latency_s"] / 2)  # p=2: a = 2(p-1) alpha
    # The fit is the fit of these very medians, and a 4 MiB message takes longer than a 1 KiB one
    # (2x longer on a quiet machine; 1.98x was seen beside other multi-process tests, whose
    # scheduling noise lengthens the small messages most, so only the order is asserted).
    assert fit == pytest.approx(fit_record(saved["sizes_bytes"], saved["median_seconds"], 2))
    assert saved["median_seconds"][-1] > saved["median_seconds"][0]
    # Loopback on one machine: between a slow NIC and memory bandwidth (the machine is shared,
    # so nothing tighter holds every time).
    assert 0.01 < fit["bandwidth_gbit_s"] < 2000


@pytest.mark.slow
def test_shaped_namespace_bench_skips_or_measures_the_shaping(tmp_path):
    """Inside a namespace throttled to 100 Mbit/s the fitted bandwidth is near 100 Mbit/s."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from netns import namespace_unavailable, netns_exec, shaped_namespace
    finally:
        sys.path.remove(str(BENCHMARKS))
    reason = namespace_unavailable()
    if reason is not None:
        pytest.skip(reason)
    out = tmp_path / "ar.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    with shaped_namespace(f"bbtest{os.getpid() % 10000}", rate="100mbit") as namespace:
        command = [*netns_exec(namespace), sys.executable, "-m", "torch.distributed.run",
                   "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
                   str(free_port()), "-m", "bigbatch.commands.bench", "--min-bytes", "4K",
                   "--max-bytes", "4M", "--repeats", "3", "--warmup", "1", "--backend", "gloo",
                   "--out", str(out)]
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120,
                                check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    fit = json.loads(out.read_text())["fit"]
    # Two ranks share the one 100 Mbit/s qdisc, so each ring link gets about half of it; the
    # token bucket's burst lets the first bytes of each message through at loopback speed, which
    # lifts the fit above 50 (66.8 Mbit/s seen in CI with a 256 kB burst). Unshaped loopback fits
    # at Gbit/s, and no fit of a link throttled to 100 Mbit/s can honestly exceed 100.
    assert 30 < fit["bandwidth_gbit_s"] * 1000 < 100
