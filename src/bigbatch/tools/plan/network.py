"""The network cost model of the planner: all-reduce time on a ring or a tree, flat or
hierarchical (devices in nodes), from a preset or from a measured bigbatch bench record."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from bigbatch.errors import ConfigError
from bigbatch.tools.plan.presets import (
    HardwarePreset,
)


def ring_allreduce_seconds(nbytes: float, p: int, alpha: float, beta: float) -> float:
    """Ring all-reduce: 2(p-1) steps of alpha, each link carrying 2(p-1)/p of the message."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta


def tree_allreduce_seconds(nbytes: float, p: int, alpha: float, beta: float) -> float:
    """Binary-tree reduce then broadcast: 2 log2(p) hops, each moving the whole message."""
    if p <= 1:
        return 0.0
    return 2 * math.log2(p) * (alpha + nbytes * beta)


def pipelined_tree_allreduce_seconds(nbytes: float, p: int, alpha: float, beta: float) -> float:
    """A tree fed in small chunks (NCCL's double binary tree; in-network reduction does no
    worse): the latency of 2 ceil(log2 p) hops, the bandwidth term of a ring, 2 n beta."""
    if p <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(p)) * alpha + 2 * nbytes * beta


ALGORITHMS = {
    "ring": ring_allreduce_seconds,
    "tree": tree_allreduce_seconds,
    "pipelined-tree": pipelined_tree_allreduce_seconds,
}
TOPOLOGIES = tuple(ALGORITHMS)


@dataclass(frozen=True)
class Network:
    """alpha (s per message) and beta (s per byte) between nodes, and inside a node."""

    alpha: float
    beta: float
    topology: str = "ring"
    devices_per_node: int = 1
    intra_alpha: float = 0.0
    intra_beta: float = 0.0
    description: str = "custom"

    def __post_init__(self) -> None:
        if self.topology not in TOPOLOGIES:
            raise ConfigError(
                f"topology must be one of {', '.join(TOPOLOGIES)}, got '{self.topology}'"
            )
        for name in ("alpha", "beta", "intra_alpha", "intra_beta"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"network {name} must be a finite number >= 0, got {value}")
        if self.devices_per_node < 1:
            raise ConfigError(f"devices per node must be at least 1, got {self.devices_per_node}")

    @property
    def bandwidth_gbit(self) -> float:
        """1/beta in Gbit/s (inf for a free network)."""
        return math.inf if self.beta == 0 else 8.0 / self.beta / 1e9


def allreduce_seconds(nbytes: float, p: int, network: Network) -> float:
    """Time of one all-reduce of ``nbytes`` over p devices (hierarchical when nodes hold several).

    Inside a node: ring reduce-scatter + all-gather on the device links. Across the N nodes: each
    of the k devices all-reduces its n/k shard, the k streams sharing the node's injection
    bandwidth, which costs the same as one all-reduce of n at the node's beta.
    """
    if p <= 1:
        return 0.0
    per_node = min(network.devices_per_node, p)
    nodes = math.ceil(p / per_node)
    inside = ring_allreduce_seconds(nbytes, per_node, network.intra_alpha, network.intra_beta)
    across = ALGORITHMS[network.topology](nbytes, nodes, network.alpha, network.beta)
    return inside + across


def network_from_preset(preset: HardwarePreset) -> Network:
    spec = preset.network
    return Network(
        alpha=spec.alpha_s.value,
        beta=8.0 / (spec.bandwidth_gbit.value * 1e9),
        topology=spec.topology,
        devices_per_node=spec.devices_per_node,
        intra_alpha=spec.intra_alpha_s.value if spec.intra_alpha_s else 0.0,
        intra_beta=(
            8.0 / (spec.intra_bandwidth_gbit.value * 1e9) if spec.intra_bandwidth_gbit else 0.0
        ),
        description=spec.description,
    )


def network_from_allreduce_json(path: str | Path) -> Network:
    """alpha and beta fitted by ``bigbatch bench allreduce`` (a flat ring, one device per node)."""
    try:
        record = json.loads(Path(path).read_text())
        fit = record["fit"]
        alpha, beta = float(fit["alpha_s"]), float(fit["beta_s_per_byte"])
    except FileNotFoundError:
        raise ConfigError(
            f"all-reduce file {path} does not exist; write one with "
            "`bigbatch bench allreduce --out FILE`"
        ) from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise ConfigError(
            f"{path} is not a `bigbatch bench allreduce` result "
            f"(missing or bad fit.alpha_s / fit.beta_s_per_byte: {error})"
        ) from None
    return Network(
        alpha=alpha,
        beta=beta,
        topology="ring",
        description=f"fitted by bigbatch bench allreduce on "
        f"{record.get('world_size', '?')} processes ({path})",
    )
