"""The operator's shared client closes only once no handler thread is in a call, and refuses
calls after that as the scheduler being unavailable (which the handlers retry later)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from gearshift.client.operator.shared_client import SharedClient
from gearshift.common.errors import UnavailableError


class SlowClient:
    """A stand-in for the SDK client: one call that waits for the test's word."""

    address = "127.0.0.1:1"

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.closed_while_busy = False
        self.busy = False
        self.closed = False

    def get(self, job_id: str) -> str:
        self.busy = True
        self.entered.set()
        assert self.release.wait(10)
        self.busy = False
        return job_id

    def close(self) -> None:
        self.closed_while_busy = self.busy
        self.closed = True

    def state(self) -> tuple[bool, bool]:
        """(closed, closed while a call was in flight), read afresh."""
        return self.closed, self.closed_while_busy


def test_close_waits_for_the_call_in_flight_and_refuses_later_ones() -> None:
    slow = SlowClient()
    shared = SharedClient(slow)  # type: ignore[arg-type]
    assert shared.address == slow.address
    answers: list[Any] = []
    caller = threading.Thread(target=lambda: answers.append(shared.get("job-1")))
    caller.start()
    assert slow.entered.wait(10)
    closer = threading.Thread(target=shared.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive() and slow.state() == (False, False)  # still waiting for the call
    slow.release.set()
    caller.join(10)
    closer.join(10)
    assert answers == ["job-1"] and slow.state() == (True, False)
    with pytest.raises(UnavailableError, match="the operator is stopping"):
        shared.get("job-2")


def test_close_gives_up_waiting_after_its_bound() -> None:
    slow = SlowClient()
    shared = SharedClient(slow)  # type: ignore[arg-type]
    caller = threading.Thread(target=shared.get, args=("job-1",))
    caller.start()
    assert slow.entered.wait(10)
    shared.close(timeout=0.05)
    assert slow.state() == (True, True)
    slow.release.set()
    caller.join(10)
