"""Dynamic data that survives a rollback (issue 14, point 5), on the whole cluster.

A dynamic-mode digits job (4 ESTs, a checkpoint every 10 steps) has a training process
killed with SIGKILL, is shrunk by a newcomer, has a process killed again, and grows back
when the newcomer leaves. A kill rolls the job back to its last checkpoint; the shards the
dead placement read after it were acknowledged only provisionally, so the next placement
gets them back. Counted from the processes' index logs (`--index-log-dir`): every sample
of every epoch handed out in full was read at least once, and the shards read twice are
exactly the reads of the steps run again (at or after the step the next placement resumed
from). Set against the shard manager (its `holder released` log lines name every shard
given back with the step that read it, its counters are polled while the job runs: its
dataset goes with it), exactly: the redeliveries are the shards given back, which are the
rolled-back reads plus the grants a killed process never got to log (at most one per EST
per kill), and not one read that a checkpoint holds.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from gearshift.client.devcluster import DevCluster
from gearshift.client.sdk import Client
from gearshift.common.channel import connect
from gearshift.common.facts import TERMINAL_STATES
from gearshift.v1 import common_pb2, scheduler_pb2, shardmanager_pb2, shardmanager_pb2_grpc
from tests import index_logs
from tests.e2e.worker_cluster import (
    CHECKPOINT_EVERY,
    SIZE,
    client_of,
    digits_spec,
    e2e_cluster,
    started,
    training_processes,
)
from tests.helpers import wait_until

C = common_pb2
S = scheduler_pb2
STEPS = 640  # 20 epochs of 32 steps; ~19 steps/s on 2 cores
WAIT = 120.0


@pytest.fixture
def cluster(tmp_path: Path, postgres_db: str, redis_url: str) -> Iterator[DevCluster]:
    flags = {"workers": ["--index-log-dir", str(tmp_path / "index")]}
    cluster = e2e_cluster(tmp_path, postgres_db, redis_url, flags=flags)
    try:
        yield cluster
    finally:
        cluster.stop()


class Ledger:
    """The dataset's per-epoch progress as the shard manager last told it."""

    def __init__(self, cluster: DevCluster, dataset_id: str) -> None:
        self.cluster = cluster
        self.dataset_id = dataset_id
        self.epochs: dict[int, shardmanager_pb2.EpochProgress] = {}

    def poll(self) -> None:
        with connect(self.cluster.address("shardmanager")) as channel:
            stub = shardmanager_pb2_grpc.ShardManagerStub(channel)
            request = shardmanager_pb2.DescribeDatasetRequest(dataset_id=self.dataset_id)
            try:
                data = stub.DescribeDataset(request, timeout=5)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.NOT_FOUND, exc  # not yet, or gone
                return
        for progress in data.epochs:
            self.epochs[progress.epoch] = progress

    def total(self, name: str) -> int:
        return sum(getattr(p, name) for p in self.epochs.values())


def started_count(client: Client, job_id: str) -> int:
    return sum(e.type == S.JOB_EVENT_TYPE_STARTED for e in client.events(job_id))


def follow(
    client: Client, ledger: Ledger, job_id: str, ready: Callable[[S.Job], bool], what: str
) -> S.Job:
    """Poll the job (and the ledger) until `ready(job)`."""

    def check() -> S.Job | None:
        ledger.poll()
        job = client.get(job_id)
        assert job.state not in TERMINAL_STATES or ready(job), (
            f"{job_id} ended before {what}: {job.message}"
        )
        return job if ready(job) else None

    found = wait_until(check, WAIT, f"job {job_id}: {what}", interval=0.2)
    assert found is not None
    return found


def reads_past_cover(index_dir: Path, job_id: str) -> int:
    """Steps the job's current placement has read past its last covering checkpoint,
    from its processes' index logs (written a line at a time, read live)."""
    groups = index_logs.placements(index_logs.load(index_dir, job_id))
    if not groups:
        return -1
    group = groups[-1]
    steps = [int(r["step"]) for log in group for r in log.reads]
    if not steps:
        return -1
    cover = max((s for log in group for s in log.covered.values()), default=group[0].start)
    return max(steps) - max(int(cover), group[0].start)


def kill_one(
    cluster: DevCluster, client: Client, ledger: Ledger, job_id: str, index_dir: Path
) -> int:
    """SIGKILL one of the job's training processes (the last rank's, not the rendezvous)
    once its placement has read a few steps past its last checkpoint and is short of the
    next (seen in the index logs, not in the lagging progress reports, so that a kill
    always rolls something back); wait for the job to run again past the step it was
    killed at. Returns that step."""
    first = client.get(job_id).progress.step
    follow(
        client,
        ledger,
        job_id,
        lambda j: j.state == C.JOB_STATE_RUNNING and j.progress.step >= first + CHECKPOINT_EVERY,
        "past a checkpoint",
    )
    wait_until(
        lambda: 2 <= reads_past_cover(index_dir, job_id) <= CHECKPOINT_EVERY // 2 + 1,
        60.0,
        "reads a few steps past the last checkpoint",
        interval=0.01,
    )
    job = client.get(job_id)
    starts = started_count(client, job_id)
    last = max(p.rank for p in job.placement.processes)
    pids = training_processes(cluster, "*", f"{job.job_id}.*")
    assert pids, "no training process to kill"
    by_rank = {}
    for pid_file in cluster.work_root.glob(f"*/tasks/{job_id}.*/rank*.pid"):
        pid = int(pid_file.read_text())
        if pid in pids:
            by_rank[int(pid_file.stem.removeprefix("rank"))] = pid
    victim = by_rank.get(last) or pids[0]
    os.kill(victim, signal.SIGKILL)
    at = job.progress.step
    follow(
        client,
        ledger,
        job_id,
        lambda j: (
            started_count(client, job_id) > starts
            and j.state == C.JOB_STATE_RUNNING
            and j.progress.step >= at + CHECKPOINT_EVERY
        ),
        "running again past the kill",
    )
    return at


@pytest.mark.slow
def test_a_killed_and_rescaled_dynamic_job_reads_every_sample_and_only_rolled_back_ones_twice(
    cluster: DevCluster, tmp_path: Path
) -> None:
    started(cluster)
    spec = digits_spec("rollback", STEPS)
    spec.dataset.mode = C.DATA_MODE_DYNAMIC
    with client_of(cluster) as client:
        job_id = client.submit(spec).job_id
        ledger = Ledger(cluster, job_id)
        kills = [kill_one(cluster, client, ledger, job_id, tmp_path / "index")]
        # A newcomer takes a device: the job shrinks (a checkpointed stop, nothing rolled back).
        newcomer = client.submit(digits_spec("newcomer", 100_000, ests=1)).job_id
        follow(
            client,
            ledger,
            job_id,
            lambda j: (
                j.rescale_count >= 1
                and j.state == C.JOB_STATE_RUNNING
                and len(j.placement.processes) < 4
            ),
            "shrunk and running again",
        )
        kills.append(kill_one(cluster, client, ledger, job_id, tmp_path / "index"))
        client.cancel(newcomer, reason="leaving")
        follow(
            client,
            ledger,
            job_id,
            lambda j: j.rescale_count >= 2 and len(j.placement.processes) == 4,
            "grown back to 4 processes",
        )
        job = follow(client, ledger, job_id, lambda j: j.state in TERMINAL_STATES, "its end")
        history = [e.type for e in client.events(job_id)]
    assert job.state == C.JOB_STATE_SUCCEEDED, job.message + cluster.log_tails()
    assert job.progress.step == STEPS
    assert history.count(S.JOB_EVENT_TYPE_RESCALED) >= 2
    logs = index_logs.load(tmp_path / "index", job_id)
    twice = index_logs.read_twice(logs)
    uncovered = index_logs.uncovered(logs)
    rolled_back = index_logs.rolled_back(logs)
    shard_log = (cluster.logs / "shardmanager.log").read_text()
    given = index_logs.given_back(shard_log, job_id)
    audit = index_logs.audit(logs, given)
    undone, redelivered = ledger.total("shards_undone"), ledger.total("shards_redelivered")
    figures = (
        f"kills at steps {kills}; {len(index_logs.placements(logs))} placements, {len(logs)} "
        f"processes; shards read twice {sum(twice.values())}, read after their placement's "
        f"last cover {sum(uncovered.values())}, reads of steps run again {rolled_back}; "
        f"{audit.figures()}; shard manager: undone {undone}, redelivered {redelivered}"
    )
    print(figures)
    # Every sample of every epoch handed out in full was read, at least once.
    assert index_logs.unread(logs, SIZE) == {}, figures
    assert len(index_logs.samples_by_epoch(logs)) >= STEPS * 4 * 4 // SIZE, figures
    # Read twice: exactly the shards the killed processes read for the steps rolled back.
    rolled_refs = Counter((epoch, shard) for _, epoch, shard, _ in audit.rolled_back.elements())
    assert twice == rolled_refs, figures
    assert sum(audit.rolled_back.values()) == rolled_back > 0, figures
    total = sum(len(log.reads) for log in logs)
    assert total == STEPS * 4 + rolled_back, figures
    # Exact: every rolled-back read was given back, nothing a checkpoint held was, and
    # the redeliveries are what was given back: the rolled-back reads and the grants the
    # killed processes never logged (at most one per EST per kill: a kill takes the
    # whole placement down).
    assert not audit.lost and not audit.held_back, figures
    assert sum(audit.unlogged.values()) <= 4 * len(kills), figures
    assert redelivered == len(given), figures
    assert redelivered == rolled_back + sum(audit.unlogged.values()), figures
    assert undone == sum(g.acknowledged for g in given), figures
