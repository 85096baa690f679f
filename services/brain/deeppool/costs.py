"""DeepPool's cost model (section 4.1), as arrays over device counts.

Every transfer costs bytes / bandwidth + latency, on a full-bisection network whose
per-device bandwidth is the intra-node one while both sides fit in one node and the
inter-node one otherwise.

- comp(i, g): the profile (`LayerGraph.comp`).
- comm((u, h) -> (v, g)): when the count changes, samples move before v runs forward and
  their gradients move back: twice (u's output bytes per sample x samples one device of
  the smaller side sends or receives, B/min - B/max, / bandwidth + latency). Zero when
  h == g: the samples are already where they are needed.
- A *full move* (a branch run on other devices, see planner): every sample moves, one
  device of the smaller side handling B/min(h, g) of them, even when h == g.
- sync(i, g): ring all-reduce of layer i's gradients after the backward pass, not
  overlapped (as the paper assumes): 2 (g-1)/g x parameter bytes / bandwidth, plus
  2 log2(g) latencies; zero on one device or without parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .profiles import FloatArray, LayerGraph


@dataclass(frozen=True)
class Network:
    """Per-device bandwidths (bytes/s) and latency (s); defaults: NVSwitch and 200 Gb/s."""

    intra_bandwidth: float = 250e9
    inter_bandwidth: float = 25e9
    latency: float = 5e-6
    devices_per_node: int = 8

    def __post_init__(self) -> None:
        if not (self.intra_bandwidth > 0 and self.inter_bandwidth > 0):
            raise ValueError("intra_bandwidth, inter_bandwidth: must be > 0 (inf for free)")
        if not self.latency >= 0:
            raise ValueError(f"latency: must be >= 0, got {self.latency}")
        if self.devices_per_node < 1:
            raise ValueError(f"devices_per_node: must be >= 1, got {self.devices_per_node}")

    def bandwidth(self, devices: FloatArray) -> FloatArray:
        """Per-device bandwidth of a transfer spanning `devices` devices."""
        inside = devices <= self.devices_per_node
        return np.where(inside, self.intra_bandwidth, self.inter_bandwidth)


#: Free communication: the "zero communication" case of the planner's checks.
FREE_NETWORK = Network(np.inf, np.inf, 0.0)


@dataclass(frozen=True, eq=False)
class Costs:
    """Arrays the DP reads, over the graph's counts d[k] (k = 0 .. K-1).

    own[i, g]: comp + sync of layer i. comm[u, h, g]: a change of count after layer u.
    move[u, h, g]: a full move of u's output. counts: d as floats.
    """

    counts: FloatArray
    own: FloatArray
    comm: FloatArray
    move: FloatArray


def _pair_costs(graph: LayerGraph, network: Network, full: bool) -> FloatArray:
    d = np.asarray(graph.device_counts, dtype=np.float64)
    lo, hi = np.minimum.outer(d, d), np.maximum.outer(d, d)
    batch = float(graph.global_batch)
    samples = batch / lo if full else batch / lo - batch / hi
    bandwidth = network.bandwidth(hi)
    with np.errstate(invalid="ignore"):
        per_byte = np.where(samples > 0, 2 * samples / batch / bandwidth, 0.0)
    latency = np.where(samples > 0, 2 * network.latency, 0.0)
    cost: FloatArray = graph.out_bytes[:, None, None] * per_byte[None] + latency[None]
    return cost


def build_costs(graph: LayerGraph, network: Network) -> Costs:
    d = np.asarray(graph.device_counts, dtype=np.float64)
    ring = 2 * (d - 1) / d
    with np.errstate(invalid="ignore"):
        transfer = np.where(ring > 0, ring / network.bandwidth(d), 0.0)
    steps = np.where(d > 1, 2 * np.log2(d) * network.latency, 0.0)
    has_params = graph.param_bytes[:, None] > 0
    sync = np.where(has_params, graph.param_bytes[:, None] * transfer[None] + steps[None], 0.0)
    return Costs(
        counts=d,
        own=graph.comp + sync,
        comm=_pair_costs(graph, network, full=False),
        move=_pair_costs(graph, network, full=True),
    )
