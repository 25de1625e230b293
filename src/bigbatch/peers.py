"""Who the other ranks are, whether they still answer, and which one stopped.

Every rank writes a small heartbeat — the global step it reached, its host and the time — into
the process group's key-value store (the rendezvous store under torchrun), at most once every
few seconds. When a collective fails (a peer's link died, its machine froze or its process was
killed, and the collective timed out or lost its connection), the rank reads every heartbeat and
names the ranks that did not reach the step it is at, or that have been silent longest, with
their hosts: one line instead of a traceback from inside the communication library. The
command then exits with ``bigbatch.errors.EXIT_PEER_LOST``, and an elastic launcher (torchrun)
re-forms the job from the last checkpoint with the nodes that still answer.

A host is named by its hostname and the address this rank uses towards the rendezvous store
(``MASTER_ADDR``), since nodes can share a hostname (containers, network namespaces).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from bigbatch.distributed import DistContext

log = logging.getLogger(__name__)

KEY = "peer/{rank}"
# Messages of a collective that lost a peer (gloo's and c10d's wording).
LOST_PEER_SIGNS = ("Timed out waiting", "Connection reset", "Connection closed", "Broken pipe",
                   "Connection refused", "connection closed", "timed out", "Socket Timeout",
                   "No route to host")


@dataclass(frozen=True)
class Heartbeat:
    rank: int
    step: int
    host: str
    time: float  # seconds since the epoch, on the writer's clock


def host_label(master_addr: str | None = None) -> str:
    """This machine's hostname and the address it reaches the rendezvous store from."""
    name = socket.gethostname()
    target = master_addr or os.environ.get("MASTER_ADDR")
    if not target:
        return name
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))  # UDP: picks the route, sends nothing
            address = probe.getsockname()[0]
    except OSError:
        return name
    return f"{name} ({address})"


def lost_peer(error: BaseException) -> bool:
    """Whether ``error`` is a collective that lost its peer (not a bug in this process)."""
    if isinstance(error, getattr(dist, "DistError", ())):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(sign in text for sign in LOST_PEER_SIGNS)


class PeerLost(RuntimeError):
    """A collective lost a peer; the message is the one line that names it."""


class PeerWatch:
    """Heartbeats of this rank into ``store``, and the verdict on the others after a failure."""

    def __init__(self, ctx: DistContext, store: dist.Store | None, interval: float) -> None:
        self.ctx, self.store, self.interval = ctx, store, interval
        self.host = host_label()
        self.last_beat = -float("inf")
        self.step = 0

    def beat(self, step: int, force: bool = False) -> None:
        """Note that this rank reached ``step`` (written at most every ``interval`` seconds)."""
        self.step = step
        now = time.monotonic()
        if self.store is None or (not force and now - self.last_beat < self.interval):
            return
        self.last_beat = now
        record = {"step": step, "host": self.host, "time": time.time()}
        try:
            self.store.set(KEY.format(rank=self.ctx.rank), json.dumps(record))
        except Exception as error:  # noqa: BLE001 - a store that went away: the collective says so
            log.debug("heartbeat not written: %s", error)
            self.store = None

    def heartbeats(self, wait: float = 5.0) -> dict[int, Heartbeat] | None:
        """Every rank's last heartbeat, None when the store cannot be read."""
        if self.store is None:
            return None
        try:
            self.store.set_timeout(timedelta(seconds=wait))
            keys = [KEY.format(rank=rank) for rank in range(self.ctx.world_size)]
            present = [key for key in keys if self.store.check([key])]
            beats = {}
            for key in present:
                record = json.loads(self.store.get(key))
                rank = int(key.rsplit("/", 1)[1])
                beats[rank] = Heartbeat(rank, record["step"], record["host"], record["time"])
            return beats
        except Exception:  # noqa: BLE001 - the store's host is the one that is gone
            return None

    def silent(self, beats: dict[int, Heartbeat]) -> list[Heartbeat]:
        """The ranks that did not reach this rank's step, or (if all did) the longest silent."""
        others = [beats.get(rank, Heartbeat(rank, -1, "unknown host", 0.0))
                  for rank in range(self.ctx.world_size) if rank != self.ctx.rank]
        behind = [beat for beat in others if beat.step < self.step]
        if behind:
            return behind
        oldest = min((beat.time for beat in others), default=None)
        return [beat for beat in others if beat.time == oldest]

    def failure_line(self, error: BaseException, timeout: float) -> str:
        """One line on the collective that failed and the peers that stopped answering."""
        kind = "timed out" if "imed out" in str(error) else "lost its connection"
        where = (f"rank {self.ctx.rank} on {self.host}: a collective at step {self.step + 1} "
                 f"{kind} (collective_timeout {timeout:g} s)")
        beats = self.heartbeats()
        if beats is None:
            store = os.environ.get("MASTER_ADDR", "its host")
            return (f"{where}; the process group's store ({store}) cannot be reached either: "
                    "that host is down or cut off")
        names = ", ".join(
            f"rank {beat.rank} on {beat.host} (last heard at step {beat.step}"
            f"{f', {time.time() - beat.time:.0f} s ago' if beat.time else ''})"
            for beat in self.silent(beats))
        return f"{where}; stopped answering: {names}"


def default_store() -> dist.Store | None:
    """The process group's store, where the running torch exposes it."""
    if not dist.is_initialized():
        return None
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return dist.PrefixStore("bigbatch", _get_default_store())
    except Exception:  # noqa: BLE001 - an API that moved: no heartbeats, the error stays generic
        return None


def peer_watch(ctx: DistContext, timeout: float) -> PeerWatch:
    """A watch over the process group (a no-op one on one process)."""
    store = default_store() if ctx.distributed else None
    return PeerWatch(ctx, store, interval=min(5.0, timeout / 4))
