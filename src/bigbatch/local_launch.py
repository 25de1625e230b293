"""`bigbatch train` as several data-parallel processes on one machine, started by bigbatch itself.

On a CPU, one training process spreading each operator over all cores leaves them idle in the
many small operators of a small model (BatchNorm, ReLU, convolutions on 4x4-14x14 maps). W
processes of cores / W intra-op threads each, one data-parallel rank each, keep them busier: on a
2-core AMD EPYC (Zen 4), two one-thread ranks trained the default recipe at 1.32x the images a
second of one process with two threads in bf16, and 1.12x in fp32 with the kernels held to AVX2
(docs/results/local_processes.jsonl). The global batch, the micro-batch and the seed
define the run whatever W is (bigbatch.geometry), so this changes the speed, not the recipe.

``local_processes: N`` starts N ranks here with the variables torchrun gives its workers (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and OMP_NUM_THREADS, the
intra-op threads of each rank (:func:`threads_per_rank`). ``auto``: as many as there are usable
cores, lowered to a divisor of the micro-batches per global step (B / b), where no GPU is
visible (where one is: 1; start one process per GPU with torchrun). Under torchrun or SLURM
(even a one-task SLURM job: its cores are the task's), the launcher decides and the setting is
ignored.

This process becomes rank 0 and starts ranks 1..N-1 as child processes in its process group (a
terminal's Ctrl-C and SLURM's signals reach them all); a preemption signal sent to this process
alone stops them all too, since the ranks vote on stopping at every step
(bigbatch.train.preemption). At its end it waits for them. The command's exit code is that of
the rank whose failure ended the others (a rank that had failed before rank 0 ended, else
rank 0, else another; a peer-lost code only where no rank has another), so 75 for a run
stopped by a preemption signal, as in one process, and the crashed rank's own code where one
crashed; ranks still running FAILED_RANK_GRACE_SECONDS
after rank 0 ended are killed (a failed peer can leave them waiting) and count as failed.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time

from bigbatch.config import RunConfig
from bigbatch.data.loader import available_cores
from bigbatch.errors import EXIT_PEER_LOST
from bigbatch.geometry import BatchGeometry

log = logging.getLogger(__name__)

FAILED_RANK_GRACE_SECONDS = 30.0


def local_processes(cfg: RunConfig, environ: dict[str, str] | None = None) -> int:
    """How many ranks this command should start here: 1 when a launcher started it or the
    setting asks for one, else ``local_processes`` (``auto``: the cores, see the module)."""
    env = os.environ if environ is None else environ
    if "RANK" in env or "SLURM_PROCID" in env:  # started by torchrun (or as a rank), or by SLURM
        return 1
    if cfg.local_processes != "auto":
        return int(cfg.local_processes)
    import torch

    if torch.cuda.is_available():
        return 1
    per_step = BatchGeometry(cfg.global_batch, cfg.micro_batch).micro_batches_per_step
    return max(w for w in range(1, available_cores() + 1) if per_step % w == 0)


def threads_per_rank(cfg: RunConfig, processes: int, environ: dict[str, str] | None = None,
                     cores: int | None = None) -> tuple[int, list[str]]:
    """The intra-op threads each of ``processes`` ranks here runs with, and the lines to say
    about them at start-up.

    ``threads`` where set; else with ``local_processes: auto`` cores // processes, in place of an
    OMP_NUM_THREADS from the environment (set for one process: on a cluster often the node's or
    the task's cores); else OMP_NUM_THREADS where set, else cores // processes. More threads in
    all than cores is said in one line: OpenMP threads wait for descheduled ones at every
    operator, and steps slow down several-fold.
    """
    env = os.environ if environ is None else environ
    cores = available_cores() if cores is None else cores
    share = max(1, cores // processes)
    inherited = _leading_int(env.get("OMP_NUM_THREADS", ""))
    lines = []
    if cfg.threads is not None:
        threads = cfg.threads
    elif cfg.local_processes == "auto" or inherited is None:
        threads = share
        if inherited is not None and inherited != share:
            lines.append(f"OMP_NUM_THREADS={inherited} from the environment replaced by {share} "
                         f"per rank ({processes} ranks on {cores} cores, local_processes: auto)")
    else:
        threads = inherited
    if threads * processes > cores:
        lines.append(f"{processes} training processes x {threads} intra-op threads on {cores} "
                     f"cores oversubscribe them (steps can be several times slower): set "
                     f"threads={share} or local_processes=auto")
    return threads, lines


def _leading_int(value: str) -> int | None:
    """OMP_NUM_THREADS's first level ("4" or "4,2"), None where unset or not a positive number."""
    head = value.split(",")[0].strip()
    return int(head) if head.isdigit() and int(head) > 0 else None


def start_local_ranks(argv: list[str], processes: int, cfg: RunConfig) -> list[subprocess.Popen]:
    """Make this process rank 0 of a ``processes``-rank job on this machine and start the other
    ranks, each running ``bigbatch argv``; return them, for :func:`finish_local_ranks`."""
    import torch

    threads, lines = threads_per_rank(cfg, processes)
    for line in lines:
        log.warning("%s", line)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    log.info("starting %d training processes on this machine, %d intra-op thread(s) each "
             "(local_processes)", processes, threads)
    port = free_port()
    ranks = [subprocess.Popen([sys.executable, "-m", "bigbatch", *argv],
                              env={**env, **rank_env(rank, processes, port)})
             for rank in range(1, processes)]
    os.environ.update(rank_env(0, processes, port))
    torch.set_num_threads(threads)
    return ranks


def finish_local_ranks(ranks: list[subprocess.Popen], code: int) -> int:
    """Wait for the ranks this process started, after its own end with exit code ``code``;
    return the job's, the code of the failure that ended the others: of the ranks' non-zero
    codes, in the order (ranks that had failed when this one ended, this one, the others), the
    first that is not EXIT_PEER_LOST (which a rank reports when another failed, and can report
    before the failed one's process has ended), else the first non-zero, else 0. Ranks still
    running FAILED_RANK_GRACE_SECONDS from now are killed."""
    failed_first = [rank for rank in ranks if rank.poll()]
    deadline = time.monotonic() + FAILED_RANK_GRACE_SECONDS
    for rank in ranks:
        try:
            rank.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            rank.kill()
            rank.wait()
    later = [rank for rank in ranks if rank not in failed_first]
    codes = [rank.returncode for rank in failed_first] + [code] + [r.returncode for r in later]
    return job_exit_code(codes)


def job_exit_code(codes: list[int]) -> int:
    """The first non-zero code that is not EXIT_PEER_LOST, else the first non-zero, else 0."""
    failures = [c for c in codes if c]
    return next((c for c in failures if c != EXIT_PEER_LOST), failures[0] if failures else 0)


def rank_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """What torchrun tells a worker of a one-node job."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port)}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
