"""Rescales in place through the whole cluster (round.rescaleInPlace): the scheduler's rounds
shrink a running job when a newcomer arrives and grow it back when the newcomer leaves, each
time without restarting the processes it keeps. The job ends with the digest and the per-step
loss bits of the same job on a fixed 4 processes, its RESCALED events say in place, and the
scheduler reports what the in-place rescales cost (from the pause to the first step).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gearshift.client.devcluster import DevCluster
from gearshift.v1 import common_pb2, scheduler_pb2
from tests.e2e.worker_cluster import (
    Reference,
    client_of,
    digits_spec,
    e2e_cluster,
    reference,
    shared_dir,
    started,
    step_log,
)
from tests.helpers import wait_until

STEPS = 360
WAIT = 180.0

C = common_pb2
S = scheduler_pb2


@pytest.fixture
def cluster(tmp_path: Path, postgres_db: str, redis_url: str) -> Iterator[DevCluster]:
    cluster = e2e_cluster(
        tmp_path, postgres_db, redis_url, scheduler={"round": {"rescaleInPlace": True}}
    )
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def ref(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    return reference(shared_dir(tmp_path_factory), STEPS)


def test_a_job_shrunk_and_grown_in_place_ends_with_the_fixed_bits(
    cluster: DevCluster, ref: Reference
) -> None:
    started(cluster)
    with client_of(cluster) as client:
        big = client.submit(digits_spec("big", STEPS)).job_id
        wait_until(lambda: client.get(big).progress.step >= 5, WAIT, "the big job trains")
        # A newcomer takes a device (the big job shrinks in place), then leaves (it grows).
        small = client.submit(digits_spec("small", 100_000, ests=1)).job_id
        wait_until(
            lambda: client.get(small).state == C.JOB_STATE_RUNNING, WAIT, "the newcomer runs"
        )
        wait_until(
            lambda: client.get(big).HasField("in_place_rescale_cost"),
            WAIT,
            "the shrink's first step measured",
        )
        running = client.get(big)  # a finished job's record is the stored one, without costs
        client.cancel(small, reason="leaving")
        job = client.wait(big, timeout=WAIT)
        history = list(client.watch(big))
    assert job.state == C.JOB_STATE_SUCCEEDED, job.message + cluster.log_tails()
    rescaled = [e for e in history if e.type == S.JOB_EVENT_TYPE_RESCALED]
    sizes = [len(e.placement.processes) for e in history if e.placement.processes]
    assert sizes[0] == 4 and min(sizes) < 4 and sizes[-1] == 4, sizes
    # the grow back started only the joining processes (a resize in place pays at once)
    assert any(" join" in e.message and "0 join" not in e.message for e in rescaled)
    assert rescaled and all("in place" in e.message for e in rescaled), [
        e.message for e in rescaled
    ]
    # No rescale stopped the job: nothing was checkpointed to move it.
    assert not [e for e in history if e.type == S.JOB_EVENT_TYPE_CHECKPOINTED]
    cost = running.in_place_rescale_cost
    assert cost.count >= 1 and not running.HasField("rescale_cost")
    assert 0 < cost.last_seconds < 30, cost
    # Counted from when the job paused for the change (it trains on while joiners start).
    said = [e.message for e in history if e.message.startswith("rescale cost in place")]
    assert said and all("s from the pause to the first step" in m for m in said), said
    print("events:", [(S.JobEventType.Name(e.type), e.message) for e in history])
    print("in-place cost:", cost)
    assert job.final_digest == ref.digest
    assert step_log(cluster.checkpoint_root / big / "steps.jsonl") == ref.losses
