"""The whole cluster as processes: a digits CNN job (4 ESTs, elastic 1..4) submitted to the
scheduler runs on worker daemons, reads its data from the shard manager, reports to the
Brain, and ends with exactly the digest of the same job run by the runtime's launcher on a
fixed 4 processes - after rescales, a worker killed with SIGKILL, and a scheduler and a
shard manager killed and restarted mid-job. Each run's step log (rank 0 of every
placement appends every step's per-EST loss bits) must cover every step once at least,
with the reference's bits: no sample lost, skipped or read out of order.
"""

from __future__ import annotations

import itertools
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
from gearshift.v1 import (
    brain_pb2,
    brain_pb2_grpc,
    common_pb2,
    scheduler_pb2,
    shardmanager_pb2,
    shardmanager_pb2_grpc,
)
from tests import index_logs
from tests.e2e.worker_cluster import (
    CHECKPOINT_EVERY,
    READY_TIMEOUT,
    Reference,
    client_of,
    digits_spec,
    e2e_cluster,
    reference,
    running_on,
    shared_dir,
    started,
    step_log,
    step_sequence,
    training_processes,
    worker_tasks,
)
from tests.helpers import wait_until

STEPS = 120
# The job rescaled twice: the elastic rounds grow it back only while its remaining steps
# pay for a restart, which on a loaded machine 120 steps did not always leave.
LONG_STEPS = 360
WAIT = 180.0

C = common_pb2
S = scheduler_pb2
ACTIVE_TASK = (C.TASK_STATE_STARTING, C.TASK_STATE_RUNNING, C.TASK_STATE_STOPPING)


@pytest.fixture
def cluster(tmp_path: Path, postgres_db: str, redis_url: str) -> Iterator[DevCluster]:
    flags = {"workers": ["--index-log-dir", str(tmp_path / "index")]}  # dynamic jobs only
    cluster = e2e_cluster(tmp_path, postgres_db, redis_url, flags=flags)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def ref(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    return reference(shared_dir(tmp_path_factory), STEPS)


@pytest.fixture(scope="session")
def long_ref(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    return reference(shared_dir(tmp_path_factory), LONG_STEPS)


def events(cluster: DevCluster, job_id: str) -> list[S.JobEvent]:
    with client_of(cluster) as client:
        return list(client.watch(job_id))


def kinds(evs: list[S.JobEvent]) -> list[str]:
    return [S.JobEventType.Name(e.type).removeprefix("JOB_EVENT_TYPE_") for e in evs]


def assert_same_steps(cluster: DevCluster, job_id: str, ref: Reference) -> list[int]:
    """Every step ran, each with the reference's per-EST loss bits; returns the sequence."""
    path = cluster.checkpoint_root / job_id / "steps.jsonl"
    assert step_log(path) == ref.losses
    return step_sequence(path)


def job_when(client: Client, job_id: str, ready: Callable[[S.Job], bool], what: str) -> S.Job:
    """The job once `ready(job)` holds."""

    def check() -> S.Job | None:
        job = client.get(job_id)
        return job if ready(job) else None

    found = wait_until(check, WAIT, f"job {job_id}: {what}")
    assert found is not None
    return found


def dataset(cluster: DevCluster, dataset_id: str) -> shardmanager_pb2.Dataset | None:
    with connect(cluster.address("shardmanager")) as channel:
        stub = shardmanager_pb2_grpc.ShardManagerStub(channel)
        try:
            return stub.DescribeDataset(
                shardmanager_pb2.DescribeDatasetRequest(dataset_id=dataset_id)
            )
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
            return None


def test_a_job_ends_with_the_digest_of_a_fixed_placement(
    cluster: DevCluster, ref: Reference
) -> None:
    started(cluster)
    with client_of(cluster) as client:
        job_id = client.submit(digits_spec("digits", STEPS)).job_id
        # Its data comes from the shard manager, in deterministic mode, one rank per EST.
        data = wait_until(lambda: dataset(cluster, job_id), WAIT, "the job's dataset exists")
        assert data is not None
        assert data.config.mode == C.DATA_MODE_DETERMINISTIC and data.config.num_ranks == 4
        job = client.wait(job_id, timeout=WAIT)
    assert job.state == C.JOB_STATE_SUCCEEDED, job.message + cluster.log_tails()
    assert job.final_digest == ref.digest
    assert job.progress.step == STEPS
    assert assert_same_steps(cluster, job_id, ref) == list(range(1, STEPS + 1))
    history = kinds(events(cluster, job_id))
    assert history[:2] == ["SUBMITTED", "STARTED"] and history[-1] == "SUCCEEDED"
    began = next(e for e in events(cluster, job_id) if e.type == S.JOB_EVENT_TYPE_STARTED)
    assert running_on(S.Job(placement=began.placement)) == {"w1": 2, "w2": 2}
    # Rank 0 reported runtime samples to the Brain.
    with connect(cluster.address("brain")) as channel:
        brain = brain_pb2_grpc.BrainStub(channel)
        samples = brain.GetJobHistory(brain_pb2.GetJobHistoryRequest(job_id=job_id)).samples
    assert samples and samples[-1].step > 0 and samples[-1].steps_per_second > 0
    assert samples[-1].device_count == 4 and list(samples[-1].ests_per_device) == [1, 1, 1, 1]
    assert samples[-1].accelerator_type == "cpu" and samples[-1].memory_bytes_used > 0
    # The job's dataset went with it.
    wait_until(lambda: dataset(cluster, job_id) is None, WAIT, "the dataset is deleted")


def test_a_job_rescaled_twice_ends_with_the_same_digest(
    cluster: DevCluster, long_ref: Reference
) -> None:
    ref = long_ref
    started(cluster)
    with client_of(cluster) as client:
        big = client.submit(digits_spec("big", LONG_STEPS)).job_id
        wait_until(lambda: client.get(big).progress.step >= 5, WAIT, "the big job trains")
        # A newcomer takes devices (the big job shrinks), then leaves (it grows again).
        small = client.submit(digits_spec("small", 100_000, ests=1)).job_id
        job_when(
            client,
            big,
            lambda j: j.rescale_count >= 1 and j.state == C.JOB_STATE_RUNNING,
            "shrunk and running again",
        )
        job_when(client, small, lambda j: j.state == C.JOB_STATE_RUNNING, "the newcomer runs")
        client.cancel(small, reason="leaving")
        job = client.wait(big, timeout=WAIT)
    assert job.state == C.JOB_STATE_SUCCEEDED, job.message + cluster.log_tails()
    assert job.rescale_count >= 2
    history = kinds(events(cluster, big))
    assert history.count("RESCALED") >= 2 and history.count("CHECKPOINTED") >= 2
    sizes = [len(e.placement.processes) for e in events(cluster, big) if e.placement.processes]
    assert sizes[0] == 4 and min(sizes) < 4 and sizes[-1] == 4, sizes
    assert job.final_digest == ref.digest
    assert_same_steps(cluster, big, ref)


def test_a_killed_worker_loses_no_sample(cluster: DevCluster, ref: Reference) -> None:
    started(cluster)
    with client_of(cluster) as client:
        job_id = client.submit(digits_spec("survivor", STEPS)).job_id
        job = job_when(client, job_id, lambda j: j.progress.step > CHECKPOINT_EVERY, "a checkpoint")
        victim = job.placement.processes[0].worker_id  # rank 0's worker: the rendezvous too
        (task,) = [t for t in worker_tasks(cluster, victim) if t.state in ACTIVE_TASK]
        assert training_processes(cluster, victim, task.task_id)
        cluster.daemons[victim].kill()
        # Its training processes die with it, as on a lost node.
        wait_until(
            lambda: not training_processes(cluster, victim, task.task_id),
            30,
            "the killed worker's training processes are gone",
        )
        job = client.wait(job_id, timeout=WAIT)
        state = client.cluster()
    assert job.state == C.JOB_STATE_SUCCEEDED, job.message + cluster.log_tails()
    assert job.final_digest == ref.digest
    assert {w.worker_id: w.alive for w in state.workers}[victim] is False
    # It started again elsewhere, from its last checkpoint: every step after the last step
    # run is the next one, or the first one after a checkpoint (the steps since then run
    # again, with the same bits).
    history = kinds(events(cluster, job_id))
    assert history.count("STARTED") >= 2, history
    sequence = assert_same_steps(cluster, job_id, ref)
    for before, after in itertools.pairwise(sequence):
        assert after == before + 1 or (
            after <= before + 1 and (after - 1) % CHECKPOINT_EVERY == 0
        ), sequence


def test_a_restarted_scheduler_and_shard_manager_lose_nothing(
    cluster: DevCluster, ref: Reference
) -> None:
    started(cluster)
    with client_of(cluster) as client:
        job_id = client.submit(digits_spec("steady", STEPS)).job_id
        job = job_when(client, job_id, lambda j: j.progress.step >= 10, "10 steps")
    # At least one epoch (every 32 steps) starts after the restart: its shards are read from
    # the new shard manager.
    assert job.progress.step < 3 * 32, "the job ran too far before the restart"
    cluster.restart("shardmanager", "scheduler", kill=True, timeout=READY_TIMEOUT)
    with client_of(cluster) as client:
        job = client.wait(job_id, timeout=WAIT)
        state = client.cluster()
    assert job.state == C.JOB_STATE_SUCCEEDED, job.message + cluster.log_tails()
    assert job.final_digest == ref.digest
    assert_same_steps(cluster, job_id, ref)
    # The job kept running where it ran: no worker was lost, nothing restarted.
    history = kinds(events(cluster, job_id))
    assert history.count("STARTED") == 1 and "WORKER_LOST" not in history, history
    assert all(w.alive for w in state.workers)


def test_cancel_stops_the_training_processes(cluster: DevCluster) -> None:
    started(cluster, [("w1", "cpu:2")])
    with client_of(cluster) as client:
        job_id = client.submit(digits_spec("endless", 100_000)).job_id
        wait_until(lambda: client.get(job_id).progress.step >= 1, WAIT, "the job trains")
        assert training_processes(cluster, "w1", f"{job_id}.*")
        job = client.cancel(job_id, reason="enough")
        assert job.state == C.JOB_STATE_CANCELLED and job.message == "enough"
    wait_until(
        lambda: not training_processes(cluster, "w1", f"{job_id}.*"),
        30,
        "the training processes exit",
    )
    wait_until(
        lambda: not [t for t in worker_tasks(cluster, "w1") if t.state in ACTIVE_TASK],
        30,
        "the worker has no running task",
    )
    wait_until(lambda: dataset(cluster, job_id) is None, WAIT, "the dataset is deleted")


def test_a_dynamic_mode_job_pulls_its_shards(cluster: DevCluster, tmp_path: Path) -> None:
    """Dynamic mode: not reproducible, but it trains to the end on shards handed out as
    they are asked for (one per EST mini-batch), acknowledged as they are read. Counted
    from the processes' index logs: each step read one shard per EST, every sample of the
    first epoch was read exactly once, and the second epoch went on where the first ended."""
    started(cluster, [("w1", "cpu:2")])
    spec = digits_spec("dynamic", 60)
    spec.dataset.mode = C.DATA_MODE_DYNAMIC
    with client_of(cluster) as client:
        job_id = client.submit(spec).job_id

        def progressed() -> shardmanager_pb2.Dataset | None:
            data = dataset(cluster, job_id)
            return data if data is not None and data.epochs and data.epochs[0].shards_done else None

        data = wait_until(progressed, WAIT, "shards are acknowledged")
        assert data is not None
        assert data.config.mode == C.DATA_MODE_DYNAMIC and data.config.shard_size == 4
        assert data.config.provisional_acks
        job = client.wait(job_id, timeout=WAIT)
    assert job.state == C.JOB_STATE_SUCCEEDED, job.message + cluster.log_tails()
    assert job.final_digest and job.progress.step == 60
    logs = index_logs.load(tmp_path / "index", job_id)
    assert len(logs) == 2 and sorted(log.ests for log in logs) == [(0, 1), (2, 3)]
    steps = Counter((r["step"], r["est"]) for log in logs for r in log.reads)
    assert steps == Counter({(step, est): 1 for step in range(60) for est in range(4)})
    assert not index_logs.read_twice(logs) and not index_logs.uncovered(logs)
    by_epoch = index_logs.samples_by_epoch(logs)
    # 60 steps x 4 ESTs x 4 samples: epoch 0 (512 samples) whole, 448 of epoch 1.
    assert by_epoch[0] == Counter(range(512))
    assert sorted(by_epoch) == [0, 1] and sum(by_epoch[1].values()) == 448
    assert max(by_epoch[1].values()) == 1


def test_a_job_restarted_before_its_first_checkpoint_says_it_starts_over(
    cluster: DevCluster,
) -> None:
    """A training process killed before the job ever checkpointed: the next placement is
    told to resume, finds nothing to resume from, starts again at step 0 and says so in the
    job's events (once), and the job still ends."""
    started(cluster, [("w1", "cpu:2")])
    spec = digits_spec("over", 300, ests=2)  # long enough to be killed well before its end
    spec.checkpoint_every_steps = 1000  # never (a job that ends writes one: not killed then)
    with client_of(cluster) as client:
        job_id = client.submit(spec).job_id
        job_when(client, job_id, lambda j: j.progress.step > 2, "some progress")
        pids = training_processes(cluster, "w1")
        assert pids and client.get(job_id).progress.step < 200
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        done = client.wait(job_id, timeout=WAIT)
    assert done.state == C.JOB_STATE_SUCCEEDED, done.message + cluster.log_tails()
    history = events(cluster, job_id)
    fresh = [e for e in history if e.type == S.JOB_EVENT_TYPE_STARTED_FRESH]
    assert len(fresh) == 1, kinds(history)
    assert "never wrote one" in fresh[0].message
    assert kinds(history).count("STARTED") >= 2
