"""The operator's one SDK client, shared by kopf's handler threads.

kopf runs synchronous handlers (the mirror timer among them) on threads of its own, and its
cleanup handler may run while one of them is still in a call. Closing a gRPC channel under
a call that another thread is starting can crash the process (seen: a segmentation fault in
grpc's `_get_registered_call_handle` while the operator stopped). So the client is closed only
once no call on it is in flight, and every call after that is refused as the scheduler being
unavailable, which the handlers already retry later.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

from gearshift.client.sdk import Client
from gearshift.common.errors import UnavailableError

CLOSE_WAIT_SECONDS = 30.0  # a call has its own deadline (10 s); past this, close anyway


class SharedClient:
    """A Client whose calls are counted, and whose `close` waits for them to end."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._idle = threading.Condition()
        self._calls = 0
        self._closing = False

    @property
    def address(self) -> str:
        return self._client.address

    @contextlib.contextmanager
    def _in_use(self) -> Iterator[None]:
        with self._idle:
            if self._closing:
                raise UnavailableError("the operator is stopping")
            self._calls += 1
        try:
            yield
        finally:
            with self._idle:
                self._calls -= 1
                self._idle.notify_all()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._client, name)
        if not callable(value):
            return value
        return self._guarded(value)

    def _guarded(self, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            with self._in_use():
                return method(*args, **kwargs)

        return call

    def close(self, timeout: float = CLOSE_WAIT_SECONDS) -> None:
        """Refuse new calls, wait (bounded) for those in flight, then close the channel."""
        with self._idle:
            self._closing = True
            self._idle.wait_for(lambda: self._calls == 0, timeout)
        self._client.close()
