"""Process-group set-up from torchrun's or SLURM's environment, and the few reductions we need.

torch.distributed is the engine; this module only reads the launcher's environment, picks the
backend (NCCL with one GPU per local rank when CUDA is there, else gloo) and wraps the
collectives the training loop uses.

Environment read, in order of preference:

- torchrun / TorchElastic: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.
- SLURM (``srun bigbatch train``): SLURM_PROCID (rank), SLURM_NTASKS (world size),
  SLURM_LOCALID (local rank), SLURM_JOB_NODELIST (its first host is the master) and
  MASTER_PORT (default 29500 + SLURM_JOB_ID % 1000 so that jobs sharing nodes do not collide).
- Neither: one process, no process group.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from bigbatch.errors import ConfigError

log = logging.getLogger(__name__)
_joined_a_group = False  # whether this process has been a rank of a multi-process job


@dataclass(frozen=True)
class LaunchEnv:
    """Where this process sits in the job, as the launcher described it."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    launcher: str = "none"  # torchrun | slurm | none
    local_world_size: int = 1  # training processes on this node


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    backend: str | None
    device: torch.device
    local_world_size: int = 1  # training processes on this node (they share its cores)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def launch_env(environ: dict[str, str] | None = None) -> LaunchEnv:
    """Read rank, world size and master address from torchrun's or SLURM's variables."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return LaunchEnv(
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            master_addr=env.get("MASTER_ADDR"),
            master_port=int(env["MASTER_PORT"]) if "MASTER_PORT" in env else None,
            launcher="torchrun",
            local_world_size=processes_on_this_node(env),
        )
    if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "127.0.0.1")
        job = int(env.get("SLURM_JOB_ID", "0"))
        return LaunchEnv(
            rank=int(env["SLURM_PROCID"]),
            world_size=int(env["SLURM_NTASKS"]),
            local_rank=int(env.get("SLURM_LOCALID", 0)),
            master_addr=env.get("MASTER_ADDR") or first_slurm_host(nodelist),
            master_port=int(env.get("MASTER_PORT", 29500 + job % 1000)),
            launcher="slurm",
            local_world_size=processes_on_this_node(env),
        )
    return LaunchEnv()


def processes_on_this_node(environ: dict[str, str] | None = None) -> int:
    """How many training processes share this node: torchrun's LOCAL_WORLD_SIZE, else SLURM's
    task count for this node (SLURM_TASKS_PER_NODE such as ``4(x2),2``, indexed by
    SLURM_NODEID), else 1."""
    env = os.environ if environ is None else environ
    if "LOCAL_WORLD_SIZE" in env:
        return max(1, int(env["LOCAL_WORLD_SIZE"]))
    if "SLURM_TASKS_PER_NODE" in env:
        counts = slurm_tasks_per_node(env["SLURM_TASKS_PER_NODE"])
        node = int(env.get("SLURM_NODEID", "0"))
        return max(1, counts[node] if node < len(counts) else counts[-1])
    return 1


def slurm_tasks_per_node(spec: str) -> list[int]:
    """Expand SLURM's compressed task counts: ``4(x2),2`` -> [4, 4, 2]."""
    counts = []
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise ConfigError(f"cannot read SLURM_TASKS_PER_NODE '{spec}'")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list such as ``gpu[003-010,012],cpu01`` -> ``gpu003``."""
    match = re.match(r"([^\[,]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        raise ConfigError(f"cannot read the SLURM node list '{nodelist}'; set MASTER_ADDR")
    prefix, ranges = match.groups()
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return f"{prefix}{first}"


BACKENDS = ("auto", "gloo", "nccl")  # auto: NCCL on GPUs, else gloo


def choose_backend(requested: str) -> str:
    if requested != "auto":
        if requested == "nccl" and not torch.cuda.is_available():
            raise ConfigError("backend 'nccl' needs CUDA GPUs; use --set backend=gloo")
        return requested
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_distributed(backend: str = "auto", timeout_seconds: float = 1800.0) -> DistContext:
    """Join the process group described by the environment (or run alone). A collective that
    waits ``timeout_seconds`` for a peer raises (torch's own default: 30 minutes)."""
    env = launch_env()
    chosen = choose_backend(backend)
    device = _device_for(chosen, env.local_rank)
    if env.world_size == 1:
        return DistContext(0, 1, 0, None, device, env.local_world_size)
    if env.launcher == "slurm":
        os.environ.setdefault("MASTER_ADDR", env.master_addr or "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(env.master_port))
    global _joined_a_group
    _joined_a_group = True
    if not dist.is_initialized():
        timeout = timedelta(seconds=timeout_seconds)
        dist.init_process_group(
            backend=chosen,
            rank=env.rank,
            world_size=env.world_size,
            timeout=timeout,
            store=elastic_attempt_store(env, timeout),
            device_id=device if chosen == "nccl" else None,
        )
    log.debug("rank %d/%d joined (%s, %s)", env.rank, env.world_size, chosen, env.launcher)
    return DistContext(env.rank, env.world_size, env.local_rank, chosen, device,
                       env.local_world_size)


def elastic_attempt_store(env: LaunchEnv, timeout: timedelta) -> dist.Store | None:
    """The agent's store under a prefix for this restart attempt, or None to use env://.

    torchrun's c10d rendezvous keeps one store server alive across restarts
    (TORCHELASTIC_USE_AGENT_STORE). The process group's keys (each rank's gloo address) are the
    same in every attempt, so after a restart a rank can read a dead peer's address from the
    attempt before and fail ("Connection refused") or hang. Keying the process group by the
    restart count keeps attempts apart. Every agent restarts together after a worker failure, so
    the count agrees across nodes; when nodes join or leave an elastic job mid-run their counts
    can differ: launch such jobs with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (a fresh store per
    attempt, and this function steps aside).
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or env.master_port is None:
        return None
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    agent_store = dist.TCPStore(
        env.master_addr or "127.0.0.1",
        env.master_port,
        world_size=env.world_size,
        is_master=False,
        timeout=timeout,
    )
    return dist.PrefixStore(f"bigbatch/attempt-{attempt}", agent_store)


def _device_for(backend: str, local_rank: int) -> torch.device:
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def exit_if_joined(code: int) -> None:
    """End a process that was a rank of a multi-process job now, with exit code ``code``, once
    its logs and output are flushed, without the interpreter's finalization; else return.

    DistributedDataParallel's reducer keeps the gloo process group, and its worker threads,
    alive after destroy_process_group (torch 2.14: three gloo threads remain in a process that
    wrapped a model, none in one that did not), so the interpreter finalizes with them running.
    CI saw a rank abort there after a run that succeeded ("terminate called without an active
    exception", signal 6), once, under load; not reproduced here, and taken to be such a thread
    meeting the finalizing interpreter. Nothing is left to do at this point (the run's files are
    closed, the process group destroyed), so the process ends here.
    """
    if not _joined_a_group:
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away, a closed stream
            pass
    os._exit(code)


def all_reduce_sum(tensor: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Sum a tensor over ranks in place (a no-op on one process)."""
    if ctx.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def average_buffers(module: torch.nn.Module, ctx: DistContext) -> None:
    """Average floating-point buffers (BatchNorm running statistics) over ranks, in one call.

    The paper averages BN running statistics across nodes before test and snapshot; doing the same
    keeps every rank's weights identical and, since each rank's running average is linear in its
    micro-batch statistics, equal to the single-process run's (see bigbatch.train.bn_stats).
    """
    if not ctx.distributed:
        return
    buffers = [b for b in module.buffers() if b.is_floating_point()]
    if not buffers:
        return
    flat = torch.cat([b.detach().reshape(-1) for b in buffers])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= ctx.world_size
    offset = 0
    for buffer in buffers:
        count = buffer.numel()
        buffer.copy_(flat[offset : offset + count].view_as(buffer))
        offset += count


def broadcast_object(obj: object, ctx: DistContext) -> object:
    """Rank 0's Python object, on every rank."""
    if not ctx.distributed:
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def all_gather_object(obj: object, ctx: DistContext) -> list[object]:
    """Every rank's Python object, in rank order, on every rank."""
    if not ctx.distributed:
        return [obj]
    gathered: list[object] = [None] * ctx.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()
