"""Naming the rank that holds the others back: a slow link, or a slow machine.

Every ``log.straggler_probe_every_steps`` global steps the ranks measure two things and rank 0
names a straggler when one stands out:

* **The links.** Each rank sends a 1 MiB message to the next rank of a ring and receives one from
  the previous, at the same moment (after a tiny all-reduce lines them up), and times its
  receive. Rank r's message crosses its own link and rank r+1's, so rank r takes part in two
  timed transfers: the one it receives (from r-1) and the one it sends (received by r+1). A rank
  whose link is slow makes *both* of its transfers slow; a rank next to it has one slow and one
  fast. So the score of rank r is the faster of its two transfers, and a rank whose score is
  ``FACTOR`` times the median score of the others is named. With two ranks both transfers cross
  both links and no link can be blamed: nothing is named.
* **The machines.** Each rank's busy time since the last probe (data, forward, backward and
  optimizer, not the time it waited for the all-reduce); a rank busy ``FACTOR`` times the
  median of the others is named: everyone else waited for it.

A named rank is logged (one line, with its host), shown in the progress line, and counted in
summary.json's ``stragglers``.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from bigbatch.distributed import DistContext, all_gather_object

log = logging.getLogger(__name__)

PROBE_BYTES = 1 << 20
FACTOR = 3.0


@dataclass
class Named:
    """A rank named as a straggler: how often, and its last measurement against the others."""

    rank: int
    host: str
    kind: str  # "link" or "compute"
    seconds: float
    others_median_seconds: float
    times: int = 1

    def describe(self) -> str:
        what = "its link" if self.kind == "link" else "its work"
        ratio = self.seconds / self.others_median_seconds if self.others_median_seconds else 0
        return (f"rank {self.rank} on {self.host}: {what} takes {ratio:.1f}x the others' "
                f"({self.seconds * 1e3:.0f} ms against {self.others_median_seconds * 1e3:.0f} ms)")


def outliers(scores: list[float], factor: float = FACTOR) -> list[int]:
    """Indices whose score is ``factor`` times the median of the other scores."""
    named = []
    for index, score in enumerate(scores):
        others = scores[:index] + scores[index + 1:]
        if others and score > factor * statistics.median(others):
            named.append(index)
    return named


def link_scores(receive_seconds: list[float]) -> list[float]:
    """Rank r's score: the faster of the transfer it received and the one it sent (received by
    r+1). None can be blamed on two ranks (both transfers cross both links): all equal then."""
    world = len(receive_seconds)
    if world < 3:
        return [max(receive_seconds)] * world
    return [min(receive_seconds[r], receive_seconds[(r + 1) % world]) for r in range(world)]


@dataclass
class StragglerWatch:
    """Probes every ``every_steps`` steps; keeps who was named, for the progress line and the
    summary."""

    ctx: DistContext
    every_steps: int
    hosts: list[str]
    busy: float = 0.0
    named: dict[tuple[int, str], Named] = field(default_factory=dict)
    latest: list[Named] = field(default_factory=list)

    def after_step(self, step: int, busy_seconds: float) -> None:
        self.busy += busy_seconds
        if self.every_steps and self.ctx.distributed and step % self.every_steps == 0:
            self.probe()

    def probe(self) -> None:
        receive, busy = self.measure()
        self.latest = []
        for kind, scores in (("link", link_scores(receive)), ("compute", busy)):
            for rank in outliers(scores):
                others = statistics.median(scores[:rank] + scores[rank + 1:])
                self.note(Named(rank, self.hosts[rank], kind, scores[rank], others))
        self.busy = 0.0

    def note(self, named: Named) -> None:
        key = (named.rank, named.kind)
        if key in self.named:
            named.times = self.named[key].times + 1
        self.named[key] = named
        self.latest.append(named)
        if self.ctx.is_main:
            log.warning("straggler: %s", named.describe())

    def measure(self) -> tuple[list[float], list[float]]:
        """Every rank's ring-receive seconds and busy seconds, on every rank."""
        rank, world = self.ctx.rank, self.ctx.world_size
        outgoing = torch.zeros(PROBE_BYTES // 4)
        incoming = torch.empty_like(outgoing)
        dist.all_reduce(torch.zeros(1))  # line the ranks up
        started = time.perf_counter()
        sent = dist.isend(outgoing, (rank + 1) % world)
        dist.irecv(incoming, (rank - 1) % world).wait()
        received = time.perf_counter() - started
        sent.wait()
        mine = torch.tensor([received, self.busy], dtype=torch.float64)
        every = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)
        return [float(t[0]) for t in every], [float(t[1]) for t in every]

    def summary(self) -> list[dict]:
        return [vars(named).copy() for named in
                sorted(self.named.values(), key=lambda n: (-n.times, n.rank))]

    def progress_note(self) -> str:
        return "; ".join(f"straggler rank {n.rank} on {n.host} ({n.kind})" for n in self.latest)


def straggler_watch(ctx: DistContext, every_steps: int, host: str) -> StragglerWatch:
    """A watch with every rank's host (gathered once); probing off on one process."""
    hosts = [str(h) for h in all_gather_object(host, ctx)] if ctx.distributed else [host]
    return StragglerWatch(ctx, every_steps if ctx.distributed else 0, hosts)
