"""Helpers for tests that run bigbatch as real processes (one process, torchrun, two agents)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bigbatch.local_launch import free_port, rank_env

# A tiny but real run: 1024 Fashion-MNIST images, global batch 256 in micro-batches of 64,
# evaluated on the first VAL_EXAMPLES test images (the whole test set costs a quarter of a run).
# LR 0.5: runs on different process layouts differ only in the order in which micro-batch
# gradients are summed (1e-7 after a step), and at LR 2 the BatchNorm and bias tensors (plain
# SGD at the global LR) amplified that ~2.5x a step, to 5e-4 after 8 steps on an AVX2 machine;
# at 0.5 it stays at 3e-7, so the 1e-5 invariance checks test the engine, not the dynamics.
VAL_EXAMPLES = 1000
TINY = [
    "--dataset",
    "fashion-mnist",
    "--train-subset",
    "1024",
    "--val-subset",
    str(VAL_EXAMPLES),
    "--batch-size",
    "256",
    "--micro-batch",
    "64",
    "--epochs",
    "2",
    "--lr",
    "0.5",
    "--warmup-epochs",
    "0.5",
    "--model",
    "small_resnet",
    "--set",
    "model.options.width=8",
    "--set",
    "eval_every=100",
    "--set",
    "channels_last=false",
    "--set",
    "precision=fp32",
    # The settings these runs were calibrated with, whatever the default recipe says: BN and
    # bias tensors outside LARS (the note above) and training augmentation on (so the engine's
    # runs exercise it), and one process where no launcher starts more (not the recipe's
    # local_processes=auto).
    "--set",
    "optim.exclude_bn_and_bias=true",
    "--set",
    "data.augment=true",
    "--set",
    "local_processes=1",
]


def process_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    env.pop("BIGBATCH_FAULT", None)
    env.update(extra or {})
    return env


def torchrun_prefix(nproc: int, max_restarts: int = 0) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        f"--max-restarts={max_restarts}",
        "-m",
        "bigbatch",
    ]


def run_bigbatch(
    args: list[str],
    nproc: int = 1,
    env: dict[str, str] | None = None,
    max_restarts: int = 0,
    timeout: float = 300,
    check: bool = True,
    agent: bool = True,
):
    """Run `bigbatch ...` as one process or ``nproc`` ranks; return the CompletedProcess.

    Ranks run under torchrun, or with ``agent=False`` as ``nproc`` processes given the variables
    torchrun gives its workers, without its agent process (one `import torch` fewer; for runs
    where neither restarts nor the agent's rendezvous are under test). A one-process `train`
    gets ``--set local_processes=1`` first (a test's own setting, later, wins).
    """
    if nproc == 1 and args[:1] == ["train"]:  # one process means one: the default recipe's
        args = ["train", "--set", "local_processes=1", *args[1:]]  # auto would start more
    if nproc == 1 and max_restarts == 0:
        command = bigbatch_command(args)
    elif not agent and max_restarts == 0:
        return run_ranks_without_agent(args, nproc, env, timeout, check)
    else:
        command = [*torchrun_prefix(nproc, max_restarts), *args]
    result = subprocess.run(
        command, env=process_env(env), capture_output=True, text=True, timeout=timeout
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(command)} exited {result.returncode}:\n{result.stderr[-4000:]}"
        )
    return result


# After one rank fails, how long the others may take to notice (gloo: about 30 s) before they
# are killed, as torchrun's agent would kill them.
FAILED_RANK_GRACE_SECONDS = 60


def bigbatch_command(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "bigbatch", *args]


def run_ranks_without_agent(args: list[str], nproc: int, env: dict[str, str] | None,
                            timeout: float, check: bool) -> subprocess.CompletedProcess:
    """``nproc`` ranks of `bigbatch ARGS` (start_ranks); the result's exit code is the first
    non-zero one (else 0), its stdout rank 0's, its stderr every rank's in order."""
    command = bigbatch_command(args)
    results = finish_ranks(start_ranks([command] * nproc, env), timeout)
    codes = [code for code, _, _ in results]
    code = next((c for c in codes if c != 0), 0)
    stderr = "".join(err for _, _, err in results)
    if check and code != 0:
        raise AssertionError(f"{nproc} ranks of {' '.join(command)} exited {codes}:\n"
                             + stderr[-4000:])
    return subprocess.CompletedProcess(command, code, results[0][1], stderr)


class Rank(subprocess.Popen):
    """One rank's process, its stdout and stderr going to files (a pipe nobody reads while
    another rank is waited for could fill and stall both ranks)."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.logs = (tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+"))
        super().__init__(command, stdout=self.logs[0], stderr=self.logs[1], env=env)

    def output(self) -> tuple[str, str]:
        texts = []
        for log in self.logs:
            log.seek(0)
            texts.append(log.read())
            log.close()
        return texts[0], texts[1]


def start_ranks(commands: list[list[str]], env: dict[str, str] | None = None) -> list[Rank]:
    """One process per command, rank i running commands[i], with the variables torchrun
    --standalone gives its workers (rank_env, as `bigbatch train --local-processes` gives them;
    not TORCHELASTIC_USE_AGENT_STORE: with no agent, rank 0 hosts the store)."""
    port = free_port()
    return [Rank(command, process_env({**(env or {}), **rank_env(rank, len(commands), port)}))
            for rank, command in enumerate(commands)]


def finish_ranks(ranks: list[Rank], timeout: float = 300) -> list[tuple[int, str, str]]:
    """(exit code, stdout, stderr) of each rank, in rank order, once all have exited. Every
    rank is killed at ``timeout``, and the others FAILED_RANK_GRACE_SECONDS after one fails."""
    deadline = time.monotonic() + timeout
    while any(rank.poll() is None for rank in ranks):
        if any(rank.returncode not in (None, 0) for rank in ranks):
            deadline = min(deadline, time.monotonic() + FAILED_RANK_GRACE_SECONDS)
        if time.monotonic() > deadline:
            for rank in ranks:
                if rank.poll() is None:
                    rank.kill()
        time.sleep(0.1)
    return [(rank.wait(), *rank.output()) for rank in ranks]


def final_state(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "final.pt", map_location="cpu", weights_only=True)["model"]


def train_losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r.get("kind") == "train"]


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def max_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest |a - b| / (|b| + 1e-12), over every floating-point tensor of two state_dicts."""
    assert a.keys() == b.keys()
    worst = 0.0
    for key, tensor in a.items():
        if not tensor.is_floating_point():
            assert torch.equal(tensor, b[key]), key
            continue
        scale = b[key].abs().max().item() + 1e-12
        worst = max(worst, (tensor - b[key]).abs().max().item() / scale)
    return worst
