"""ShardStore against the real Redis: transitions, leases, retry limit, epochs, snapshots, errors.

Each test uses its own dataset id (and its own key prefix), so tests run in
parallel on the shared Redis. Two ShardStore objects on one Redis stand for
two replicas of the service: neither keeps state of its own.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
import redis

from gearshift.common.errors import (
    ConflictError,
    InternalError,
    NotFoundError,
    PreconditionError,
    ValidationError,
)
from gearshift.common.sharding import epoch_order, rank_sequence, shard_indices, shard_range
from gearshift.shardmanager import lua
from gearshift.shardmanager import store as store_module
from gearshift.shardmanager.model import AcquireStatus, DatasetSettings, Mode
from gearshift.shardmanager.store import Script, ShardStore, order_bytes
from tests.helpers import wait_until


@pytest.fixture
def store(redis_url: str, unique_id: str) -> Iterator[ShardStore]:
    prefix = f"gstest:{unique_id}"
    s = ShardStore.from_url(redis_url, prefix=prefix, deleted_ttl_seconds=30)
    s.load_scripts()
    yield s
    keys = list(s.client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        s.client.delete(*keys)
    s.close()


def dynamic(size: int = 50, shard_size: int = 10, **kw: object) -> DatasetSettings:
    settings: dict[str, object] = {
        "job_id": "job-1",
        "size": size,
        "shard_size": shard_size,
        "seed": 7,
        "num_epochs": 2,
        "mode": Mode.DYNAMIC,
        "lease_ms": 60_000,
        "max_attempts": 3,
    }
    settings.update(kw)
    return DatasetSettings(**settings)  # type: ignore[arg-type]


def snapshot(store: ShardStore, dataset: str) -> dict[str, object]:
    """Every key of the dataset with its value, to check that a refused call changed nothing."""
    out: dict[str, object] = {}
    for key in store.keys(dataset):
        raw = store.client.type(key)
        kind = raw.decode() if isinstance(raw, bytes) else str(raw)
        if kind == "hash":
            out[key] = store.client.hgetall(key)
        elif kind == "list":
            out[key] = store.client.lrange(key, 0, -1)
        elif kind == "zset":
            out[key] = store.client.zrange(key, 0, -1, withscores=True)
        elif kind == "string":
            out[key] = store.client.get(key)
    return out


def drain(store: ShardStore, dataset: str, holder: str = "h") -> list[tuple[int, int]]:
    """Acquire and ack until the end of data; returns (epoch, shard) in order."""
    seen: list[tuple[int, int]] = []
    while True:
        result = store.acquire(dataset, holder, uuid.uuid4().hex)
        if result.status is AcquireStatus.END_OF_DATA:
            return seen
        assert result.shard is not None, result
        seen.append((result.shard.epoch, result.shard.shard_id))
        assert store.ack(dataset, holder, result.shard.epoch, result.shard.shard_id)


def test_shards_follow_the_seeded_epoch_order_and_epochs_roll_over(store: ShardStore) -> None:
    store.create("ds", dynamic(size=45, shard_size=10, num_epochs=3))
    seen = drain(store, "ds")
    expected = [(e, s) for e in range(3) for s in epoch_order(5, 7, e)]
    assert seen == expected
    status = store.describe("ds")
    assert status.finished and status.epoch == 2
    for progress in status.epochs:
        assert (progress.samples_done, progress.shards_done, progress.samples_todo) == (45, 5, 0)
        assert progress.samples_redelivered == progress.samples_failed == 0


def test_grant_carries_indices_lease_and_attempt(store: ShardStore) -> None:
    store.create("ds", dynamic(size=25, shard_size=10, shuffle_within_shard=True, lease_ms=2000))
    result = store.acquire("ds", "h", "r1")
    shard = result.shard
    assert shard is not None and result.lease_seconds == 2.0
    assert shard.shard_id == epoch_order(3, 7, 0)[0] and shard.attempt == 1
    assert (shard.start, shard.end) == shard_range(shard.shard_id, 25, 10)
    assert list(shard.indices or ()) == shard_indices(
        shard.shard_id, 25, 10, 7, 0, shuffle_within=True
    )
    now_ms = store.describe("ds").at_ms
    assert 0 < shard.lease_deadline_ms - now_ms <= 2000


def test_progress_counts_in_flight_todo_and_the_short_last_shard(store: ShardStore) -> None:
    store.create("ds", dynamic(size=25, shard_size=10, seed=1))
    order = epoch_order(3, 1, 0)
    grants = [store.acquire("ds", "h", f"r{i}").shard for i in range(3)]
    assert [g.shard_id for g in grants if g] == order
    last = next(g for g in grants if g and g.shard_id == 2)
    store.ack("ds", "h", 0, last.shard_id)
    (progress,) = store.describe("ds").epochs
    assert (progress.samples_done, progress.samples_in_flight, progress.samples_todo) == (5, 20, 0)


def test_the_same_request_id_gets_the_same_shard_back(store: ShardStore) -> None:
    store.create("ds", dynamic())
    first = store.acquire("ds", "h", "req-1")
    again = store.acquire("ds", "h", "req-1")
    other = store.acquire("ds", "h", "req-2")
    assert first.shard is not None and again.shard is not None and other.shard is not None
    assert again.shard.shard_id == first.shard.shard_id
    assert other.shard.shard_id != first.shard.shard_id
    assert store.describe("ds").epochs[0].samples_in_flight == 20
    # A retried combined call (ack + acquire) gets its grant back; the ack shows as done before.
    combined = store.acquire("ds", "h", "req-3", (0, first.shard.shard_id))
    retried = store.acquire("ds", "h", "req-3", (0, first.shard.shard_id))
    assert combined.acked is True and retried.acked is False
    assert combined.shard == retried.shard


def test_ack_is_exactly_once_and_names_what_is_wrong(store: ShardStore) -> None:
    store.create("ds", dynamic())
    mine = store.acquire("ds", "alice", "r1").shard
    theirs = store.acquire("ds", "bob", "r2").shard
    assert mine is not None and theirs is not None
    before = snapshot(store, "ds")
    with pytest.raises(
        PreconditionError, match=r"not held by holder 'alice'; it is now held by 'bob'"
    ):
        store.ack("ds", "alice", 0, theirs.shard_id)
    with pytest.raises(PreconditionError, match="waiting in TODO"):
        store.ack("ds", "alice", 0, epoch_order(5, 7, 0)[4])
    with pytest.raises(ValidationError, match="shard_id: must be < 5"):
        store.ack("ds", "alice", 0, 5)
    with pytest.raises(ValidationError, match="epoch: has not started"):
        store.ack("ds", "alice", 1, mine.shard_id)
    with pytest.raises(NotFoundError, match="dataset 'nope' not found"):
        store.ack("nope", "alice", 0, 0)
    assert snapshot(store, "ds") == before
    assert store.ack("ds", "alice", 0, mine.shard_id) is True
    assert store.ack("ds", "alice", 0, mine.shard_id) is False  # a retried ack
    with pytest.raises(PreconditionError, match="acknowledged by 'alice'"):
        store.ack("ds", "bob", 0, mine.shard_id)
    assert store.describe("ds").epochs[0].shards_done == 1


def test_released_holder_shards_go_to_the_head_of_todo_then_fail_past_the_limit(
    store: ShardStore,
) -> None:
    store.create("ds", dynamic(max_attempts=2))
    held = [store.acquire("ds", "dead", f"r{i}").shard for i in range(2)]
    ids = tuple(s.shard_id for s in held if s)
    released = store.release("ds", "dead")
    assert released.requeued == ids and released.failed == ()
    with pytest.raises(PreconditionError, match="holder 'dead' was released"):
        store.ack("ds", "dead", 0, ids[0])
    again = [store.acquire("ds", "next", f"s{i}").shard for i in range(2)]
    assert [(s.shard_id, s.attempt) for s in again if s] == [(i, 2) for i in ids]
    progress = store.describe("ds").epochs[0]
    assert (progress.shards_redelivered, progress.samples_redelivered) == (2, 20)
    # Second loss: the retry limit (2 deliveries) is reached; the shards fail and are reported.
    released = store.release("ds", "next")
    assert released.requeued == () and released.failed == ids
    rest = drain(store, "ds")
    assert {s for e, s in rest if e == 0}.isdisjoint(ids)
    progress = store.describe("ds").epochs[0]
    assert progress.failed_shards == tuple(sorted(ids))
    assert (progress.samples_failed, progress.samples_done, progress.samples_todo) == (20, 30, 0)
    assert store.describe("ds").epochs[1].samples_done == 50  # the next epoch is whole again


def test_expired_lease_is_taken_back_by_the_next_acquire(store: ShardStore) -> None:
    store.create("ds", dynamic(size=20, lease_ms=300))
    lapsed = store.acquire("ds", "slow", "r1").shard
    assert lapsed is not None
    done = store.acquire("ds", "other", "r2").shard
    assert done is not None
    store.ack("ds", "other", 0, done.shard_id)
    waited = store.acquire("ds", "third", "r3")
    assert waited.status is AcquireStatus.WAIT
    redelivered = wait_until(
        lambda: store.acquire("ds", "third", "r3").shard,
        timeout=10,
        message="the expired shard was not redelivered",
    )
    assert redelivered is not None
    assert (redelivered.shard_id, redelivered.attempt) == (lapsed.shard_id, 2)
    with pytest.raises(
        PreconditionError, match=r"lease of holder 'slow' .* expired .* now held by 'third'"
    ):
        store.ack("ds", "slow", 0, lapsed.shard_id)
    assert store.ack("ds", "third", 0, lapsed.shard_id)
    assert store.describe("ds").epochs[0].shards_redelivered == 1


def test_an_overdue_lease_nobody_took_back_may_still_be_acked(store: ShardStore) -> None:
    store.create("ds", dynamic(size=20, lease_ms=200))
    shard = store.acquire("ds", "slow", "r1").shard
    assert shard is not None
    wait_until(
        lambda: store.describe("ds").at_ms > shard.lease_deadline_ms,
        timeout=10,
        message="lease did not run out",
    )
    assert store.ack("ds", "slow", 0, shard.shard_id) is True
    assert store.describe("ds").epochs[0].shards_redelivered == 0


def test_renewal_keeps_a_lease_and_reports_lost_shards(store: ShardStore) -> None:
    store.create("ds", dynamic(size=30, lease_ms=300))
    kept = store.acquire("ds", "h", "r1").shard
    dropped = store.acquire("ds", "h", "r2").shard
    assert kept is not None and dropped is not None
    stolen: list[int] = []

    def renewed_then_stolen() -> bool:
        result = store.renew("ds", "h", 0, [kept.shard_id])
        assert result.lost == ()
        grant = store.acquire("ds", "thief", uuid.uuid4().hex).shard
        if grant is not None:
            stolen.append(grant.shard_id)
        return dropped.shard_id in stolen

    wait_until(renewed_then_stolen, timeout=10, message="unrenewed lease was not taken back")
    assert kept.shard_id not in stolen
    result = store.renew("ds", "h", 0, [kept.shard_id, dropped.shard_id])
    assert result.renewed == 1 and result.lost == (dropped.shard_id,)
    assert store.ack("ds", "h", 0, kept.shard_id)


def test_concurrent_acquirers_on_two_replicas_never_share_a_shard(
    redis_url: str, store: ShardStore
) -> None:
    replica = ShardStore.from_url(redis_url, prefix=store.prefix)
    store.create("ds", dynamic(size=400, shard_size=1, num_epochs=3))
    taken: list[tuple[int, int]] = []
    lock = threading.Lock()

    def work(s: ShardStore, holder: str) -> None:
        while True:
            result = s.acquire("ds", holder, uuid.uuid4().hex)
            if result.status is AcquireStatus.END_OF_DATA:
                return
            if result.shard is None:
                continue
            with lock:
                taken.append((result.shard.epoch, result.shard.shard_id))
            s.ack("ds", holder, result.shard.epoch, result.shard.shard_id)

    threads = [
        threading.Thread(target=work, args=(store if i % 2 else replica, f"h{i}")) for i in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    replica.close()
    assert Counter(taken) == Counter((e, s) for e in range(3) for s in range(400))


def test_lease_expiry_on_two_replicas_redelivers_once(redis_url: str, store: ShardStore) -> None:
    replica = ShardStore.from_url(redis_url, prefix=store.prefix)
    store.create("ds", dynamic(size=10, lease_ms=1000, num_epochs=1))  # one shard
    lapsed = store.acquire("ds", "dead", "r0").shard
    assert lapsed is not None
    grants: list[tuple[str, int]] = []

    def poll(s: ShardStore, holder: str) -> None:
        def once() -> bool:
            result = s.acquire("ds", holder, f"{holder}-req")
            if result.shard is not None:
                grants.append((holder, result.shard.attempt))
                s.ack("ds", holder, result.shard.epoch, result.shard.shard_id)
                return True
            return result.status is AcquireStatus.END_OF_DATA

        wait_until(once, timeout=20, message=f"{holder} got no answer")

    threads = [
        threading.Thread(target=poll, args=(s, h))
        for s, h in [(store, "a"), (replica, "b"), (store, "c"), (replica, "d")]
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    replica.close()
    # The one shard came back exactly once, to one of the four; the others then saw the end.
    assert [attempt for _, attempt in grants] == [2], grants
    progress = store.describe("ds").epochs[0]
    assert (progress.shards_redelivered, progress.shards_done) == (1, 1)


def test_checkpoint_then_restore_replays_the_same_stream(store: ShardStore) -> None:
    store.create("ds", dynamic(size=60, num_epochs=3))
    drain_n = [store.acquire("ds", "h", f"a{i}").shard for i in range(4)]
    for s in drain_n:
        assert s is not None
        store.ack("ds", "h", s.epoch, s.shard_id)
    taken = store.checkpoint("ds", "step-4")
    after = drain(store, "ds")  # the rest of epoch 0 and epochs 1, 2
    assert len(after) == 6 * 3 - 4
    with pytest.raises(NotFoundError, match="checkpoint 'ds/nope' not found"):
        store.restore("ds", "nope")
    restored = store.restore("ds", "step-4")
    assert restored.epochs == taken.epochs and restored.epoch == 0
    assert drain(store, "ds") == after


def test_restore_puts_doing_back_at_the_head_and_refuses_a_live_dataset(store: ShardStore) -> None:
    store.create("ds", dynamic(size=60))
    a = store.acquire("ds", "h1", "r1").shard
    b = store.acquire("ds", "h2", "r2").shard
    assert a is not None and b is not None
    store.checkpoint("ds", "c")
    store.ack("ds", "h1", 0, a.shard_id)
    before = snapshot(store, "ds")
    with pytest.raises(PreconditionError, match=r"dataset 'ds' is live: 1 shards are held"):
        store.restore("ds", "c")
    assert snapshot(store, "ds") == before
    store.restore("ds", "c", force=True)
    with pytest.raises(PreconditionError, match="not held by holder 'h2'"):
        store.ack("ds", "h2", 0, b.shard_id)  # the force took it away
    progress = store.describe("ds").epochs[0]
    assert (progress.samples_in_flight, progress.samples_todo, progress.samples_done) == (0, 60, 0)
    first = [store.acquire("ds", "n", f"x{i}").shard for i in range(3)]
    order = epoch_order(6, 7, 0)
    assert [(s.shard_id, s.attempt) for s in first if s] == [
        (a.shard_id, 2),
        (b.shard_id, 2),
        (order[2], 1),
    ]


def test_restore_into_another_epoch_and_after_the_end(store: ShardStore) -> None:
    store.create("ds", dynamic(size=30, num_epochs=2))
    store.checkpoint("ds", "start")
    everything = drain(store, "ds")
    assert store.describe("ds").finished
    store.checkpoint("ds", "end")
    store.restore("ds", "start")
    assert not store.describe("ds").finished
    assert drain(store, "ds") == everything
    store.restore("ds", "end")
    assert store.acquire("ds", "h", "r").status is AcquireStatus.END_OF_DATA


def test_create_is_idempotent_conflicts_are_refused_and_delete_expires_keys(
    store: ShardStore,
) -> None:
    settings = dynamic()
    store.create("ds", settings)
    store.acquire("ds", "h", "r1")
    again = store.create("ds", settings)
    assert again.epochs[0].samples_in_flight == 10  # the existing dataset, untouched
    before = snapshot(store, "ds")
    with pytest.raises(ConflictError, match="dataset 'ds' exists with size='50', not '60'"):
        store.create("ds", dynamic(size=60))
    assert snapshot(store, "ds") == before
    assert store.delete("ds") is True
    assert store.delete("ds") is False
    with pytest.raises(NotFoundError, match="dataset 'ds' not found"):
        store.describe("ds")
    with pytest.raises(NotFoundError):
        store.acquire("ds", "h", "r2")
    for key in store.keys("ds"):
        if store.client.exists(key):
            assert 0 < store.client.ttl(key) <= 30, key
    recreated = store.create("ds", dynamic(size=60))
    assert recreated.epochs[0].samples_todo == 60
    assert store.client.ttl(store.keys("ds")[0]) == -1


def test_job_end_deletes_its_datasets(store: ShardStore) -> None:
    store.create("a", dynamic(job_id="job-x"))
    store.create("b", dynamic(job_id="job-x"))
    store.create("c", dynamic(job_id="job-y"))
    assert store.datasets_of_job("job-x") == ["a", "b"]
    assert store.delete_job("job-x") == ["a", "b"]
    assert store.delete_job("job-x") == []
    store.describe("c")
    with pytest.raises(NotFoundError):
        store.describe("a")


def test_modes_refuse_each_others_calls(store: ShardStore) -> None:
    store.create("dyn", dynamic())
    store.create("det", dynamic(mode=Mode.DETERMINISTIC, num_ranks=2))
    with pytest.raises(PreconditionError, match="'det' is in deterministic mode; use GetShardsAt"):
        store.acquire("det", "h", "r")
    with pytest.raises(PreconditionError, match="'dyn' is in dynamic mode"):
        store.shards_at("dyn", 0, 0, 0, 1)
    with pytest.raises(PreconditionError, match="deterministic mode"):
        store.checkpoint("det", "c")
    assert store.describe("det").epochs == ()


def test_deterministic_mode_serves_the_common_rank_sequences(store: ShardStore) -> None:
    store.create("det", dynamic(size=95, mode=Mode.DETERMINISTIC, num_ranks=3, num_epochs=2,
                                shuffle_within_shard=True))  # fmt: skip
    for epoch in range(2):
        for rank in range(3):
            expected = rank_sequence(10, 7, epoch, 3, rank)
            got = store.shards_at("det", rank, epoch, 0, 100)
            assert got.sequence_length == len(expected)
            assert [s.shard_id for s in got.shards] == expected
            for s in got.shards:
                want = shard_indices(s.shard_id, 95, 10, 7, epoch, shuffle_within=True)
                assert list(s.indices or ()) == want
    assert (
        store.shards_at("det", 1, 0, 2, 5).shards == store.shards_at("det", 1, 0, 0, 5).shards[2:]
    )
    assert store.shards_at("det", 1, 0, 99, 5).shards == ()
    with pytest.raises(ValidationError, match="rank: must be < 3"):
        store.shards_at("det", 3, 0, 0, 1)
    with pytest.raises(ValidationError, match="epoch: must be < 2"):
        store.shards_at("det", 0, 2, 0, 1)


def test_every_transition_is_at_most_two_redis_round_trips(redis_url: str, unique_id: str) -> None:
    sent: list[tuple[object, ...]] = []

    class Counting(redis.Redis):
        def execute_command(self, *args: object, **options: object) -> object:
            sent.append(args)
            return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]

    store = ShardStore(Counting.from_url(redis_url), prefix=f"gstest:{unique_id}")
    store.load_scripts()
    try:
        trips: dict[str, int] = {}

        def count(name: str, action: object) -> object:
            del sent[:]
            result = action()  # type: ignore[operator]
            trips[name] = len(sent)
            return result

        count("create", lambda: store.create("ds", dynamic(size=20, num_epochs=2)))
        a = count("acquire", lambda: store.acquire("ds", "h", "r1")).shard  # type: ignore[attr-defined]
        assert a is not None
        count("ack", lambda: store.ack("ds", "h", 0, a.shard_id))
        b = store.acquire("ds", "h", "r2").shard
        assert b is not None
        count("checkpoint", lambda: store.checkpoint("ds", "c"))
        count("renew", lambda: store.renew("ds", "h", 0, [b.shard_id]))
        count("release", lambda: store.release("ds", "h"))
        c = store.acquire("ds", "h", "r3").shard
        assert c is not None
        count("acquire+ack at an epoch change",
              lambda: store.acquire("ds", "h", "r4", (0, c.shard_id)))  # fmt: skip
        count("restore into another epoch", lambda: store.restore("ds", "c", force=True))
        count("describe", lambda: store.describe("ds"))
        count("delete", lambda: store.delete("ds"))
        assert trips["acquire"] == trips["ack"] == trips["renew"] == 1
        assert trips["acquire+ack at an epoch change"] == 2
        assert max(trips.values()) <= 2, trips
    finally:
        store.client.delete(*store.keys("ds"))
        store.close()


def test_order_bytes_encode_the_common_epoch_order() -> None:
    raw = order_bytes(300, 5, 2)
    decoded = [int.from_bytes(raw[i : i + 4], "big") for i in range(0, len(raw), 4)]
    assert decoded == epoch_order(300, 5, 2)


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ("'lease_ms', I(m.lease_ms),", "", "without field 'lease_ms'"),
        ("'shuffle', m.shuffle}", "'shuffle', m.shuffle, 'num_shards', I(m.num_shards)}",
         "with unknown field 'num_shards'"),
    ],
    ids=["missing", "extra"],
)  # fmt: skip
def test_a_script_edited_out_of_step_with_its_reader_fails_loudly(
    store: ShardStore, monkeypatch: pytest.MonkeyPatch, old: str, new: str, problem: str
) -> None:
    """A field dropped from (or added to) a script's reply but not to its declaration is an
    InternalError naming the script and the field, not a shifted, misread reply."""
    assert lua.ACQUIRE.count(old) == 1
    edited = Script("acquire", lua.ACQUIRE.replace(old, new), lua.ACQUIRE_REPLIES)
    monkeypatch.setattr(store_module, "_ACQUIRE", edited)  # run by EVAL: not in Redis's cache
    store.create("ds", dynamic())
    with pytest.raises(InternalError, match=f"Lua script 'acquire' replied GRANTED {problem}"):
        store.acquire("ds", "h", "r1")
