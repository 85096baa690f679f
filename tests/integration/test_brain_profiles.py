"""Layer profiles and burst-parallel plans through a real Brain process, on PostgreSQL and
SQLite: store, read back, store again (a no-op), replace, plan by key and inline (the same
plan as the planner's own function), and bad input refused naming the field, changing
nothing."""

from __future__ import annotations

import math
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import sqlalchemy as sa

from gearshift.brain.deeppool import FREE_NETWORK, LayerGraph, plan
from gearshift.common.channel import connect
from gearshift.common.db import create_engine
from gearshift.v1 import brain_pb2, brain_pb2_grpc
from tests.conftest import DaemonFactory

B = brain_pb2


@pytest.fixture
def brain(daemons: DaemonFactory, db_url: str) -> Iterator[brain_pb2_grpc.BrainStub]:
    daemon = daemons("brain", ["--database-url", db_url])
    with connect(daemon.address, retry=False) as channel:
        yield brain_pb2_grpc.BrainStub(channel)


def residual_profile(scale: float = 1.0) -> B.LayerProfile:
    """input -> a -> (b -> c) + skip -> add -> d, at 1, 2, 4 devices, global batch 8."""
    names = ["input", "a", "b", "c", "add", "d"]
    seconds = [
        [0.0, 0.0, 0.0],
        [4e-3, 2.1e-3, 1.2e-3],
        [8e-3, 4.1e-3, 2.2e-3],
        [2e-3, 1.5e-3, 1.4e-3],
        [1e-4, 1e-4, 1e-4],
        [1e-3, 9e-4, 9e-4],
    ]
    return B.LayerProfile(
        layers=[
            B.ProfiledLayer(
                name=n,
                seconds=[t * scale for t in s],
                output_bytes_per_sample=4096.0,
                parameter_bytes=0 if n in ("input", "add") else 1 << 16,
            )
            for n, s in zip(names, seconds, strict=True)
        ],
        edges=[
            B.LayerEdge(source=u, target=v)
            for u, v in [(0, 1), (1, 2), (2, 3), (3, 4), (1, 4), (4, 5)]
        ],
        device_counts=[1, 2, 4],
        global_batch=8,
        device="test",
    )


def as_graph(profile: B.LayerProfile) -> LayerGraph:
    return LayerGraph(
        names=tuple(layer.name for layer in profile.layers),
        edges=tuple((e.source, e.target) for e in profile.edges),
        device_counts=tuple(profile.device_counts),
        global_batch=profile.global_batch,
        comp=np.array([list(layer.seconds) for layer in profile.layers]),
        out_bytes=np.array(
            [layer.output_bytes_per_sample * profile.global_batch for layer in profile.layers]
        ),
        param_bytes=np.array([float(layer.parameter_bytes) for layer in profile.layers]),
    )


def test_store_read_back_and_plan(brain: brain_pb2_grpc.BrainStub) -> None:
    profile = residual_profile()
    store = B.StoreLayerProfileRequest(key="spec-abc/cpu", model_type="resnetish", profile=profile)
    first = brain.StoreLayerProfile(store)
    assert (first.written, first.replaced) == (True, False)
    again = brain.StoreLayerProfile(store)
    assert (again.written, again.replaced) == (False, False)  # a retry changes nothing
    stored = brain.GetLayerProfile(B.GetLayerProfileRequest(key="spec-abc/cpu"))
    assert stored.profile == profile and stored.model_type == "resnetish" and stored.stored_at > 0

    request = B.PlanBurstParallelRequest(profile_key="spec-abc/cpu", amp_limit=2.0)
    by_key = brain.PlanBurstParallel(request)
    inline = brain.PlanBurstParallel(B.PlanBurstParallelRequest(profile=profile, amp_limit=2.0))
    assert by_key == inline
    expected = plan(as_graph(profile), amp_limit=2.0)
    assert [layer.device_count for layer in by_key.layers] == list(expected.counts)
    assert [layer.name for layer in by_key.layers] == ["input", "a", "b", "c", "add", "d"]
    assert math.isclose(by_key.iteration_seconds, expected.iteration_time)
    assert math.isclose(by_key.device_seconds, expected.device_seconds)
    assert math.isclose(by_key.amplification, expected.amplification)
    assert all(layer.amplification <= 2.0 + 1e-9 for layer in by_key.layers)
    assert (by_key.global_batch, by_key.max_devices) == (8, 4)
    # Within the limit, slower than data parallelism here (which breaks the limit on "c").
    unlimited = brain.PlanBurstParallel(
        B.PlanBurstParallelRequest(profile_key="spec-abc/cpu", amp_limit=1e9)
    )
    assert unlimited.iteration_seconds <= unlimited.data_parallel_seconds
    assert unlimited.data_parallel_seconds == by_key.data_parallel_seconds
    assert by_key.single_device_seconds == pytest.approx(sum(s.seconds[0] for s in profile.layers))

    # No limit, free network: every layer at its fastest count.
    free = brain.PlanBurstParallel(
        B.PlanBurstParallelRequest(
            profile_key="spec-abc/cpu", amp_limit=1e9, network=B.NetworkSettings(free=True)
        )
    )
    fastest = plan(as_graph(profile), amp_limit=1e9, network=FREE_NETWORK)
    assert [layer.device_count for layer in free.layers] == list(fastest.counts)
    # A device limit and another global batch (derived from the measured per-device batches).
    two = brain.PlanBurstParallel(
        B.PlanBurstParallelRequest(profile_key="spec-abc/cpu", amp_limit=2.0, max_devices=2)
    )
    assert max(layer.device_count for layer in two.layers) <= 2 and two.max_devices == 2
    bigger = brain.PlanBurstParallel(
        B.PlanBurstParallelRequest(profile_key="spec-abc/cpu", amp_limit=2.0, global_batch=16)
    )
    assert bigger.global_batch == 16 and bigger.single_device_seconds > by_key.single_device_seconds

    replaced = brain.StoreLayerProfile(
        B.StoreLayerProfileRequest(key="spec-abc/cpu", profile=residual_profile(2.0))
    )
    assert (replaced.written, replaced.replaced) == (True, True)
    now = brain.GetLayerProfile(B.GetLayerProfileRequest(key="spec-abc/cpu"))
    assert now.profile == residual_profile(2.0)


def _fails(call, request, code: grpc.StatusCode, text: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call(request)
    assert info.value.code() == code, info.value.details()
    assert text in (info.value.details() or ""), info.value.details()


def test_bad_input_names_the_field_and_changes_nothing(
    brain: brain_pb2_grpc.BrainStub, db_url: str
) -> None:
    invalid, missing = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
    good = residual_profile()
    brain.StoreLayerProfile(B.StoreLayerProfileRequest(key="k1", profile=good))

    def store(profile: B.LayerProfile, key: str = "k1") -> B.StoreLayerProfileRequest:
        return B.StoreLayerProfileRequest(key=key, profile=profile)

    short = residual_profile()
    del short.layers[2].seconds[-1]
    _fails(brain.StoreLayerProfile, store(short), invalid, "profile.layers[2].seconds: want one")
    negative = residual_profile()
    negative.layers[1].seconds[0] = -1.0
    _fails(brain.StoreLayerProfile, store(negative), invalid, "profile.layers[1].seconds: must be")
    nan = residual_profile()
    nan.layers[3].seconds[1] = math.nan
    _fails(brain.StoreLayerProfile, store(nan), invalid, "profile.layers[3].seconds")
    twice = residual_profile()
    twice.layers[2].name = "a"
    _fails(brain.StoreLayerProfile, store(twice), invalid, "profile.layers[2].name: 'a' appears")
    backwards = residual_profile()
    backwards.edges[0].source, backwards.edges[0].target = 1, 0
    _fails(brain.StoreLayerProfile, store(backwards), invalid, "profile.edges[0]:")
    two_sources = residual_profile()
    del two_sources.edges[0]
    _fails(brain.StoreLayerProfile, store(two_sources), invalid, "profile.edges: need one source")
    counts = residual_profile()
    counts.device_counts[:] = [1, 3, 4]
    _fails(brain.StoreLayerProfile, store(counts), invalid, "profile.device_counts: want 1, 2, 4")
    _fails(brain.StoreLayerProfile, store(good, key="bad key"), invalid, "key: 'bad key'")
    _fails(brain.StoreLayerProfile, B.StoreLayerProfileRequest(key="k2"), invalid, "profile: is")
    _fails(
        brain.PlanBurstParallel,
        B.PlanBurstParallelRequest(profile_key="k1", amp_limit=0.5),
        invalid,
        "amp_limit: must be >= 1",
    )
    _fails(
        brain.PlanBurstParallel,
        B.PlanBurstParallelRequest(profile_key="k1", amp_limit=2, max_devices=16),
        invalid,
        "max_devices: 16 devices would leave some without a sample of 8",
    )
    _fails(
        brain.PlanBurstParallel,
        B.PlanBurstParallelRequest(amp_limit=2),
        invalid,
        "profile_key: give profile_key or profile",
    )
    _fails(
        brain.PlanBurstParallel,
        B.PlanBurstParallelRequest(
            profile_key="k1", amp_limit=2, network=B.NetworkSettings(latency_seconds=-1)
        ),
        invalid,
        "network.latency_seconds",
    )
    _fails(
        brain.PlanBurstParallel,
        B.PlanBurstParallelRequest(profile_key="nope", amp_limit=2),
        missing,
        "layer profile 'nope' not found",
    )
    _fails(brain.GetLayerProfile, B.GetLayerProfileRequest(key="nope"), missing, "'nope' not found")

    # Nothing changed: the one good profile, as stored.
    assert brain.GetLayerProfile(B.GetLayerProfileRequest(key="k1")).profile == good
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            keys = conn.execute(sa.text("SELECT profile_key FROM brain_layer_profiles")).all()
    finally:
        engine.dispose()
    assert [k for (k,) in keys] == ["k1"]
