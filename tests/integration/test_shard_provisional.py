"""Provisional acknowledgements (dynamic mode, `provisional_acks`) against the real Redis.

An acknowledged shard is DONE (the epoch rolls over without waiting for any
checkpoint) but stays provisional until CoverShards; releasing its holder undoes
it, and the shard is read again in its own epoch, even after that epoch ended.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from collections.abc import Callable

import pytest

from gearshift.common.errors import ConflictError, ValidationError
from gearshift.shardmanager import lua
from gearshift.shardmanager.model import AcquireStatus, DatasetSettings, Mode
from gearshift.shardmanager.store import ShardStore
from gearshift.worker.shard_client import ShardClient
from tests.integration import test_shard_store
from tests.integration.test_shard_service import sm  # noqa: F401 (the fixture)

store = test_shard_store.store  # the fixture: a ShardStore on the test Redis


def provisional(num_epochs: int = 2, **kw: object) -> DatasetSettings:
    return DatasetSettings(
        job_id="job-1", size=50, shard_size=10, seed=7, num_epochs=num_epochs,
        mode=Mode.DYNAMIC, provisional_acks=True, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def read(store: ShardStore, holder: str, count: int) -> list[tuple[int, int]]:
    """Acquire and acknowledge `count` shards (fewer at the end of data)."""
    seen: list[tuple[int, int]] = []
    for _ in range(count):
        result = store.acquire("ds", holder, uuid.uuid4().hex)
        if result.status is AcquireStatus.END_OF_DATA:
            break
        assert result.shard is not None, result
        ref = (result.shard.epoch, result.shard.shard_id)
        store.ack("ds", holder, *ref)
        seen.append(ref)
    return seen


def test_release_undoes_uncovered_acks_of_this_epoch_and_keeps_covered_ones(
    store: ShardStore,
) -> None:
    store.create("ds", provisional())
    first = read(store, "a", 3)
    assert store.cover("ds", "a", first[:2]) == 2
    assert store.cover("ds", "a", first[:2]) == 0  # a retry covers nothing more
    assert store.cover("ds", "b", first[2:]) == 0  # not b's
    undone = store.release("ds", "a")
    assert undone.requeued == (first[2][1],)
    progress = store.describe("ds").epochs[0]
    assert (progress.shards_done, progress.shards_undone, progress.samples_todo) == (2, 1, 30)
    rest = read(store, "b", 3)
    assert rest[0] == first[2]  # the undone shard comes back first, in its epoch
    progress = store.describe("ds").epochs[0]
    assert (progress.shards_done, progress.shards_redelivered) == (5, 1)
    assert Counter(first[:2] + rest) == Counter((0, s) for s in range(5))


def test_an_epoch_rolls_over_while_acks_are_provisional_and_is_read_again_after_a_release(
    store: ShardStore,
) -> None:
    store.create("ds", provisional(num_epochs=3))
    epoch0 = read(store, "a", 5)
    assert read(store, "b", 1)[0][0] == 1  # no WAIT: epoch 0 is DONE though uncovered
    undone = store.release("ds", "a")
    assert len(undone.requeued) == 5
    status = store.describe("ds")
    assert status.epochs[0].shards_done == 0 and status.epochs[0].shards_undone == 5
    again = read(store, "c", 5)
    assert sorted(again) == sorted(epoch0)  # read again as shards of epoch 0
    assert store.ack("ds", "c", *again[0]) is False  # acked by the grant: a retry
    status = store.describe("ds")
    assert (status.epochs[0].shards_done, status.epochs[0].shards_redelivered) == (5, 5)
    assert status.epoch == 1 and status.epochs[1].shards_done == 1
    assert store.release("ds", "c").requeued == tuple(s for _, s in again)  # still provisional
    assert store.cover("ds", "c", again) == 0
    assert sorted(read(store, "d", 5)) == sorted(epoch0)
    assert store.cover("ds", "d", epoch0) == 5
    assert store.release("ds", "d").requeued == ()


def test_every_sample_is_read_at_least_once_per_epoch_through_releases(
    store: ShardStore,
) -> None:
    """A reader covers every 2 shards and is killed (released) every 7: each epoch's
    shards all end up covered, and redeliveries equal the acknowledgements undone."""
    store.create("ds", provisional(num_epochs=3))
    covered: Counter[tuple[int, int]] = Counter()
    undone = 0
    generation = 0
    while not store.describe("ds").finished:
        holder = f"h{generation}"
        pending: list[tuple[int, int]] = []
        refs = read(store, holder, 7)
        for i, ref in enumerate(refs, start=1):
            pending.append(ref)
            if i % 2 == 0 or len(refs) < 7:  # the end of data: the last checkpoint
                store.cover("ds", holder, pending)
                covered.update(pending)
                pending = []
        undone += len(store.release("ds", holder).requeued)
        generation += 1
    assert set(covered) == {(e, s) for e in range(3) for s in range(5)}
    status = store.describe("ds")
    assert sum(p.shards_redelivered for p in status.epochs) == undone > 0
    assert sum(p.shards_undone for p in status.epochs) == undone
    assert all(p.shards_done == 5 for p in status.epochs)


def test_without_provisional_acks_a_release_keeps_acknowledged_shards(store: ShardStore) -> None:
    store.create("ds", dataclasses.replace(provisional(), provisional_acks=False))
    read(store, "a", 2)
    assert store.release("ds", "a").requeued == ()
    assert store.describe("ds").epochs[0].shards_done == 2


def test_cover_shards_over_grpc(sm: Callable[..., str]) -> None:  # noqa: F811
    """The client's view: provisional acks become final with CoverShards; a release undoes
    the rest, which the next reader gets back; bad refs are INVALID_ARGUMENT naming them."""
    with ShardClient(sm()) as client:
        client.create_dataset(
            "ds", job_id="j", size=40, shard_size=10, num_epochs=1, provisional_acks=True
        )
        assert client.describe("ds").config.provisional_acks
        reader = client.consumer("ds", "a", renew=False)
        read = []
        for _ in range(3):
            shard = reader.acquire()
            assert shard is not None and reader.ack(shard)
            read.append((shard.epoch, shard.shard_id))
        assert client.cover("ds", "a", read[:2]) == 2
        assert client.release_holder("ds", "a").requeued == 1
        progress = client.describe("ds").epochs[0]
        assert (progress.shards_done, progress.shards_undone) == (2, 1)
        again = client.consumer("ds", "b", renew=False).acquire()
        assert again is not None and (again.epoch, again.shard_id) == read[2]
        assert again.attempt == 2
        with pytest.raises(ValidationError, match=r"shards\[0\]\.shard_id"):
            client.cover("ds", "b", [(0, -1)])


def test_a_dataset_stored_before_provisional_acks_existed_is_not_a_conflict(
    store: ShardStore,
) -> None:
    """A shard manager upgraded under a running job: the job's processes create their
    dataset again (as every restart does) with the new setting at its default."""
    plain = dataclasses.replace(provisional(), provisional_acks=False)
    store.create("ds", plain)
    meta = store.keys("ds")[0]
    assert store.client.hdel(meta, "provisional") == 1  # as the previous version stored it
    store.create("ds", plain)  # EXISTS, not a conflict
    with pytest.raises(ConflictError, match="provisional"):
        store.create("ds", provisional())


def test_a_repeated_request_gets_the_same_late_grant_back(store: ShardStore) -> None:
    """A late grant's answer lost (the service killed after Redis ran it): the client's
    retry, with the same request id, gets the same shard, not the next one; the first
    would stay provisional under the holder and never be read."""
    store.create("ds", provisional(num_epochs=3))
    epoch0 = read(store, "a", 5)
    assert read(store, "b", 1)[0][0] == 1
    store.release("ds", "a")  # epoch 0's shards go to the late list
    first = store.acquire("ds", "c", "rid-1")
    again = store.acquire("ds", "c", "rid-1")
    assert first.shard is not None and again.shard is not None
    ref = (first.shard.epoch, first.shard.shard_id)
    assert ref in epoch0 and (again.shard.epoch, again.shard.shard_id) == ref
    nxt = store.acquire("ds", "c", "rid-2")
    assert nxt.shard is not None and (nxt.shard.epoch, nxt.shard.shard_id) != ref
    assert store.describe("ds").epochs[0].shards_redelivered == 2


# -- releases at a resume step (the race of a release and a checkpoint's cover) -------


def read_steps(
    store: ShardStore, holder: str, steps: range, *, ack: bool = True
) -> list[tuple[int, int]]:
    """Acquire (and acknowledge) one shard per step, recording the step with the grant."""
    seen = []
    for step in steps:
        result = store.acquire("ds", holder, uuid.uuid4().hex, read_step=step)
        assert result.shard is not None, result
        ref = (result.shard.epoch, result.shard.shard_id)
        if ack:
            store.ack("ds", holder, *ref)
        seen.append(ref)
    return seen


def dataset_state(store: ShardStore) -> tuple[object, ...]:
    """Everything a release or a cover may change, for comparing two interleavings."""
    keys = dict(zip(lua.KEY_NAMES, store.keys("ds"), strict=True))
    client = store.client
    epochs = [
        (p.epoch, p.shards_done, p.shards_undone, p.samples_todo)
        for p in store.describe("ds").epochs
    ]
    return (
        epochs,
        client.lrange(keys["requeue"], 0, -1),
        client.lrange(keys["late"], 0, -1),
        sorted(client.hgetall(keys["uncovered"]).items()),
        sorted(client.hgetall(keys["steps"]).items()),
        sorted(client.hgetall(keys["doing"])),
    )


def test_a_release_at_the_resume_step_keeps_what_the_checkpoint_holds(store: ShardStore) -> None:
    """Reads of steps 0-4, a durable checkpoint at step 3 that nobody covered (its writer
    died): the release at step 3 makes steps 0-2 final and gives back only 3 and 4, with
    the steps that read them; a second release changes nothing (idempotent)."""
    store.create("ds", provisional())
    refs = read_steps(store, "a", range(5))
    result = store.release("ds", "a", resume_step=3)
    assert result.covered == 3
    assert result.requeued == (refs[3][1], refs[4][1])
    assert [(r.epoch, r.shard_id, r.read_step, r.acknowledged) for r in result.released] == [
        (*refs[3], 3, True),
        (*refs[4], 4, True),
    ]
    progress = store.describe("ds").epochs[0]
    assert (progress.shards_done, progress.shards_undone) == (3, 2)
    before = dataset_state(store)
    again = store.release("ds", "a", resume_step=3)
    assert (again.covered, again.requeued, again.released) == (0, (), ())
    assert dataset_state(store) == before
    assert read_steps(store, "b", range(3, 5)) == refs[3:]  # read again, first


def test_a_release_and_the_writers_cover_end_the_same_in_either_order(store: ShardStore) -> None:
    """The race the resume step closes: the checkpoint of step 3 is durable, its writer
    covers steps 0-2 while the next process releases at step 3. Cover then release and
    release then cover leave the same dataset state, and a held (unacknowledged) shard
    of step 5 comes back as well, marked unacknowledged."""
    states = []
    for order in ("cover-first", "release-first"):
        # This test's keys only: the test Redis is shared with tests running beside it.
        stale = list(store.client.scan_iter(match=f"{store.prefix}:*", count=1000))
        if stale:
            store.client.delete(*stale)
        store.create("ds", provisional())
        refs = read_steps(store, "a", range(5))
        held = read_steps(store, "a", range(5, 6), ack=False)
        if order == "cover-first":
            assert store.cover("ds", "a", refs[:3]) == 3
            result = store.release("ds", "a", resume_step=3)
            assert result.covered == 0
        else:
            result = store.release("ds", "a", resume_step=3)
            assert result.covered == 3
            assert store.cover("ds", "a", refs[:3]) == 0  # nothing left to cover
        released = [(r.epoch, r.shard_id, r.read_step, r.acknowledged) for r in result.released]
        assert released == [(*held[0], 5, False), (*refs[3], 3, True), (*refs[4], 4, True)]
        states.append(dataset_state(store))
    assert states[0] == states[1]


def test_a_release_at_a_step_undoes_reads_of_an_epoch_that_rolled_over(store: ShardStore) -> None:
    """Steps 0-6 read epoch 0 (5 shards) and 2 of epoch 1; resuming at step 4 gives back
    epoch 0's shard 4 (to `late`) and both of epoch 1, each with its read step."""
    store.create("ds", provisional(num_epochs=3))
    refs = read_steps(store, "a", range(7))
    assert [e for e, _ in refs] == [0, 0, 0, 0, 0, 1, 1]
    result = store.release("ds", "a", resume_step=4)
    assert result.covered == 4
    assert [(r.epoch, r.shard_id, r.read_step) for r in result.released] == [
        (*refs[4], 4),
        (*refs[5], 5),
        (*refs[6], 6),
    ]  # in the order they were read
    again = read_steps(store, "b", range(4, 7))
    assert again[0] == refs[4]  # the late one first, as a shard of epoch 0
    assert sorted(again[1:]) == sorted(refs[5:])
    status = store.describe("ds")
    assert [p.shards_done for p in status.epochs] == [5, 2]
    assert sum(p.shards_redelivered for p in status.epochs) == 3


def test_a_keep_release_takes_back_held_shards_only(store: ShardStore) -> None:
    """The scheduler's release when a process dies: the held shard goes back, the
    provisional acknowledgements stay for the next process's release at its step."""
    store.create("ds", provisional())
    refs = read_steps(store, "a", range(3))
    held = read_steps(store, "a", range(3, 4), ack=False)
    result = store.release("ds", "a", keep_provisional=True)
    assert result.requeued == (held[0][1],) and result.covered == 0
    assert store.describe("ds").epochs[0].shards_done == 3
    result = store.release("ds", "a", resume_step=2)
    assert (result.covered, result.requeued) == (2, (refs[2][1],))


def test_release_and_acquire_steps_over_grpc(sm: Callable[..., str]) -> None:  # noqa: F811
    """The client's view, and bad input: a negative step, or a resume step with
    keep_provisional, is INVALID_ARGUMENT naming the field and changes nothing."""
    with ShardClient(sm()) as client:
        client.create_dataset(
            "ds", job_id="j", size=40, shard_size=10, num_epochs=1, provisional_acks=True
        )
        reader = client.consumer("ds", "a", renew=False)
        for step in range(3):
            shard = reader.acquire(read_step=step)
            assert shard is not None and reader.ack(shard)
        with pytest.raises(ValidationError, match="resume_step"):
            client.release_holder("ds", "a", resume_step=-1)
        with pytest.raises(ValidationError, match="keep_provisional"):
            client.release_holder("ds", "a", resume_step=1, keep_provisional=True)
        with pytest.raises(ValidationError, match="read_step"):
            client.consumer("ds", "b", renew=False).acquire(read_step=-2)
        with pytest.raises(ValidationError, match="holder_id"):
            client.release_holder("ds", "bad holder", resume_step=1)
        progress = client.describe("ds").epochs[0]
        assert (progress.shards_done, progress.shards_undone, progress.samples_in_flight) == (
            3,
            0,
            0,
        )
        reply = client.release_holder("ds", "a", resume_step=1)
        assert (reply.covered, reply.requeued) == (1, 2)
        assert [(r.read_step, r.acknowledged) for r in reply.released] == [(1, True), (2, True)]
        # A holder that read nothing (a fresh start's release) has nothing to settle.
        nothing = client.release_holder("ds", "never-read", resume_step=0)
        assert (nothing.covered, nothing.requeued) == (0, 0)
