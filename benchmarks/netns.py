"""A network namespace whose loopback is shaped by a token bucket: a slow 'cluster network' on
one machine.

    with shaped_namespace("bb1", rate="1gbit") as ns:
        subprocess.run([*netns_exec(ns), "python", "-m", "torch.distributed.run", ...])

Inside namespace ``bbN`` only ``lo`` exists; ``tc qdisc replace dev lo root tbf rate R burst 256kb
latency 100ms`` limits everything the processes send each other to R. All processes share the one
qdisc, so R is the *aggregate* bandwidth: p processes sending at once get about R / p each, like
p nodes behind one shared link rather than a switch with a port per node. The all-reduce bench run
inside the same namespace at the same process count measures exactly this, and its fitted beta
(per link) includes the sharing.

Needs root (CAP_NET_ADMIN) and the ``ip`` and ``tc`` programs; ``namespace_unavailable()`` says
why not when they are missing. The namespace is deleted on exit, also after an error.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator


class NamespaceError(RuntimeError):
    """An ``ip``/``tc`` command failed (the message carries its stderr)."""


def _run(command: list[str]) -> str:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise NamespaceError(f"`{' '.join(command)}` failed ({result.returncode}): "
                             f"{result.stderr.strip()}")
    return result.stdout


def netns_exec(name: str) -> list[str]:
    """The command prefix that runs a program inside namespace ``name``."""
    return ["ip", "netns", "exec", name]


def create_namespace(name: str) -> None:
    _run(["ip", "netns", "add", name])
    try:
        _run([*netns_exec(name), "ip", "link", "set", "lo", "up"])
    except NamespaceError:
        delete_namespace(name)
        raise


def shape_loopback(name: str, rate: str, burst: str = "256kb", latency: str = "100ms") -> str:
    """Put a token-bucket filter on the namespace's loopback; returns ``tc qdisc show``."""
    _run([*netns_exec(name), "tc", "qdisc", "replace", "dev", "lo", "root", "tbf", "rate", rate,
          "burst", burst, "latency", latency])
    return _run([*netns_exec(name), "tc", "qdisc", "show", "dev", "lo"]).strip()


def delete_namespace(name: str) -> None:
    """Remove the namespace (quietly if it is already gone)."""
    subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)


def namespace_exists(name: str) -> bool:
    result = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return any(line.split()[0] == name for line in result.stdout.splitlines() if line.strip())


def namespace_unavailable() -> str | None:
    """Why a shaped namespace cannot be made here, or None when it can (tries one)."""
    if os.geteuid() != 0:
        return "not root: creating a network namespace needs CAP_NET_ADMIN (run as root)"
    for program in ("ip", "tc"):
        if shutil.which(program) is None:
            return f"the '{program}' program is missing (install iproute2)"
    probe = f"bbprobe{os.getpid()}"
    try:
        create_namespace(probe)
        shape_loopback(probe, "1gbit")
    except NamespaceError as error:
        return f"cannot create a shaped namespace: {error}"
    finally:
        delete_namespace(probe)
    return None


@contextlib.contextmanager
def shaped_namespace(name: str, rate: str, burst: str = "256kb",
                     latency: str = "100ms") -> Iterator[str]:
    """Create namespace ``name`` with a shaped loopback, yield its name, delete it afterwards."""
    create_namespace(name)
    try:
        shape_loopback(name, rate, burst, latency)
        yield name
    finally:
        delete_namespace(name)
