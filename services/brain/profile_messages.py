"""LayerProfile messages (what the worker's profiler, gearshift.worker.profiling, measures)
to validated LayerGraphs and back, with nothing but NumPy and the contracts.

The message is checked field by field (ValidationError names the dotted path, e.g.
`profile.layers[3].seconds`) before a LayerGraph is built, so that the graph's own checks
and the planner's series-parallel decomposition only see well-formed data; their
ValueErrors (which start with the field's name) are mapped the same way.
"""

from __future__ import annotations

import math
import re

import numpy as np

from gearshift.brain.deeppool import LayerGraph
from gearshift.brain.deeppool.structure import decompose
from gearshift.common.errors import ValidationError
from gearshift.common.validation import check_non_negative, require
from gearshift.v1 import brain_pb2

MAX_LAYERS = 10_000
MAX_EDGES = 100_000
MAX_DEVICES = 1024
MAX_TEXT = 256
_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")


def check_key(key: str, field: str) -> None:
    require(bool(key), field, "is required")
    require(len(key) <= 128, field, "must be at most 128 characters")
    require(
        _KEY.match(key) is not None,
        field,
        f"{key!r}: letters, digits, '.', '_', '-', ':' and '/' only",
    )


def _graph_error(exc: ValueError, field: str) -> ValidationError:
    """A LayerGraph / decomposition ValueError ("edges: ...") as the request's field."""
    name, sep, problem = str(exc).partition(": ")
    if sep and " " not in name:
        return ValidationError(f"{field}.{name}", problem)
    return ValidationError(field, str(exc))


def graph_from_message(profile: brain_pb2.LayerProfile, field: str = "profile") -> LayerGraph:
    """A validated LayerGraph (series-parallel, one source and one sink) from a message."""
    n = len(profile.layers)
    require(1 <= n <= MAX_LAYERS, f"{field}.layers", f"1-{MAX_LAYERS:,} layers, got {n}")
    counts = list(profile.device_counts)
    want = [1 << e for e in range(len(counts))]
    require(
        bool(counts) and counts == want and counts[-1] <= MAX_DEVICES,
        f"{field}.device_counts",
        f"want 1, 2, 4, ... up to at most {MAX_DEVICES}, got {counts}",
    )
    require(profile.global_batch >= 1, f"{field}.global_batch", "must be >= 1")
    require(len(profile.device) <= MAX_TEXT, f"{field}.device", "at most 256 characters")
    require(len(profile.edges) <= MAX_EDGES, f"{field}.edges", f"at most {MAX_EDGES:,} edges")
    seen: set[str] = set()
    for i, layer in enumerate(profile.layers):
        where = f"{field}.layers[{i}]"
        require(bool(layer.name), f"{where}.name", "is required")
        require(len(layer.name) <= MAX_TEXT, f"{where}.name", "at most 256 characters")
        require(layer.name not in seen, f"{where}.name", f"{layer.name!r} appears twice")
        seen.add(layer.name)
        seconds = list(layer.seconds)
        require(
            len(seconds) == len(counts),
            f"{where}.seconds",
            f"want one per device count ({len(counts)}), got {len(seconds)}",
        )
        require(
            all(t >= 0 for t in seconds),  # NaN fails too
            f"{where}.seconds",
            "must be >= 0 (+inf where the per-device batch is below one sample)",
        )
        require(math.isfinite(seconds[0]), f"{where}.seconds", "the one-device time must be finite")
        bytes_ = layer.output_bytes_per_sample
        check_non_negative(bytes_, f"{where}.output_bytes_per_sample")
        require(math.isfinite(bytes_), f"{where}.output_bytes_per_sample", "must be finite")
        require(layer.parameter_bytes >= 0, f"{where}.parameter_bytes", "must be >= 0")
    for j, edge in enumerate(profile.edges):
        require(
            0 <= edge.source < edge.target < n,
            f"{field}.edges[{j}]",
            f"({edge.source}, {edge.target}): want 0 <= source < target < {n}",
        )
    batch = profile.global_batch
    try:
        graph = LayerGraph(
            names=tuple(layer.name for layer in profile.layers),
            edges=tuple((e.source, e.target) for e in profile.edges),
            device_counts=tuple(counts),
            global_batch=batch,
            comp=np.array([list(layer.seconds) for layer in profile.layers], dtype=np.float64),
            out_bytes=np.array(
                [layer.output_bytes_per_sample * batch for layer in profile.layers],
                dtype=np.float64,
            ),
            param_bytes=np.array(
                [layer.parameter_bytes for layer in profile.layers], dtype=np.float64
            ),
        )
        decompose(graph)
    except ValueError as exc:
        raise _graph_error(exc, field) from None
    return graph


def profile_message(graph: LayerGraph, device: str = "") -> brain_pb2.LayerProfile:
    """The message of a graph (output bytes per sample, as measured)."""
    return brain_pb2.LayerProfile(
        layers=[
            brain_pb2.ProfiledLayer(
                name=name,
                seconds=graph.comp[i].tolist(),
                output_bytes_per_sample=float(graph.out_bytes[i]) / graph.global_batch,
                parameter_bytes=int(graph.param_bytes[i]),
            )
            for i, name in enumerate(graph.names)
        ],
        edges=[brain_pb2.LayerEdge(source=u, target=v) for u, v in graph.edges],
        device_counts=list(graph.device_counts),
        global_batch=graph.global_batch,
        device=device,
    )
