"""A retried ReleaseHolder learns what the first call gave back (real Redis, a real shard manager).

The chaos test in CI failed its exact accounting once: 9 reads of the steps a kill rolled
back were read again (the shard counters and the index logs agree), yet no `holder released`
line named them. The shard manager had been killed after Redis ran a process's start-up
release and before it logged it; the process's retry found nothing left to release and
answered empty. Now the holder's last release with a request id is remembered in the same
script: a retry with that id answers what the release did, changes nothing, and is logged.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import pytest

from gearshift.common.errors import FencedError, ValidationError
from gearshift.common.facts import shard_holder_id
from gearshift.shardmanager.store import ShardStore
from gearshift.v1 import shardmanager_pb2 as pb
from gearshift.worker.shard_client import ShardClient
from tests import index_logs
from tests.conftest import DaemonFactory
from tests.integration import test_shard_store
from tests.integration.test_shard_fences import provisional, read
from tests.integration.test_shard_service import sm  # noqa: F401 (the fixture)
from tests.integration.test_shard_store import snapshot

store = test_shard_store.store  # the fixture: a ShardStore on the test Redis

H = shard_holder_id("job-1", 0)


def rolled_back(store: ShardStore) -> None:
    """Placement g4 read steps 0-3 (acknowledged, provisionally) and holds step 4's shard."""
    store.create("ds", provisional())
    store.release("ds", H, resume_step=0, generation=4)
    read(store, range(4), 4)
    read(store, range(4, 5), 4, ack=False)


def test_the_same_request_id_answers_the_first_release_and_changes_nothing(
    store: ShardStore,
) -> None:
    rolled_back(store)
    first = store.release("ds", H, resume_step=2, generation=5, request_id="r1")
    assert not first.repeat
    assert [(r.read_step, r.acknowledged) for r in first.released] == [
        (4, False), (2, True), (3, True)
    ]  # fmt: skip
    assert first.covered == 2  # steps 0-1: a checkpoint holds them
    after = snapshot(store, "ds")
    again = store.release("ds", H, resume_step=2, generation=5, request_id="r1")
    assert again.repeat
    assert (again.epoch, again.requeued, again.failed, again.covered, again.released) == (
        first.epoch, first.requeued, first.failed, first.covered, first.released
    )  # fmt: skip
    assert snapshot(store, "ds") == after  # nothing given back twice, no counter moved
    # Another id is another release: nothing is left to give back.
    other = store.release("ds", H, resume_step=2, generation=5, request_id="r2")
    assert (other.repeat, other.requeued, other.released) == (False, (), ())
    # Without an id nothing is remembered (callers that predate request ids).
    assert store.release("ds", H, resume_step=2, generation=5).requeued == ()


def test_a_retry_is_fenced_once_a_newer_placement_released_the_holder(
    store: ShardStore,
) -> None:
    rolled_back(store)
    store.release("ds", H, resume_step=2, generation=5, request_id="r1")
    store.release("ds", H, resume_step=2, generation=6, request_id="r6")
    before = snapshot(store, "ds")
    with pytest.raises(FencedError, match="generation 5 is stale"):
        store.release("ds", H, resume_step=2, generation=5, request_id="r1")
    assert snapshot(store, "ds") == before


def test_a_restore_forgets_the_remembered_releases(store: ShardStore) -> None:
    rolled_back(store)
    store.checkpoint("ds", "c")
    store.release("ds", H, resume_step=0, generation=5, request_id="r1")
    store.restore("ds", "c", force=True)
    again = store.release("ds", H, resume_step=0, generation=5, request_id="r1")
    assert not again.repeat  # the restored progress is released anew


# -- over gRPC: the retry after a shard manager that died before answering ------------------


def test_the_retry_after_a_lost_answer_returns_and_logs_what_was_given_back(
    store: ShardStore, daemons: DaemonFactory, redis_url: str, unique_id: str
) -> None:
    """The first release is carried out in Redis directly (as a shard manager killed after
    Redis ran it and before it answered or logged would leave it); the process's retry,
    with the same request id, reaches a live shard manager (same Redis, same key prefix)
    and gets that release's answer, and the log line names the shards for the audit,
    counted once however often the retry comes."""
    daemon = daemons("shardmanager", ["--redis-url", redis_url, "--key-prefix",
                                      f"gstest:{unique_id}"])  # fmt: skip
    rolled_back(store)
    request_id = uuid.uuid4().hex
    lost = store.release("ds", H, resume_step=2, generation=5, request_id=request_id)
    retry = pb.ReleaseHolderRequest(
        dataset_id="ds", holder_id=H, reason="a process starts EST 0 at step 2",
        resume_step=2, generation=5, request_id=request_id,
    )  # fmt: skip
    with ShardClient(str(daemon.address)) as client:
        for _ in range(2):
            reply = client.call("ReleaseHolder", retry)
            assert (reply.requeued, reply.covered) == (3, 2)
            assert [(r.epoch, r.shard_id, r.read_step, r.acknowledged)
                    for r in reply.released] == [
                (r.epoch, r.shard_id, r.read_step, r.acknowledged) for r in lost.released
            ]  # fmt: skip
    items = [f"{r.epoch}:{r.shard_id}:{r.read_step}:{int(r.acknowledged)}" for r in lost.released]
    lines = [json.loads(x) for x in daemon.log_path.read_text().splitlines() if x.startswith("{")]
    logged = [
        (x["released"], x["repeat"])
        for x in lines
        if x["msg"] == "holder released" and x.get("request_id") == request_id
    ]
    assert logged == [(items, True), (items, True)]


def test_a_request_id_with_a_separator_or_a_space_is_refused(
    sm: Callable[..., str],  # noqa: F811
) -> None:
    with ShardClient(sm()) as client:
        client.create_dataset(
            "ds", job_id="job-1", size=50, shard_size=10, num_epochs=1, provisional_acks=True
        )
        for bad in ("a|b", "a b", "x" * 129):
            request = pb.ReleaseHolderRequest(dataset_id="ds", holder_id=H, request_id=bad)
            with pytest.raises(ValidationError, match=r"^request_id: "):
                client.call("ReleaseHolder", request)


def test_the_audit_counts_a_logged_retry_once() -> None:
    job = "job-1"
    line = (
        f"2026-11-26T10:00:00.000Z info    gearshift.shardmanager: holder released "
        f"dataset_id={job} holder_id={job}/est-0 reason=x requeued=[3] failed=[] "
        "resume_step=2 generation=5 covered=0 released=['1:3:2:1'] request_id={rid} "
        "repeat={repeat}\n"
    )
    text = (
        line.format(rid="aa", repeat=False)
        + line.format(rid="aa", repeat=True)
        + line.format(rid="bb", repeat=False)
        + line.format(rid="", repeat=False)
    )
    given = index_logs.given_back(text, job)
    assert [g.read for g in given] == [(0, 1, 3, 2)] * 3
