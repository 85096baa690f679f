"""The planner's input: a model's layer graph with per-device-count costs.

A profile is measured per *per-device batch size* (what a layer costs on one device
at batch b); the planner thinks in *device counts* g for a fixed global batch B, so
`graph_from_batch_times` turns one into the other (b = B/g), and `rebatch` re-derives a
graph for another global batch. Counts are powers of two, as in DeepPool (section 7.4:
it keeps the search space small). `graph_to_dict` is the form the Brain stores.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from gearshift.common.profiles import power_of_two_counts

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class LayerGraph:
    """Layers in topological order (every edge u -> v has u < v), branching allowed.

    comp[i, k]: forward + backward seconds of layer i on each of device_counts[k]
    devices at per-device batch global_batch / device_counts[k] (inf where that batch
    is below one sample). out_bytes[i]: bytes of layer i's output activations for the
    whole global batch (its gradient has the same size). param_bytes[i]: bytes of its
    parameters (what a gradient all-reduce moves).
    """

    names: tuple[str, ...]
    edges: tuple[tuple[int, int], ...]
    device_counts: tuple[int, ...]
    global_batch: int
    comp: FloatArray = field(repr=False)
    out_bytes: FloatArray = field(repr=False)
    param_bytes: FloatArray = field(repr=False)

    def __post_init__(self) -> None:
        n, k = len(self.names), len(self.device_counts)
        if n == 0:
            raise ValueError("names: a layer graph needs at least one layer")
        counts = self.device_counts
        if not counts or counts[0] != 1 or any(b != 2 * a for a, b in itertools.pairwise(counts)):
            raise ValueError(f"device_counts: want 1, 2, 4, ... (powers of two), got {counts}")
        if self.global_batch < 1:
            raise ValueError(f"global_batch: must be >= 1, got {self.global_batch}")
        for name, array, shape in (
            ("comp", self.comp, (n, k)),
            ("out_bytes", self.out_bytes, (n,)),
            ("param_bytes", self.param_bytes, (n,)),
        ):
            if array.shape != shape:
                raise ValueError(f"{name}: shape {array.shape}, want {shape}")
            if np.isnan(array).any() or (array < 0).any():
                raise ValueError(f"{name}: values must be >= 0 (inf allowed in comp only)")
        if not np.isfinite(self.comp[:, 0]).all():
            raise ValueError("comp: every layer needs a finite single-device time")
        if not (np.isfinite(self.out_bytes).all() and np.isfinite(self.param_bytes).all()):
            raise ValueError("out_bytes, param_bytes: must be finite")
        seen: set[tuple[int, int]] = set()
        for u, v in self.edges:
            if not 0 <= u < v < n:
                raise ValueError(f"edges: ({u}, {v}) is not forward in topological order")
            if (u, v) in seen:
                raise ValueError(f"edges: ({u}, {v}) appears twice")
            seen.add((u, v))

    @property
    def num_layers(self) -> int:
        return len(self.names)

    def predecessors(self) -> list[list[int]]:
        preds: list[list[int]] = [[] for _ in self.names]
        for u, v in self.edges:
            preds[v].append(u)
        return preds

    def successors(self) -> list[list[int]]:
        succs: list[list[int]] = [[] for _ in self.names]
        for u, v in self.edges:
            succs[u].append(v)
        return succs

    def single_device_time(self) -> float:
        """One iteration on one device: the denominator of GPU-sec amplification."""
        return float(self.comp[:, 0].sum())


def times_at_batches(batch_times: Mapping[int, Sequence[float]], batches: FloatArray) -> FloatArray:
    """Per-layer seconds at each (possibly fractional) per-device batch size: [layers, batches].

    Measured sizes are used as they are; between two, linear interpolation; above the
    largest, time grows in proportion to the batch (a saturated device); below the
    smallest measured, the smallest's time (small batches are rarely cheaper); below one
    sample, inf (a sample is not split).
    """
    sizes = np.array(sorted(batch_times), dtype=np.float64)
    if len(sizes) == 0 or sizes[0] < 1:
        raise ValueError("batch_times: need measurements at batch sizes >= 1")
    table = np.array([batch_times[int(b)] for b in sizes], dtype=np.float64).T  # [L, sizes]
    out = np.empty((table.shape[0], len(batches)))
    for j, b in enumerate(batches):
        if b < 1:
            out[:, j] = np.inf
        elif b >= sizes[-1]:
            out[:, j] = table[:, -1] * (b / sizes[-1])
        else:
            hi = int(np.searchsorted(sizes, b))
            if sizes[hi] == b or hi == 0:
                out[:, j] = table[:, hi]
            else:
                w = (b - sizes[hi - 1]) / (sizes[hi] - sizes[hi - 1])
                out[:, j] = (1 - w) * table[:, hi - 1] + w * table[:, hi]
    return out


def graph_from_batch_times(
    names: Sequence[str],
    edges: Sequence[tuple[int, int]],
    batch_times: Mapping[int, Sequence[float]],
    sample_bytes: Sequence[float],
    param_bytes: Sequence[float],
    *,
    global_batch: int,
    max_devices: int | None = None,
) -> LayerGraph:
    """A LayerGraph for one global batch from per-device-batch measurements.

    batch_times[b][i]: fwd+bwd seconds of layer i at per-device batch b; sample_bytes[i]:
    output bytes of layer i per sample. Device counts run 1, 2, 4, ... up to max_devices
    (default: the global batch, the most devices that each get a whole sample).
    """
    counts = power_of_two_counts(global_batch if max_devices is None else max_devices)
    batches = global_batch / np.array(counts, dtype=np.float64)
    return LayerGraph(
        names=tuple(names),
        edges=tuple(sorted(set(edges))),
        device_counts=counts,
        global_batch=global_batch,
        comp=times_at_batches(batch_times, batches),
        out_bytes=np.asarray(sample_bytes, dtype=np.float64) * global_batch,
        param_bytes=np.asarray(param_bytes, dtype=np.float64),
    )


def graph_to_dict(graph: LayerGraph, device: str = "") -> dict[str, Any]:
    """The graph as JSON-able plain data, for storage (an infinite time is None: JSON has no
    infinity). `device`: what it was measured on. Output bytes are per sample, so the data
    does not depend on the global batch it was measured for."""
    return {
        "names": list(graph.names),
        "edges": [[u, v] for u, v in graph.edges],
        "device_counts": list(graph.device_counts),
        "global_batch": graph.global_batch,
        "seconds": [[t if math.isfinite(t) else None for t in row] for row in graph.comp.tolist()],
        "output_bytes_per_sample": (graph.out_bytes / graph.global_batch).tolist(),
        "parameter_bytes": graph.param_bytes.tolist(),
        "device": device,
    }


def graph_from_dict(data: Mapping[str, Any]) -> LayerGraph:
    """The inverse of graph_to_dict (ValueError naming the field on bad data)."""
    batch = int(data["global_batch"])
    seconds = [[math.inf if t is None else float(t) for t in row] for row in data["seconds"]]
    return LayerGraph(
        names=tuple(data["names"]),
        edges=tuple((int(u), int(v)) for u, v in data["edges"]),
        device_counts=tuple(int(d) for d in data["device_counts"]),
        global_batch=batch,
        comp=np.array(seconds, dtype=np.float64).reshape(len(seconds), -1),
        out_bytes=np.asarray(data["output_bytes_per_sample"], dtype=np.float64) * batch,
        param_bytes=np.asarray(data["parameter_bytes"], dtype=np.float64),
    )


def digest(data: Mapping[str, Any]) -> str:
    """SHA-256 of graph_to_dict's data in a canonical form: equal profiles, equal digests."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def rebatch(graph: LayerGraph, global_batch: int, max_devices: int) -> LayerGraph:
    """The graph for another global batch or device limit, from its measured per-device
    batches (the whole-sample ones: global_batch / g where g divides it).

    Unchanged when only fewer devices are asked for (the planner cuts the counts itself).
    """
    if global_batch == graph.global_batch and max_devices <= graph.device_counts[-1]:
        return graph
    batch_times = {
        graph.global_batch // d: graph.comp[:, k].tolist()
        for k, d in enumerate(graph.device_counts)
        if graph.global_batch % d == 0 and np.isfinite(graph.comp[:, k]).all()
    }
    return graph_from_batch_times(
        graph.names,
        graph.edges,
        batch_times,
        (graph.out_bytes / graph.global_batch).tolist(),
        graph.param_bytes.tolist(),
        global_batch=global_batch,
        max_devices=max_devices,
    )
