"""The heartbeats and the one line that names a peer that stopped answering (bigbatch.peers).

The real thing — a link cut between two namespace nodes, the survivor's line — is in
tests/test_cluster.py; these check the verdict on crafted heartbeats in a real store."""

from __future__ import annotations

import json
import time

import pytest
import torch.distributed as dist

from bigbatch.distributed import DistContext
from bigbatch.peers import KEY, PeerWatch, lost_peer


def watch(rank: int, world: int, store) -> PeerWatch:
    ctx = DistContext(rank=rank, world_size=world, local_rank=0, backend="gloo", device="cpu")
    return PeerWatch(ctx, store, interval=0.0)


def test_the_rank_behind_is_named_with_its_host_and_step():
    store = dist.HashStore()
    me, other, third = watch(0, 3, store), watch(1, 3, store), watch(2, 3, store)
    other.host, third.host = "node-b (10.0.0.2)", "node-c (10.0.0.3)"
    for step in range(5):
        me.beat(step)
        third.beat(step)
        if step < 3:
            other.beat(step)
    line = me.failure_line(RuntimeError("Timed out waiting 15000ms for recv"), 15.0)
    assert "a collective at step 5 timed out (collective_timeout 15 s)" in line
    assert "stopped answering: rank 1 on node-b (10.0.0.2) (last heard at step 2" in line
    assert "rank 2" not in line
    assert "\n" not in line


def test_a_rank_that_never_wrote_is_named_as_unknown():
    store = dist.HashStore()
    me = watch(1, 2, store)
    me.beat(4)
    line = me.failure_line(RuntimeError("Connection reset by peer"), 30.0)
    assert "lost its connection" in line
    assert "rank 0 on unknown host (last heard at step -1)" in line


def test_when_all_reached_the_step_the_longest_silent_is_named():
    store = dist.HashStore()
    me = watch(0, 2, store)
    me.beat(3)
    store.set(KEY.format(rank=1), json.dumps({"step": 3, "host": "b", "time": time.time() - 50}))
    assert [beat.rank for beat in me.silent(me.heartbeats())] == [1]


def test_a_store_that_is_gone_is_said_so(monkeypatch):
    class Gone:
        def set(self, *args):
            raise RuntimeError("Connection refused")

    me = watch(0, 2, Gone())
    me.beat(1)  # the failed write drops the store
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    line = me.failure_line(RuntimeError("Connection closed by peer"), 10.0)
    assert line.endswith("the process group's store (10.0.0.1) cannot be reached either: "
                         "that host is down or cut off")


def test_heartbeats_are_throttled_to_the_interval():
    store = dist.HashStore()
    me = PeerWatch(DistContext(0, 2, 0, "gloo", "cpu"), store, interval=3600.0)
    me.beat(1)
    me.beat(2)
    assert json.loads(store.get(KEY.format(rank=0)))["step"] == 1
    me.beat(3, force=True)
    assert json.loads(store.get(KEY.format(rank=0)))["step"] == 3


@pytest.mark.parametrize("message, lost", [
    ("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 15000ms for recv", True),
    ("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:1234", True),
    ("Connection reset by peer", True),
    ("mat1 and mat2 shapes cannot be multiplied (4x3 and 2x2)", False),
])
def test_lost_peer_tells_network_failures_from_bugs(message, lost):
    assert lost_peer(RuntimeError(message)) is lost
    assert lost_peer(ValueError(message)) is False
