"""The heartbeat relay's batching (group commit) and the choice of a worker's relay."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from gearshift.common.errors import UnavailableError
from gearshift.scheduler.api.heartbeat_relay import HeartbeatBatcher
from gearshift.scheduler.api.relays import relay_of, wildcard_to_local
from gearshift.v1 import scheduler_pb2

S = scheduler_pb2


class Upstream:
    """A scheduler stand-in: answers each batch (reregister for worker ids starting with
    'x'), and holds the first batch until `release` is set."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.release = threading.Event()
        self.first_in = threading.Event()

    def send(self, heartbeats: Sequence[S.HeartbeatRequest]) -> list[S.HeartbeatResponse]:
        self.batches.append([h.worker_id for h in heartbeats])
        self.first_in.set()
        assert self.release.wait(10)
        return [S.HeartbeatResponse(reregister=h.worker_id.startswith("x")) for h in heartbeats]


def test_heartbeats_that_arrive_during_a_batch_go_together_in_the_next() -> None:
    upstream = Upstream()
    batcher = HeartbeatBatcher(upstream.send)
    batcher.start()
    with ThreadPoolExecutor(max_workers=8) as pool:
        first = pool.submit(batcher.relay, S.HeartbeatRequest(worker_id="a"))
        assert upstream.first_in.wait(10)
        later = [
            pool.submit(batcher.relay, S.HeartbeatRequest(worker_id=name))
            for name in ("b", "x1", "c", "x2")
        ]
        upstream.release.set()
        assert first.result(10).reregister is False
        assert [f.result(10).reregister for f in later] == [False, True, False, True]
    batcher.close()
    assert upstream.batches[0] == ["a"]
    assert sorted(upstream.batches[1]) == ["b", "c", "x1", "x2"]  # one call for the four
    assert batcher.batches == 2


def test_a_batch_waits_its_linger_for_others_unless_it_is_full() -> None:
    batches: list[int] = []

    def answer(heartbeats: Sequence[S.HeartbeatRequest]) -> list[S.HeartbeatResponse]:
        batches.append(len(heartbeats))
        return [S.HeartbeatResponse() for _ in heartbeats]

    lingering = HeartbeatBatcher(answer, linger=0.5)
    lingering.start()
    with ThreadPoolExecutor(max_workers=4) as pool:
        replies = [
            pool.submit(lingering.relay, S.HeartbeatRequest(worker_id=f"w{i}")) for i in range(3)
        ]
        assert all(r.result(10) == S.HeartbeatResponse() for r in replies)
    lingering.close()
    assert batches == [3]  # the upstream answers at once, yet one call for the three
    batches.clear()
    full = HeartbeatBatcher(answer, max_batch=2, linger=60.0)  # full batches never linger
    full.start()
    with ThreadPoolExecutor(max_workers=4) as pool:
        replies = [pool.submit(full.relay, S.HeartbeatRequest(worker_id=f"w{i}")) for i in range(2)]
        assert all(r.result(10) == S.HeartbeatResponse() for r in replies)
    full.close()
    assert batches == [2]


def test_a_failed_batch_fails_each_of_its_heartbeats_and_a_closed_relay_takes_none() -> None:
    def down(heartbeats: Sequence[S.HeartbeatRequest]) -> list[S.HeartbeatResponse]:
        raise UnavailableError("the scheduler is restarting")

    batcher = HeartbeatBatcher(down)
    batcher.start()
    with pytest.raises(UnavailableError, match="restarting"):
        batcher.relay(S.HeartbeatRequest(worker_id="a"))
    batcher.close()
    with pytest.raises(UnavailableError, match="stopping"):
        batcher.relay(S.HeartbeatRequest(worker_id="a"))


def test_a_short_answer_is_an_error_not_a_wrong_reply() -> None:
    batcher = HeartbeatBatcher(lambda heartbeats: [])
    batcher.start()
    with pytest.raises(UnavailableError, match="answered 0 of 1"):
        batcher.relay(S.HeartbeatRequest(worker_id="a"))
    batcher.close()


@pytest.mark.parametrize("waiter", ["thread", "coroutine"])
def test_a_heartbeat_whose_batch_never_returns_times_out(waiter: str) -> None:
    stuck = threading.Event()

    def hangs(heartbeats: Sequence[S.HeartbeatRequest]) -> list[S.HeartbeatResponse]:
        stuck.wait(10)
        return [S.HeartbeatResponse() for _ in heartbeats]

    batcher = HeartbeatBatcher(hangs)
    batcher.start()
    request = S.HeartbeatRequest(worker_id="a")
    with pytest.raises(UnavailableError, match="did not answer within"):
        if waiter == "thread":
            batcher.relay(request, timeout=0.2)
        else:  # the batch's late answer then finds the coroutine's loop closed
            asyncio.run(batcher.relay_async(request, timeout=0.2))
    stuck.set()
    assert batcher.relay(request, timeout=5) == S.HeartbeatResponse()  # its thread lives on
    batcher.close()


def test_coroutines_share_a_batch_and_get_their_own_replies_and_errors() -> None:
    """The relay's path: heartbeats awaited on an event loop, answered from the batch thread."""
    batches: list[int] = []

    def answer(heartbeats: Sequence[S.HeartbeatRequest]) -> list[S.HeartbeatResponse]:
        batches.append(len(heartbeats))
        if any(h.worker_id == "down" for h in heartbeats):
            raise UnavailableError("the scheduler is restarting")
        return [S.HeartbeatResponse(reregister=h.worker_id.startswith("x")) for h in heartbeats]

    async def together(batcher: HeartbeatBatcher, *names: str) -> list[S.HeartbeatResponse]:
        calls = (batcher.relay_async(S.HeartbeatRequest(worker_id=n)) for n in names)
        return list(await asyncio.gather(*calls))

    batcher = HeartbeatBatcher(answer, linger=0.3)
    batcher.start()
    replies = asyncio.run(together(batcher, "a", "x1", "b"))
    assert [r.reregister for r in replies] == [False, True, False] and batches == [3]
    with pytest.raises(UnavailableError, match="restarting"):
        asyncio.run(together(batcher, "down"))
    batcher.close()


def test_a_worker_keeps_its_relay_and_the_relays_share_the_workers() -> None:
    ports = [7001, 7002, 7003]
    names = [f"worker-{i}" for i in range(300)]
    chosen = [relay_of(name, ports) for name in names]
    assert chosen == [relay_of(name, list(ports)) for name in names]
    assert {port: chosen.count(port) for port in ports}.keys() == set(ports)
    assert min(chosen.count(port) for port in ports) > 60  # about 100 each
    assert relay_of("worker-1", []) == 0  # no relays: the scheduler itself


def test_a_wildcard_listen_address_is_dialled_on_loopback() -> None:
    assert wildcard_to_local("0.0.0.0:5000") == "127.0.0.1:5000"
    assert wildcard_to_local("[::]:5000") == "127.0.0.1:5000"
    assert wildcard_to_local("10.0.0.2:5000") == "10.0.0.2:5000"
