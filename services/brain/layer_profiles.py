"""PlanBurstParallel, StoreLayerProfile and GetLayerProfile: requests to validated plain data
and plain data to replies (the profile itself: gearshift.brain.profile_messages).
"""

from __future__ import annotations

import math

from gearshift.brain.deeppool import LayerGraph, Network
from gearshift.brain.deeppool.profiles import graph_from_dict
from gearshift.brain.profile_messages import (
    MAX_DEVICES,
    check_key,
    graph_from_message,
    profile_message,
)
from gearshift.brain.records import ProfileRow
from gearshift.brain.service import BurstRequest, BurstResult
from gearshift.common.errors import ValidationError
from gearshift.common.validation import require
from gearshift.v1 import brain_pb2


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
