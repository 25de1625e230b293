"""A real small cluster on one machine: nodes that are network namespaces joined by a switch.

    with Cluster(2) as cluster:
        agent = cluster.start(1, ["torchrun", ...])      # a process group inside node 1
        cluster.cut(2)                                   # node 2's link down
        cluster.restore(2)
        cluster.shape(2, "200mbit")                      # token bucket on both directions
        cluster.freeze(2); cluster.thaw(2); cluster.kill(2)

Every node is its own network namespace with one interface, ``eth0``, at ``10.<net>.0.<i>/24``.
Its other end sits in a switch namespace (no address of its own) on a bridge with the other
nodes' ends. Nothing else is connected: no route leaves the namespaces, so traffic goes only
between the nodes made here. Cutting a link sets the switch's end of it down (the node still sees
its own ``eth0`` up, as when a cable or a switch port dies); shaping puts a ``tbf`` qdisc on
both ends of the link.

A node's processes are started in their own session and their output goes to a file; freezing
(SIGSTOP), thawing and killing reach the agent and every process below it (its workers run in
sessions of their own). Leaving the
``with`` block — normally, on an error or on SIGTERM — kills every process and deletes every
namespace and link; a harness that died without cleaning up is cleaned by the next one with the
same net number (``Cluster.__enter__`` deletes namespaces of its names first).

Three things nodes on one host need that real machines do not: the namespaces share one hostname,
so torchrun gets ``--local-addr`` per node (``node_address``) and ``--rdzv-conf is_host=true`` on
the store's node, and gloo gets ``GLOO_SOCKET_IFNAME=eth0`` (``node_env``).

Needs root (CAP_NET_ADMIN) and iproute2 (``ip``, ``tc``); :func:`unavailable` says why not.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

INTERFACE = "eth0"


class ClusterError(RuntimeError):
    """An ``ip`` or ``tc`` command failed; the message carries its stderr."""


def ip(*args: str, check: bool = True) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise ClusterError(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")
    return result.stdout


def tc(namespace: str, *args: str) -> None:
    result = subprocess.run(["ip", "netns", "exec", namespace, "tc", *args],
                            capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise ClusterError(f"`tc {' '.join(args)}` in {namespace} failed: "
                           f"{result.stderr.strip()}")


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None when they can (tries a pair of them)."""
    if os.geteuid() != 0:
        return "not root: network namespaces need CAP_NET_ADMIN"
    for program in ("ip", "tc"):
        if shutil.which(program) is None:
            return f"the '{program}' program is missing (install iproute2)"
    try:
        with Cluster(1, net=254):
            pass
    except (ClusterError, OSError, subprocess.TimeoutExpired) as error:
        return f"a namespace node cannot be made here: {error}"
    return None


@dataclass
class Node:
    """One node: its namespace, its address, and the process groups started in it."""

    index: int
    namespace: str
    address: str
    port: str  # the switch's end of the node's link
    processes: list[subprocess.Popen] = field(default_factory=list)


class Cluster:
    """``nodes`` namespace nodes on one bridge; ``net`` picks 10.<net>.0.0/24 and the names."""

    def __init__(self, nodes: int, net: int = 77, log_dir: Path | None = None) -> None:
        if not 1 <= nodes <= 8:
            raise ValueError(f"a cluster has 1 to 8 nodes, not {nodes}")
        self.net = net
        self.switch = f"bbsw{net}"
        self.nodes = [Node(i, f"bbn{net}x{i}", f"10.{net}.0.{i}", f"bbp{net}x{i}")
                      for i in range(1, nodes + 1)]
        self.log_dir = log_dir
        self._previous_sigterm = None

    # ------------------------------------------------------------------------- set-up

    def __enter__(self) -> Cluster:
        self._delete_namespaces()
        try:
            ip("netns", "add", self.switch)
            ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            ip("-n", self.switch, "link", "set", "br0", "up")
            for node in self.nodes:
                self._add_node(node)
        except BaseException:
            self._delete_namespaces()
            raise
        if self._previous_sigterm is None:
            self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def _add_node(self, node: Node) -> None:
        ip("netns", "add", node.namespace)
        ip("-n", node.namespace, "link", "set", "lo", "up")
        ip("-n", self.switch, "link", "add", node.port, "type", "veth",
           "peer", "name", INTERFACE, "netns", node.namespace)
        ip("-n", self.switch, "link", "set", node.port, "master", "br0")
        ip("-n", self.switch, "link", "set", node.port, "up")
        ip("-n", node.namespace, "addr", "add", f"{node.address}/24", "dev", INTERFACE)
        ip("-n", node.namespace, "link", "set", INTERFACE, "up")

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self.close()
        raise SystemExit(128 + signum)

    def close(self) -> None:
        """Kill every process started here and delete every namespace and link."""
        for node in self.nodes:
            self.kill(node.index)
        self._delete_namespaces()
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None

    def _delete_namespaces(self) -> None:
        for name in [node.namespace for node in self.nodes] + [self.switch]:
            ip("netns", "delete", name, check=False)

    def leftovers(self) -> list[str]:
        """Namespaces of this cluster's names that exist (after close: none)."""
        names = {node.namespace for node in self.nodes} | {self.switch}
        return [line.split()[0] for line in ip("netns", "list").splitlines()
                if line.strip() and line.split()[0] in names]

    # ------------------------------------------------------------------------- processes

    def node(self, index: int) -> Node:
        return self.nodes[index - 1]

    def node_env(self, index: int, environ: dict[str, str] | None = None) -> dict[str, str]:
        """The environment a process on node ``index`` needs: gloo on the node's interface."""
        env = dict(os.environ if environ is None else environ)
        env.update(GLOO_SOCKET_IFNAME=INTERFACE, PYTHONUNBUFFERED="1")
        return env

    def start(self, index: int, command: list[str], env: dict[str, str] | None = None,
              log_name: str | None = None) -> subprocess.Popen:
        """Start ``command`` on node ``index`` in its own session; output to a log file."""
        node = self.node(index)
        log_path = self._log_path(log_name or f"node{index}-{len(node.processes)}.log")
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                ["ip", "netns", "exec", node.namespace, *command], stdout=log,
                stderr=subprocess.STDOUT, env=self.node_env(index, env), start_new_session=True)
        process.log_path = log_path  # type: ignore[attr-defined]
        node.processes.append(process)
        return process

    def _log_path(self, name: str) -> Path:
        folder = self.log_dir or Path("/tmp")
        folder.mkdir(parents=True, exist_ok=True)
        return folder / name

    def _signal(self, index: int, signum: int) -> None:
        """Signal every process of the node: the agents and all their descendants (torchrun
        starts its workers in sessions of their own, out of reach of the agent's group)."""
        pids = [pid for process in self.node(index).processes for pid in descendants(process.pid)]
        for pid in pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def freeze(self, index: int) -> None:
        """SIGSTOP every process of the node (agent and workers): a hung machine."""
        self._signal(index, signal.SIGSTOP)

    def thaw(self, index: int) -> None:
        self._signal(index, signal.SIGCONT)

    def kill(self, index: int, timeout: float = 10.0) -> None:
        """SIGKILL every process of the node and reap them."""
        self._signal(index, signal.SIGCONT)
        self._signal(index, signal.SIGKILL)
        for process in self.node(index).processes:
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass

    # ------------------------------------------------------------------------- links

    def cut(self, index: int) -> None:
        """Take the node's link down at the switch: the node is cut off from all others."""
        ip("-n", self.switch, "link", "set", self.node(index).port, "down")

    def restore(self, index: int) -> None:
        ip("-n", self.switch, "link", "set", self.node(index).port, "up")

    def sent_bytes(self, index: int) -> int:
        """Bytes the node has sent on its link so far (the interface's counter)."""
        link = json.loads(ip("-n", self.node(index).namespace, "-s", "-j", "link", "show",
                             "dev", INTERFACE))
        return int(link[0]["stats64"]["tx"]["bytes"])

    def shape(self, index: int, rate: str, burst: str = "64kb", latency: str = "200ms") -> None:
        """Limit the node's link to ``rate`` (tc units, e.g. 200mbit) in both directions."""
        node = self.node(index)
        for namespace, device in ((node.namespace, INTERFACE), (self.switch, node.port)):
            tc(namespace, "qdisc", "replace", "dev", device, "root", "tbf", "rate", rate,
               "burst", burst, "latency", latency)


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from /proc), parents first."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue:
        current = queue.pop(0)
        found.append(current)
        queue.extend(children.get(current, []))
    return found


def wait_for(condition, timeout: float, interval: float = 0.2, what: str = "a condition"):
    """Poll ``condition()`` until it returns a true value (returned) or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(interval)
