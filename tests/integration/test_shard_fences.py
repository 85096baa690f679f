"""Fences against the real Redis and a real shard manager: a placement's generation keeps an
older placement of the same job off the holders they share.

The chaos soak's failure: placement g4 (on a worker declared lost) kept training for a few
seconds after g5 started; both read under the same holders, so g4's CoverShards made final
the reads g5 had just read again after rolling them back, and a crash of g5 then never read
them again. Here g4's calls after g5's release are refused and change nothing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from gearshift.common.errors import FencedError, PreconditionError, ValidationError
from gearshift.common.facts import shard_holder_id
from gearshift.scheduler.round.datasets import DatasetKeeper
from gearshift.shardmanager.model import DatasetSettings, Mode
from gearshift.shardmanager.store import ShardStore
from gearshift.v1 import shardmanager_pb2 as pb
from gearshift.worker.datasource import DataPlan, DynamicFeed, StalePlacementError
from gearshift.worker.shard_client import ShardClient
from tests.integration import test_shard_store
from tests.integration.test_shard_service import sm  # noqa: F401 (the fixture)
from tests.integration.test_shard_store import snapshot

store = test_shard_store.store  # the fixture: a ShardStore on the test Redis

H = shard_holder_id("job-1", 0)


def provisional(num_epochs: int = 2) -> DatasetSettings:
    return DatasetSettings(
        job_id="job-1", size=50, shard_size=10, seed=7, num_epochs=num_epochs,
        mode=Mode.DYNAMIC, provisional_acks=True,
    )  # fmt: skip


def read(
    store: ShardStore, steps: range, generation: int, *, ack: bool = True, holder: str = H
) -> list[tuple[int, int]]:
    """One shard per step under `holder` for placement `generation` (acknowledged)."""
    seen = []
    for step in steps:
        result = store.acquire(
            "ds", holder, uuid.uuid4().hex, read_step=step, generation=generation
        )
        assert result.shard is not None, result
        ref = (result.shard.epoch, result.shard.shard_id)
        if ack:
            store.ack("ds", holder, *ref, generation=generation)
        seen.append(ref)
    return seen


def two_placements(store: ShardStore) -> tuple[list[tuple[int, int]], tuple[int, int]]:
    """g4 reads steps 0-1 and holds step 2's shard; g5 starts at step 0 and reads the same
    three again. Returns g5's acknowledged reads and the shard it holds."""
    store.create("ds", provisional())
    store.release("ds", H, resume_step=0, generation=4)
    read(store, range(2), 4)
    read(store, range(2, 3), 4, ack=False)
    released = store.release("ds", H, resume_step=0, generation=5)
    assert len(released.requeued) == 3  # g4's reads rolled back, its held shard taken back
    acked = read(store, range(2), 5)
    (held,) = read(store, range(2, 3), 5, ack=False)
    return acked, held


def test_a_stale_placement_can_neither_acquire_ack_renew_cover_nor_release(
    store: ShardStore,
) -> None:
    acked, held = two_placements(store)
    before = snapshot(store, "ds")
    calls: dict[str, Callable[[], object]] = {
        "AcquireShard": lambda: store.acquire("ds", H, "late", read_step=3, generation=4),
        # The same holder has `held` in DOING (g5's): unfenced, g4 would acknowledge it.
        "AckShard": lambda: store.ack("ds", H, *held, generation=4),
        "RenewLeases": lambda: store.renew("ds", H, held[0], [held[1]], generation=4),
        # g5's reads are uncovered under the same holder: unfenced, g4 would make them final.
        "CoverShards": lambda: store.cover("ds", H, acked, generation=4),
        # The scheduler's late release of g4: unfenced, it would take back g5's held shard.
        "ReleaseHolder": lambda: store.release("ds", H, keep_provisional=True, generation=4),
    }
    for rpc, call in calls.items():
        with pytest.raises(FencedError) as refused:
            call()
        fenced = refused.value
        assert isinstance(fenced, PreconditionError)
        assert fenced.code == grpc.StatusCode.FAILED_PRECONDITION
        assert (fenced.holder_id, fenced.generation, fenced.current) == (H, 4, 5)
        assert f"holder {H!r}" in fenced.message and rpc in fenced.message
        assert "generation 5" in fenced.message and "generation 4 is stale" in fenced.message
        assert snapshot(store, "ds") == before, rpc  # nothing changed
    # g5's own calls go on: its reads are still provisional, its shard still held.
    assert store.renew("ds", H, held[0], [held[1]], generation=5).renewed == 1
    assert store.cover("ds", H, acked, generation=5) == 2
    assert store.ack("ds", H, *held, generation=5) is True


def test_a_newer_release_fences_the_older_and_an_older_release_is_refused(
    store: ShardStore,
) -> None:
    store.create("ds", provisional())
    other = shard_holder_id("job-1", 1)
    assert store.release("ds", H, generation=5).requeued == ()
    (held,) = read(store, range(1), 5, ack=False)
    before = snapshot(store, "ds")
    with pytest.raises(FencedError, match="generation 3 is stale"):
        store.release("ds", H, resume_step=0, generation=3)
    assert snapshot(store, "ds") == before  # g5's shard is still held
    store.release("ds", other, generation=3)  # fences are per holder
    read(store, range(1), 3, holder=other)
    # The same generation again is no older: a retried release goes through.
    assert store.release("ds", H, resume_step=0, generation=5).requeued == (held[1],)
    store.release("ds", H, resume_step=0, generation=6)
    with pytest.raises(FencedError, match="generation 5 is stale"):
        read(store, range(1), 5)
    assert len(read(store, range(1), 6)) == 1


def test_calls_without_a_generation_are_not_fenced_and_move_no_fence(store: ShardStore) -> None:
    """Generation 0 (unset: clients and tests that predate fences) works as before, on a
    fenced holder too, and neither raises nor lowers its generation."""
    store.create("ds", provisional())
    store.release("ds", H, generation=5)
    (acked,) = read(store, range(1), 0)
    (held,) = read(store, range(1, 2), 0, ack=False)
    assert store.renew("ds", H, held[0], [held[1]]).renewed == 1
    assert store.cover("ds", H, [acked]) == 1
    assert store.release("ds", H, resume_step=1).requeued == (held[1],)
    with pytest.raises(FencedError):
        read(store, range(1), 4)
    read(store, range(1), 5)


def test_a_restore_keeps_the_fences_and_a_deletion_drops_them(store: ShardStore) -> None:
    """Restoring a snapshot taken while g4 ran must not let g4 back in: fences are not data
    progress. A dataset deleted and created again starts unfenced, as it starts empty."""
    store.create("ds", provisional())
    store.release("ds", H, generation=4)
    read(store, range(2), 4)
    store.checkpoint("ds", "under-g4")
    store.release("ds", H, resume_step=2, generation=5)
    store.restore("ds", "under-g4", force=True)
    with pytest.raises(FencedError, match="generation 4 is stale"):
        read(store, range(2, 3), 4)
    read(store, range(2, 3), 5)
    (fences,) = (key for key in store.keys("ds") if key.endswith(":fences"))
    assert store.client.hget(fences, H) == b"5"
    assert store.delete("ds")
    assert store.client.ttl(fences) > 0  # expires with the dataset's other keys
    store.create("ds", provisional())
    assert store.client.exists(fences) == 0
    read(store, range(1), 1)


# -- over gRPC ---------------------------------------------------------------------------


@pytest.fixture
def client(sm: Callable[..., str]) -> Iterator[ShardClient]:  # noqa: F811
    with ShardClient(sm()) as client:
        yield client


def test_fenced_calls_over_grpc_come_back_as_fenced_errors(client: ShardClient) -> None:
    client.create_dataset(
        "ds", job_id="job-1", size=50, shard_size=10, num_epochs=1, provisional_acks=True
    )
    client.release_holder("ds", H, resume_step=0, generation=5)
    stale = client.consumer("ds", H, renew=False, generation=4)
    with pytest.raises(FencedError) as refused:  # the StreamShards refusal, in-band
        stale.acquire(read_step=0)
    assert (refused.value.holder_id, refused.value.generation, refused.value.current) == (H, 4, 5)
    assert stale.fenced is refused.value
    with pytest.raises(FencedError):  # no second try: the consumer knows
        stale.acquire(read_step=0)
    with pytest.raises(FencedError, match="CoverShards"):
        client.cover("ds", H, [(0, 0)], generation=4)
    with pytest.raises(FencedError, match="ReleaseHolder"):
        client.release_holder("ds", H, keep_provisional=True, generation=4)
    with pytest.raises(grpc.RpcError) as status:
        client.stub.AckShard(pb.AckShardRequest(dataset_id="ds", holder_id=H, generation=4))
    assert status.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert str(status.value.details()).startswith("fenced: ")
    current = client.consumer("ds", H, renew=False, generation=5)
    assert current.acquire(read_step=0) is not None
    for call in (
        lambda: client.cover("ds", H, [], generation=-1),
        lambda: client.release_holder("ds", H, generation=-1),
        lambda: client.consumer("ds", H, generation=-1).acquire(),
    ):
        with pytest.raises(ValidationError, match=r"^generation: must be >= 0"):
            call()


def test_the_schedulers_late_release_of_an_ended_placement_is_refused(
    sm: Callable[..., str],  # noqa: F811
) -> None:
    """The scheduler releases (keep_provisional) the holders of g4's dead process from its
    pool; g5 started meanwhile and holds a shard: the release must not take it back."""
    address = sm()
    client = ShardClient(address)
    keeper = DatasetKeeper(address)
    try:
        _late_release(client, keeper)
    finally:
        keeper.close()
        client.close()


def _late_release(client: ShardClient, keeper: DatasetKeeper) -> None:
    client.create_dataset(
        "ds", job_id="job-1", size=50, shard_size=10, num_epochs=1, provisional_acks=True
    )
    client.release_holder("ds", H, resume_step=0, generation=5)
    held = client.consumer("ds", H, renew=False, generation=5).acquire(read_step=0)
    assert held is not None
    assert keeper.release("ds", "job-1", range(1), "g4's process died", 4) == 0
    assert client.describe("ds").epochs[0].samples_in_flight == 10  # still g5's
    assert keeper.release("ds", "job-1", range(1), "g5's process died", 5) == 1


def test_the_scheduler_fences_the_holders_before_a_new_placement_starts(
    sm: Callable[..., str],  # noqa: F811
) -> None:
    """g4 still runs (its worker was declared lost but is alive) when the scheduler sends
    g5 out: fenced first, g4 can no longer acquire or cover, though g5 has not read yet."""
    address = sm()
    client = ShardClient(address)
    keeper = DatasetKeeper(address)
    try:
        client.create_dataset(
            "ds", job_id="job-1", size=50, shard_size=10, num_epochs=1, provisional_acks=True
        )
        old = client.consumer("ds", H, renew=False, generation=4)
        shard = old.acquire(read_step=7)
        assert shard is not None
        assert keeper.fence("ds", "job-1", range(2), 5)
        with pytest.raises(FencedError):
            client.consumer("ds", H, renew=False, generation=4).acquire(read_step=8)
        with pytest.raises(FencedError):
            client.cover("ds", H, [(shard.epoch, shard.shard_id)], generation=4)
        progress = client.describe("ds").epochs[0]
        assert (progress.samples_in_flight, progress.shards_done) == (0, 0)  # taken back
    finally:
        keeper.close()
        client.close()


# -- the training process's side -----------------------------------------------------------


SIZE, BATCH = 64, 4


def feed(client: ShardClient, generation: int, log: Path) -> DynamicFeed:
    plan = DataPlan(
        dataset_id="ds", job_id="job-1", size=SIZE, shard_size=BATCH, seed=5,
        num_ranks=0, num_epochs=3,
    )  # fmt: skip
    out = DynamicFeed(
        client, plan, BATCH, index_log=log, placement=f"job-1.g{generation}",
        generation=generation,
    )  # fmt: skip
    out.create()
    return out


def test_a_fenced_feed_ends_with_the_clear_error_and_cannot_cover_the_newer_reads(
    client: ShardClient, tmp_path: Path
) -> None:
    """The soak's race, with feeds for processes: g4 trains steps 0-3 (a checkpoint at 2);
    g5 starts from that checkpoint and reads steps 2-3 again; g4, still running, reaches
    its checkpoint of step 4 and would cover steps 2-3 (the same shards, now g5's reads).
    Its cover is refused, its feed stops for good, and g5's reads stay provisional: a
    crash of g5 reads them again."""
    old = feed(client, 4, tmp_path / "g4.jsonl")
    old.begin(0, [0])
    for step in range(4):
        old.next_samples(0, BATCH)
        if step == 1:
            old.checkpoint_durable(2, [old.pending_before(2)])
    new = feed(client, 5, tmp_path / "g5.jsonl")
    new.begin(2, [0])
    again = [new.next_samples(0, BATCH) for _ in range(2)]
    pending = old.pending_before(4)  # g4 does not know yet: nothing told it
    assert len(pending[0]) == 2
    line = "a newer placement of this job holds EST 0: generation 4 < current 5; exiting"
    with pytest.raises(StalePlacementError) as stale:
        old.checkpoint_durable(4, [pending])
    assert str(stale.value) == line
    assert (stale.value.est, stale.value.fenced.current) == (0, 5)
    for call in (lambda: old.next_samples(0, BATCH), lambda: old.pending_before(5)):
        with pytest.raises(StalePlacementError, match="generation 4 < current 5"):
            call()  # no retry, no checkpoint: every later call stops it again
    old.close()
    logged = [json.loads(x) for x in (tmp_path / "g4.jsonl").read_text().splitlines()]
    assert {"kind": "fenced", "est": 0, "generation": 4, "current": 5,
            "placement": "job-1.g4"} in logged  # fmt: skip
    # g5 dies before its next checkpoint: its reads of steps 2-3 are read again.
    crashed = client.release_holder("ds", H, resume_step=2, generation=6)
    again_refs = sorted((r.epoch, r.shard_id) for r in crashed.released if r.read_step in (2, 3))
    assert len(again_refs) == 2 and all(r.acknowledged for r in crashed.released)
    assert sum(len(samples) for _, samples in again) == 2 * BATCH
    new.close()
