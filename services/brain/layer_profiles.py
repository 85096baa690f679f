"""Layer profiles and burst-parallel plans: messages to validated plain data and back.

The LayerProfile message is checked field by field (ValidationError names the dotted
path, e.g. `profile.layers[3].seconds`) before a LayerGraph is built, so that the
graph's own checks and the planner's series-parallel decomposition only see
well-formed data; their ValueErrors (which start with the field's name) are mapped
the same way. `profile_message` is the inverse, used by the profiler's entry point.
"""

from __future__ import annotations

import math
import re

import numpy as np

from gearshift.brain.deeppool import LayerGraph, Network
from gearshift.brain.deeppool.profiles import graph_from_dict
from gearshift.brain.deeppool.structure import decompose
from gearshift.brain.records import ProfileRow
from gearshift.brain.service import BurstRequest, BurstResult
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


def store_request(request: brain_pb2.StoreLayerProfileRequest) -> tuple[str, str, LayerGraph]:
    """(key, model type, graph) of a StoreLayerProfile request."""
    check_key(request.key, "key")
    require(len(request.model_type) <= 128, "model_type", "must be at most 128 characters")
    require(request.HasField("profile"), "profile", "is required")
    return request.key, request.model_type, graph_from_message(request.profile)


def _network(settings: brain_pb2.NetworkSettings, field: str) -> Network:
    default = Network()
    if settings.free:
        return Network(math.inf, math.inf, 0.0, default.devices_per_node)
    for name in ("intra_bandwidth", "inter_bandwidth", "latency_seconds"):
        value = getattr(settings, name)
        require(math.isfinite(value) and value >= 0, f"{field}.{name}", "must be finite, >= 0")
    require(settings.devices_per_node >= 0, f"{field}.devices_per_node", "must be >= 0")
    return Network(
        settings.intra_bandwidth or default.intra_bandwidth,
        settings.inter_bandwidth or default.inter_bandwidth,
        settings.latency_seconds or default.latency,
        settings.devices_per_node or default.devices_per_node,
    )


def plan_request(
    request: brain_pb2.PlanBurstParallelRequest,
) -> tuple[str | LayerGraph, BurstRequest]:
    """(a stored profile's key or an inline graph, the planning settings)."""
    which = request.WhichOneof("source")
    source: str | LayerGraph
    if which == "profile_key":
        check_key(request.profile_key, "profile_key")
        source = request.profile_key
    elif which == "profile":
        source = graph_from_message(request.profile)
    else:
        raise ValidationError("profile_key", "give profile_key or profile")
    require(request.global_batch >= 0, "global_batch", "must be >= 0 (0: the profile's)")
    require(
        0 <= request.max_devices <= MAX_DEVICES,
        "max_devices",
        f"must be between 0 (the profile's) and {MAX_DEVICES}",
    )
    require(
        math.isfinite(request.amp_limit) and request.amp_limit >= 1,
        "amp_limit",
        f"must be >= 1 (1: no inefficiency allowed), got {request.amp_limit}",
    )
    return source, BurstRequest(
        global_batch=request.global_batch,
        max_devices=request.max_devices,
        amp_limit=request.amp_limit,
        network=_network(request.network, "network"),
        parallel_branches=request.parallel_branches,
    )


def stored_message(row: ProfileRow) -> brain_pb2.StoredLayerProfile:
    """A StoredLayerProfile reply."""
    return brain_pb2.StoredLayerProfile(
        key=row.key,
        model_type=row.model_type,
        stored_at=row.stored_at,
        profile=profile_message(graph_from_dict(row.profile), str(row.profile["device"])),
    )


def plan_message(result: BurstResult) -> brain_pb2.BurstParallelPlan:
    plan, graph = result.plan, result.graph
    extra = set(plan.parallel)
    return brain_pb2.BurstParallelPlan(
        layers=[
            brain_pb2.LayerPlan(
                name=name,
                device_count=plan.counts[i],
                amplification=result.layer_amplification[i],
                on_extra_devices=i in extra,
            )
            for i, name in enumerate(graph.names)
        ],
        iteration_seconds=plan.iteration_time,
        device_seconds=plan.device_seconds,
        amplification=plan.amplification,
        single_device_seconds=graph.single_device_time(),
        peak_devices=plan.peak_devices,
        data_parallel_seconds=result.data_parallel_seconds,
        elastic_devices=result.elastic_devices,
        global_batch=graph.global_batch,
        max_devices=result.max_devices,
    )
