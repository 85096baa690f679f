"""The dynamic feed against a real shard manager (gRPC) on the real Redis: its reads stay
provisional until a durable checkpoint covers their steps, and a process that starts again
from a checkpoint gets back exactly what its predecessor read after it.

Processes are simulated by feeds: a "killed" process's feed is dropped without a word (as
SIGKILL would), a stopped one checkpoints first. Each feed keeps an index log, as
`--index-log-dir` makes a training process do, and the counts come from those logs and
from the shard manager's own accounting.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from gearshift.scheduler.round.datasets import DatasetKeeper
from gearshift.worker.datasource import (
    DYNAMIC_MAX_ATTEMPTS,
    DataPlan,
    DynamicFeed,
    index_log_path,
)
from gearshift.worker.runtime.data import CheckpointAware
from gearshift.worker.shard_client import ShardClient
from tests import index_logs
from tests.integration.test_shard_service import sm  # noqa: F401 (the fixture)

SIZE = 64
BATCH = 4  # per EST: one shard of 4 samples a batch, 16 shards an epoch
ESTS = 4


@pytest.fixture
def client(sm: Callable[..., str]) -> Iterator[ShardClient]:  # noqa: F811
    with ShardClient(sm()) as client:
        yield client


def plan(epochs: int = 3) -> DataPlan:
    return DataPlan(
        dataset_id="ds", job_id="job-1", size=SIZE, shard_size=BATCH, seed=5,
        num_ranks=0, num_epochs=epochs,
    )  # fmt: skip


def feed(
    client: ShardClient, logs: Path, rank: int, placement: str = "g1", epochs: int = 3
) -> DynamicFeed:
    out = DynamicFeed(
        client,
        plan(epochs),
        BATCH,
        index_log=index_log_path(logs, "job-1", rank),
        placement=placement,
    )
    out.create()
    return out


def checkpoint(procs: Sequence[DynamicFeed], step: int) -> None:
    """A durable checkpoint of `step`, as the trainer has it: rank 0 (the writer) gets
    every process's pending reads and covers them; then the others forget theirs."""
    pending = [proc.pending_before(step) for proc in procs]
    procs[0].checkpoint_durable(step, pending)
    for proc in procs[1:]:
        proc.checkpoint_durable(step, None)


def train(
    procs: Sequence[DynamicFeed],
    placement: Sequence[Sequence[int]],
    start: int,
    end: int,
    every: int,
) -> None:
    """Steps [start, end) of a placement: a batch per EST per step, a durable checkpoint
    every `every` steps (and none at `end`: the processes die there)."""
    for step in range(start, end):
        for proc, ests in zip(procs, placement, strict=True):
            for est in ests:
                epoch, samples = proc.next_samples(est, BATCH)
                assert len(samples) == BATCH and epoch >= 0
        if (step + 1) % every == 0:
            checkpoint(procs, step + 1)


def loaded(logs: Path) -> list[index_logs.ProcessLog]:
    return index_logs.load(logs, "job-1")


def test_reads_stay_provisional_until_a_durable_checkpoint_covers_their_step(
    client: ShardClient, tmp_path: Path
) -> None:
    first = feed(client, tmp_path, 0)
    assert isinstance(first, CheckpointAware)
    config = client.describe("ds").config
    assert config.provisional_acks and config.max_attempts == DYNAMIC_MAX_ATTEMPTS
    first.begin(0, [0, 1])
    train([first], [[0, 1]], 0, 3, every=2)  # steps 0-1 covered by the checkpoint of step 2
    progress = client.describe("ds").epochs[0]
    assert (progress.shards_done, progress.shards_undone) == (6, 0)
    (log,) = loaded(tmp_path)
    assert [r["step"] for r in log.reads] == [0, 0, 1, 1, 2, 2]
    step2 = index_logs.uncovered([log])
    assert sum(step2.values()) == 2
    # Killed: the next process resumes from step 2 and first gives back what step 2 read.
    second = feed(client, tmp_path, 0, "g2")
    second.begin(2, [0, 1])
    progress = client.describe("ds").epochs[0]
    assert (progress.shards_done, progress.shards_undone) == (4, 2)
    train([second], [[0, 1]], 2, 4, every=2)
    progress = client.describe("ds").epochs[0]
    assert (progress.shards_done, progress.shards_redelivered) == (8, 2)
    logs = loaded(tmp_path)
    again = Counter((r["epoch"], r["shard"]) for r in logs[1].reads if r["step"] == 2)
    assert again == step2  # step 2 read the same shards again, first
    assert (logs[1].start, logs[1].placement) == (2, "g2")
    assert index_logs.read_twice(logs) == step2 and index_logs.rolled_back(logs) == 2
    # Everything is covered now: a third start gives nothing back.
    third = feed(client, tmp_path, 0, "g3")
    third.begin(4, [0, 1])
    begin = json.loads(loaded(tmp_path)[2].path.read_text().splitlines()[0])
    assert begin["requeued"] == {"0": 0, "1": 0}
    for f in (first, second, third):
        f.close()


def test_kills_and_rescales_read_every_sample_at_least_once_and_only_rolled_back_ones_twice(
    client: ShardClient, tmp_path: Path
) -> None:
    """4 ESTs over 2 processes, then 1, then 2 again, killed twice and stopped cleanly
    twice (a rescale checkpoints), across epochs: every epoch handed out in full reads
    every sample; the shards read twice are exactly the killed processes' reads after
    their last checkpoint, which are also what the shard manager undid."""
    every = 3
    halves = [[0, 1], [2, 3]]
    # (placement, start step, last step + 1, killed?); a killed run resumes from its
    # last checkpoint, a stopped one checkpoints where it stops.
    runs = [
        (halves, 0, 8, True),  # killed at step 8: steps 6-7 rolled back
        (halves, 6, 10, False),  # stopped (rescale): checkpoint 10
        ([[0, 1, 2, 3]], 10, 17, True),  # killed: 15-16 rolled back
        ([[0, 1, 2, 3]], 15, 20, False),  # stopped (rescale): checkpoint 20
        (halves, 20, 26, False),  # the end
    ]
    feeds = []
    for n, (placement, start, end, killed) in enumerate(runs):
        procs = [feed(client, tmp_path, r, f"g{n}", epochs=12) for r in range(len(placement))]
        feeds += procs
        for proc, ests in zip(procs, placement, strict=True):
            proc.begin(start, ests)
        train(procs, placement, start, end, every)
        if not killed:
            checkpoint(procs, end)
    logs = loaded(tmp_path)
    assert len(logs) == 8
    seen = index_logs.reads(logs)
    undone = index_logs.uncovered(logs)
    # 26 steps x 4 ESTs = 104 reads in the steps kept, and the rolled-back ones again.
    assert sum(undone.values()) == index_logs.rolled_back(logs) == 2 * 2 * ESTS
    assert sum(seen.values()) == 26 * ESTS + sum(undone.values())
    assert index_logs.read_twice(logs) == undone  # read twice: exactly those
    assert index_logs.unread(logs, SIZE) == {}
    assert len(index_logs.samples_by_epoch(logs)) >= 7
    status = client.describe("ds")
    assert sum(p.shards_undone for p in status.epochs) == sum(undone.values())
    assert sum(p.shards_redelivered for p in status.epochs) == sum(undone.values())
    assert all(p.shards_done == SIZE // BATCH for p in status.epochs[:-1])
    for f in feeds:
        f.close()


def test_a_peer_killed_after_the_checkpoint_is_written_leaves_nothing_provisional(
    client: ShardClient, tmp_path: Path
) -> None:
    """The writer covers every process's reads as soon as the checkpoint is durable: a peer
    that dies before it hears of the checkpoint (in the barrier) loses nothing, and the
    next placement, resuming from that checkpoint, gets nothing back."""
    procs = [feed(client, tmp_path, r) for r in range(2)]
    for proc, ests in zip(procs, [[0, 1], [2, 3]], strict=True):
        proc.begin(0, ests)
    train(procs, [[0, 1], [2, 3]], 0, 2, every=100)
    pending = [proc.pending_before(2) for proc in procs]
    procs[0].checkpoint_durable(2, pending)  # rank 1 dies before its barrier
    nxt = feed(client, tmp_path, 0, "g2")
    nxt.begin(2, [0, 1, 2, 3])
    begin = json.loads(loaded(tmp_path)[2].path.read_text().splitlines()[0])
    assert begin["requeued"] == {"0": 0, "1": 0, "2": 0, "3": 0}
    assert not index_logs.uncovered(loaded(tmp_path))
    for f in (*procs, nxt):
        f.close()


def test_a_cover_that_fails_leaves_its_shards_provisional(
    client: ShardClient, tmp_path: Path
) -> None:
    """A checkpoint whose cover the shard manager refuses: nothing is logged as covered
    (the shards stay provisional: a restart reads them again, none is lost)."""
    proc = feed(client, tmp_path, 0)
    proc.begin(0, [0])
    train([proc], [[0]], 0, 2, every=100)
    client.delete_dataset("ds")  # every call about it is NOT_FOUND now
    checkpoint([proc], 2)
    (log,) = loaded(tmp_path)
    assert log.covered == {} and sum(index_logs.uncovered([log]).values()) == 2
    proc.create()  # the same dataset again, empty
    train([proc], [[0]], 2, 3, every=100)
    checkpoint([proc], 3)
    assert loaded(tmp_path)[0].covered == {0: 3}
    proc.close()


@pytest.mark.parametrize("writer", ["dies before covering", "covers after the release"])
def test_the_schedulers_release_cannot_undo_what_a_durable_checkpoint_holds(
    client: ShardClient,
    sm: Callable[..., str],  # noqa: F811
    tmp_path: Path,
    writer: str,
) -> None:
    """The race issue 16 closes: the checkpoint of step 4 is durable, a peer dies, and the
    scheduler releases the job's holders before the writer has covered (the writer then
    dies too, or covers late). The scheduler's release takes back held shards only; the
    next placement, resuming from step 4, settles steps 0-3 as final and gets back exactly
    what steps 4-5 read: redeliveries equal the reads no checkpoint holds."""
    keeper = DatasetKeeper(sm())  # the scheduler's calls, through another replica
    procs = [feed(client, tmp_path, r) for r in range(2)]
    for proc, ests in zip(procs, [[0, 1], [2, 3]], strict=True):
        proc.begin(0, ests)
    train(procs, [[0, 1], [2, 3]], 0, 6, every=100)  # steps 0-5, nothing covered yet
    pending = [proc.pending_before(4) for proc in procs]  # checkpoint 4 is on disk
    assert keeper.release("ds", "job-1", range(ESTS), "a peer died") == 0  # none held
    if writer == "covers after the release":
        procs[0].checkpoint_durable(4, pending)
    nxt = feed(client, tmp_path, 0, "g2")
    nxt.begin(4, [0, 1, 2, 3])
    train([nxt], [[0, 1, 2, 3]], 4, 8, every=100)
    logs = loaded(tmp_path)
    begin = json.loads(logs[-1].path.read_text().splitlines()[0])
    assert begin["requeued"] == {"0": 2, "1": 2, "2": 2, "3": 2}
    settled = sum(begin["covered"].values())
    assert settled == (16 if writer == "dies before covering" else 0)
    assert all(step >= 4 for items in begin["released"].values() for _, _, step, _ in items)
    rolled = index_logs.rolled_back(logs)
    assert rolled == 2 * ESTS
    assert sum(index_logs.read_twice(logs).values()) == rolled
    status = client.describe("ds")
    assert sum(p.shards_redelivered for p in status.epochs) == rolled
    keeper.close()
    for f in (*procs, nxt):
        f.close()
