"""The fault matrix: bigbatch trained by torchrun agents on namespace nodes, with a fault at a step.

Every scenario trains the same small run (the default model on 6,144 Fashion-MNIST images, global
batch 768 in micro-batches of 128 (a multiple of 1, 2 and 3 processes), 24 steps, a checkpoint
every 4, exact_reduction, fp32, one thread per process) on nodes of one process each, injects its
fault when the run's metrics reach ``FAULT_STEP``, and returns a row: whether it finished, how many
times the job re-formed, seconds from the fault to the first line that named it (detect) and to the
first step trained after it (recover), and whether the final weights, BatchNorm statistics and
per-step losses are bit-identical to the same run on one process. tests/test_cluster.py asserts on
the rows; benchmarks/cluster_faults.py records them (docs/results/cluster_faults.jsonl).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

import torch
from netns_cluster import Cluster, wait_for

FAULT_STEP, STEPS = 8, 24
TIMEOUT = 15  # collective_timeout of the runs, seconds
RDZV_PORT = 29400
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
TRAIN = [
    "-m", "bigbatch", "train", "--dataset", "fashion-mnist", "--train-subset", "6144",
    "--val-subset", "1000", "--batch-size", "768", "--micro-batch", "128", "--epochs", "3",
    "--warmup-epochs", "1", "--checkpoint-every", "4", "--resume", "auto",
    "--set", "exact_reduction=true", "--set", "precision=fp32", "--set", "channels_last=false",
    "--set", "threads=1", "--set", "local_processes=1", "--set", "data.workers=0",
    "--set", "eval_every=100", "--set", f"collective_timeout={TIMEOUT}",
    "--set", "log.progress_every_steps=1", "--set", "log.straggler_probe_every_steps=4",
]
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def reference_run(out: Path) -> Path:
    """The same run on one process, no launcher: what every scenario must reproduce."""
    if not (out / "final.pt").is_file():
        subprocess.run([sys.executable, *TRAIN, "--out", str(out)], check=True,
                       env={**os.environ, **ENV}, capture_output=True, timeout=600)
    return out


def agent_command(cluster: Cluster, index: int, run_dir: Path, nnodes: str,
                  extra_set: tuple[str, ...] = ()) -> list[str]:
    """torchrun on node ``index``; node 1 hosts the rendezvous store."""
    host = "true" if index == 1 else "false"
    command = [*TORCHRUN, "--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"{cluster.node(1).address}:{RDZV_PORT}", "--rdzv-id", "faults",
               "--rdzv-conf", f"is_host={host},last_call_timeout=3,join_timeout=60",
               "--local-addr", cluster.node(index).address, "--max-restarts", "3",
               "--monitor-interval", "0.5", *TRAIN, "--out", str(run_dir)]
    for assignment in extra_set:
        command += ["--set", assignment]
    return command


def train_records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            continue
    return [r for r in records if r.get("kind") == "train"]


def last_step(run_dir: Path) -> int:
    return max((r["step"] for r in train_records(run_dir)), default=0)


def same_run(run_dir: Path, reference: Path) -> dict[str, bool]:
    """Final weights + BatchNorm statistics, and the per-step losses, against the reference."""
    mine, theirs = (torch.load(d / "final.pt", map_location="cpu", weights_only=True)["model"]
                    for d in (run_dir, reference))
    tensors = mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    steps = [r["step"] for r in train_records(run_dir)]
    losses = ({r["step"]: r["loss"] for r in train_records(run_dir)}
              == {r["step"]: r["loss"] for r in train_records(reference)})
    return {"weights_and_bn": tensors, "losses": losses,
            "continuous_steps": steps == list(range(1, STEPS + 1))}


def log_text(process: subprocess.Popen) -> str:
    return Path(process.log_path).read_text(errors="replace")


def seconds_until(process: subprocess.Popen, pattern: str, since: float, timeout: float,
                  after: int = 0) -> float | None:
    """Seconds from ``since`` until the log has more than ``after`` matches of ``pattern``."""
    try:
        wait_for(lambda: len(re.findall(pattern, log_text(process))) > after, timeout,
                 what=pattern)
    except TimeoutError:
        return None
    return time.monotonic() - since


@dataclass
class Scenario:
    """One row of the matrix: how many nodes, the fault, and what the row records."""

    name: str
    nodes: int
    fault: Callable[[Cluster, dict], None] | None = None
    setup: Callable[[Cluster], None] | None = None  # before the agents start (link shaping)
    nnodes: str = "1:{n}"
    late: tuple[int, ...] = ()  # nodes whose agents start at the fault instead of at the start
    extra_set: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    survivor: int = 1  # the node whose log tells detection and recovery
    relaunch: bool = False  # the job stops; start the agents again and let them resume


def run_scenario(scenario: Scenario, work: Path, reference: Path, net: int) -> dict:
    """Train under ``scenario``; its row."""
    run_dir = work / scenario.name / "run"
    row = {"scenario": scenario.name, "nodes": scenario.nodes, "steps": STEPS}
    with Cluster(scenario.nodes, net=net, log_dir=work / scenario.name / "logs") as cluster:
        if scenario.setup is not None:
            scenario.setup(cluster)
        agents = start_agents(cluster, scenario, run_dir, exclude=scenario.late)
        wait_for(lambda: last_step(run_dir) >= FAULT_STEP or any_exited(agents), 240,
                 what=f"step {FAULT_STEP}")
        fault_at, state = time.monotonic(), {"agents": agents, "run_dir": run_dir}
        if scenario.fault is not None:
            scenario.fault(cluster, state)
        if scenario.late:
            agents.update(start_agents(cluster, scenario, run_dir, only=scenario.late))
        row.update(follow(agents[scenario.survivor], fault_at, resumes=not scenario.relaunch))
        row["exit_codes"] = finish(cluster, agents, scenario)
        every = list(agents.values())
        if scenario.relaunch and not (run_dir / "summary.json").is_file():
            row["stop_line"] = last_error_line(agents)
            again = start_agents(cluster, scenario, run_dir, suffix="-again")
            row["recover_seconds"] = seconds_until(again[scenario.survivor], "resumed from",
                                                   fault_at, 4 * TIMEOUT)
            row["exit_codes_again"] = finish(cluster, again, scenario)
            every += list(again.values())
        row["restarts"] = sum(log_text(agent).count("resumed from") for agent in every)
        row["stragglers"] = summary(run_dir).get("stragglers")
        row["sent_bytes_per_step"] = cluster.sent_bytes(scenario.survivor) / STEPS
        exposed = [r["time_comm_exposed"] for r in train_records(run_dir)]
        row["comm_exposed_median"] = median(exposed) if exposed else None
    row["leftover_namespaces"] = cluster.leftovers()
    row["finished"] = (run_dir / "summary.json").is_file()
    row.update(same_run(run_dir, reference) if row["finished"] else {})
    row["bit_identical"] = bool(row["finished"] and row["weights_and_bn"] and row["losses"])
    return row


def start_agents(cluster: Cluster, scenario: Scenario, run_dir: Path, exclude=(), only=None,
                 suffix: str = "") -> dict[int, subprocess.Popen]:
    nodes = only or [i for i in range(1, scenario.nodes + 1) if i not in exclude]
    nnodes = scenario.nnodes.format(n=scenario.nodes)
    return {i: cluster.start(i, agent_command(cluster, i, run_dir, nnodes, scenario.extra_set),
                             env={**os.environ, **ENV, **scenario.env},
                             log_name=f"node{i}{suffix}.log") for i in nodes}


def any_exited(agents: dict[int, subprocess.Popen]) -> bool:
    return any(agent.poll() is not None for agent in agents.values())


def follow(survivor: subprocess.Popen, fault_at: float, resumes: bool = True) -> dict:
    """Detection: the survivor's first error line after the fault; recovery: its next resume
    (``resumes``: the survivor is expected to go on by itself)."""
    errors_before = len(re.findall(r"ERROR|failed \(exitcode", log_text(survivor)))
    resumes_before = log_text(survivor).count("resumed from")
    detect = seconds_until(survivor, r"ERROR|failed \(exitcode", fault_at, 3 * TIMEOUT,
                           after=errors_before)
    recover = (seconds_until(survivor, "resumed from", fault_at, 4 * TIMEOUT,
                             after=resumes_before) if detect is not None and resumes else None)
    return {"detect_seconds": detect, "recover_seconds": recover}


def finish(cluster: Cluster, agents: dict[int, subprocess.Popen], scenario: Scenario,
           timeout: float = 240) -> dict[int, int | None]:
    """Wait for the agents that can finish; kill the rest (a frozen or cut-off node)."""
    deadline = time.monotonic() + timeout
    for index, agent in agents.items():
        while agent.poll() is None and time.monotonic() < deadline:
            if index != scenario.survivor and agents[scenario.survivor].poll() is not None:
                break  # the survivor is done: the other is frozen, cut off or waiting
            time.sleep(0.5)
    codes = {index: agent.poll() for index, agent in agents.items()}
    for index in agents:
        cluster.kill(index)
    return codes


def last_error_line(agents: dict[int, subprocess.Popen]) -> str | None:
    lines = [line for agent in agents.values() for line in log_text(agent).splitlines()
             if " ERROR " in line and "[rank" in line]
    return lines[-1] if lines else None


def summary(run_dir: Path) -> dict:
    path = run_dir / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {}


# ----------------------------------------------------------------------------- the matrix


def cut_for(seconds: float) -> Callable[[Cluster, dict], None]:
    def fault(cluster: Cluster, state: dict) -> None:
        cluster.cut(2)
        threading.Timer(seconds, cluster.restore, (2,)).start()
    return fault


def shaped(rates: dict[int, str]) -> Callable[[Cluster], None]:
    def setup(cluster: Cluster) -> None:
        for index, rate in rates.items():
            cluster.shape(index, rate)
    return setup


SCENARIOS = {scenario.name: scenario for scenario in (
    Scenario("clean", 2),
    Scenario("shaped_200mbit", 2, setup=shaped({1: "200mbit", 2: "200mbit"})),
    Scenario("link_cut", 2, fault=lambda cluster, state: cluster.cut(2)),
    Scenario("link_cut_10s", 2, fault=cut_for(10.0)),
    Scenario("node_frozen", 2, fault=lambda cluster, state: cluster.freeze(2)),
    Scenario("store_host_killed", 2, fault=lambda cluster, state: cluster.kill(1), survivor=2,
             relaunch=True),
    Scenario("node_joins", 2, late=(2,)),
    Scenario("killed_in_checkpoint", 2,
             env={"BIGBATCH_FAULT": f"kill-in-checkpoint:step={FAULT_STEP}:rank=0"}),
    Scenario("straggler_link", 3, setup=shaped({1: "1gbit", 2: "1gbit", 3: "100mbit"})),
)}
