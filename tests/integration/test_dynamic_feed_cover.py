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
from typing import Any

import pytest

from gearshift.worker.datasource import DataPlan, DynamicFeed, index_log_path
from gearshift.worker.runtime.data import CheckpointAware
from gearshift.worker.shard_client import ShardClient
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


def feed(client: ShardClient, logs: Path, rank: int, epochs: int = 3) -> DynamicFeed:
    out = DynamicFeed(client, plan(epochs), BATCH, index_log=index_log_path(logs, "job-1", rank))
    out.create()
    return out


def train(feed: DynamicFeed, ests: Sequence[int], start: int, end: int, every: int) -> None:
    """Steps [start, end) of a process holding `ests`: a batch per EST per step, a durable
    checkpoint every `every` steps (and none at `end`: the process dies there)."""
    for step in range(start, end):
        for est in ests:
            epoch, samples = feed.next_samples(est, BATCH)
            assert len(samples) == BATCH and epoch >= 0
        if (step + 1) % every == 0:
            feed.checkpoint_durable(step + 1)


def records(logs: Path) -> list[list[dict[str, Any]]]:
    """Every index log, oldest process first (one file per process)."""
    files = sorted(logs.glob("*.jsonl"), key=lambda p: int(p.name.split(".")[-2]))
    return [[json.loads(line) for line in f.read_text().splitlines()] for f in files]


def uncovered_reads(log: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(epoch, shard) a process read after the last checkpoint that covered its EST."""
    covered: dict[int, int] = {}
    for r in log:
        if r["kind"] == "begin":
            covered = {int(e): int(r["step"]) for e in r["ests"]}
        elif r["kind"] == "covered":
            covered[int(r["est"])] = int(r["step"])
    return [
        (int(r["epoch"]), int(r["shard"]))
        for r in log
        if r["kind"] == "read" and int(r["step"]) >= covered[int(r["est"])]
    ]


def reads(logs: list[list[dict[str, Any]]]) -> Counter[tuple[int, int]]:
    return Counter(
        (int(r["epoch"]), int(r["shard"])) for log in logs for r in log if r["kind"] == "read"
    )


def test_reads_stay_provisional_until_a_durable_checkpoint_covers_their_step(
    client: ShardClient, tmp_path: Path
) -> None:
    first = feed(client, tmp_path, 0)
    assert isinstance(first, CheckpointAware)
    assert client.describe("ds").config.provisional_acks
    first.begin(0, [0, 1])
    train(first, [0, 1], 0, 3, every=2)  # steps 0-1 covered by the checkpoint of step 2
    progress = client.describe("ds").epochs[0]
    assert (progress.shards_done, progress.shards_undone) == (6, 0)
    (log,) = records(tmp_path)
    step2 = uncovered_reads(log)
    assert [r["step"] for r in log if r["kind"] == "read"] == [0, 0, 1, 1, 2, 2]
    assert len(step2) == 2
    # Killed: the next process resumes from step 2 and first gives back what step 2 read.
    second = feed(client, tmp_path, 0)
    second.begin(2, [0, 1])
    progress = client.describe("ds").epochs[0]
    assert (progress.shards_done, progress.shards_undone) == (4, 2)
    train(second, [0, 1], 2, 4, every=2)
    second.checkpoint_durable(4)
    progress = client.describe("ds").epochs[0]
    assert (progress.shards_done, progress.shards_redelivered) == (8, 2)
    logs = records(tmp_path)
    again = [(r["epoch"], r["shard"]) for r in logs[1] if r["kind"] == "read" and r["step"] == 2]
    assert sorted(again) == sorted(step2)  # step 2 read the same shards again, first
    assert logs[1][0] == {"kind": "begin", "step": 2, "ests": [0, 1], "requeued": {"0": 1, "1": 1}}
    # Everything is covered now: a third start gives nothing back.
    third = feed(client, tmp_path, 0)
    third.begin(4, [0, 1])
    assert records(tmp_path)[2][0]["requeued"] == {"0": 0, "1": 0}
    for f in (first, second, third):
        f.close()


def test_kills_and_rescales_read_every_sample_at_least_once_and_only_uncovered_twice(
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
    for placement, start, end, killed in runs:
        procs = [feed(client, tmp_path, rank, epochs=12) for rank in range(len(placement))]
        feeds += procs
        for proc, ests in zip(procs, placement, strict=True):
            proc.begin(start, ests)
        for proc, ests in zip(procs, placement, strict=True):
            train(proc, ests, start, end, every)
            if not killed:
                proc.checkpoint_durable(end)
    logs = records(tmp_path)
    assert len(logs) == 8
    seen = reads(logs)
    # 26 steps x 4 ESTs = 104 reads in the steps kept, and the rolled-back ones again.
    undone = [ref for log in logs for ref in uncovered_reads(log)]
    kept = 26 * ESTS
    assert sum(seen.values()) == kept + len(undone) and len(undone) == 2 * 2 * ESTS
    assert seen - Counter(set(seen)) == Counter(undone)  # read twice: exactly those
    epochs = {epoch for epoch, _ in seen}
    for epoch in sorted(epochs)[:-1]:  # the last one is read in part
        indices = Counter(
            i
            for log in logs
            for r in log
            if r["kind"] == "read" and r["epoch"] == epoch
            for i in r["indices"]
        )
        assert set(indices) == set(range(SIZE)), epoch
    status = client.describe("ds")
    assert sum(p.shards_undone for p in status.epochs) == len(undone)
    assert sum(p.shards_redelivered for p in status.epochs) == len(undone)
    assert all(p.shards_done == SIZE // BATCH for p in status.epochs[:-1])
    for f in feeds:
        f.close()


def test_a_cover_that_fails_leaves_its_shards_provisional_for_the_next_one(
    client: ShardClient, tmp_path: Path
) -> None:
    """A checkpoint whose cover the shard manager refuses: the shards stay uncovered in the
    feed (nothing lost, nothing reported covered) and the next checkpoint covers them."""
    proc = feed(client, tmp_path, 0)
    proc.begin(0, [0])
    train(proc, [0], 0, 2, every=100)
    client.delete_dataset("ds")  # every call about it is NOT_FOUND now
    proc.checkpoint_durable(2)
    assert not [r for r in records(tmp_path)[0] if r["kind"] == "covered"]
    proc.create()  # the same dataset again, empty
    train(proc, [0], 2, 3, every=100)
    proc.checkpoint_durable(3)
    covered = [r for r in records(tmp_path)[0] if r["kind"] == "covered"]
    assert covered == [{"kind": "covered", "step": 3, "est": 0, "shards": 1}]
    proc.close()
