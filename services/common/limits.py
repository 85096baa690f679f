"""Per-caller limits, enforced in one interceptor: submissions per second, open streams,
the size of a job's spec. Each refusal is RESOURCE_EXHAUSTED naming the limit and its flag, and
happens before the servicer runs, so nothing changes.

The caller is the identity of its token (gearshift.common.identity) when the daemon has
a tokens file, else the job's tenant for submissions and the peer's address for streams. The
queued-jobs limit needs the scheduler's jobs and lives there (jobs_api).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from gearshift.common.errors import GearshiftError, ResourceExhaustedError
from gearshift.common.handlers import Metadata, WrappingInterceptor, rewrapped

SUBMIT = "/gearshift.v1.JobService/SubmitJob"


LIMIT_FLAGS = {
    "submits": "--max-submits-per-second",
    "streams": "--max-streams",
    "spec": "--max-spec-kb",
}


@dataclass(frozen=True)
class Limits:
    submits_per_second: float = 20.0  # per caller, with a burst of `submit_burst`
    submit_burst: int = 40
    streams: int = 64  # open streaming calls (watch, logs, shards) per caller
    spec_bytes: int = 1024 * 1024  # a submitted job's spec
    # Where each limit is set, for the messages (the scheduler's are keys of its file).
    named: Mapping[str, str] = field(default_factory=lambda: dict(LIMIT_FLAGS))


class TokenBucket:
    """`rate` tokens a second up to `burst`; `take()` is False when none is left."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.rate, self.burst, self.clock = rate, burst, clock
        self.level = float(burst)
        self.at = clock()

    def take(self) -> bool:
        now = self.clock()
        self.level = min(self.burst, self.level + (now - self.at) * self.rate)
        self.at = now
        if self.level < 1:
            return False
        self.level -= 1
        return True


class CallerLimits:
    """The counters of every caller; thread-safe."""

    def __init__(self, limits: Limits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, TokenBucket] = {}
        self._streams: dict[str, int] = {}

    def submit(self, caller: str) -> None:
        with self._lock:
            bucket = self._buckets.get(caller)
            if bucket is None:
                bucket = TokenBucket(
                    self.limits.submits_per_second, self.limits.submit_burst, self.clock
                )
                self._buckets[caller] = bucket
            if not bucket.take():
                raise ResourceExhaustedError(
                    f"{caller}: more than {self.limits.submits_per_second:g} submissions a "
                    f"second (burst {self.limits.submit_burst}; {self.limits.named['submits']}); "
                    "retry later"
                )

    def open_stream(self, caller: str) -> None:
        with self._lock:
            count = self._streams.get(caller, 0)
            if count >= self.limits.streams:
                raise ResourceExhaustedError(
                    f"{caller}: {count} streams open, the limit "
                    f"({self.limits.named['streams']}); close one first"
                )
            self._streams[caller] = count + 1

    def close_stream(self, caller: str) -> None:
        with self._lock:
            self._streams[caller] = max(0, self._streams.get(caller, 1) - 1)

    def check_spec(self, spec: Any) -> None:
        size = spec.ByteSize()
        if size > self.limits.spec_bytes:
            raise ResourceExhaustedError(
                f"spec: {size} bytes, over the limit of {self.limits.spec_bytes} "
                f"({self.limits.named['spec']})"
            )


class LimitsInterceptor(WrappingInterceptor):
    """CallerLimits around every call of a sync server."""

    def __init__(self, limits: CallerLimits, caller: Callable[[Metadata], str]):
        super().__init__()
        self.limits = limits
        self.caller = caller  # read per call: the wrapped handler serves every caller

    def wrap(
        self, handler: grpc.RpcMethodHandler[Any, Any], method: str
    ) -> grpc.RpcMethodHandler[Any, Any]:
        limits, caller = self.limits, self.caller

        def refuse(exc: GearshiftError, context: grpc.ServicerContext) -> None:
            context.abort(exc.code, exc.message)

        def unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
            def call(request: Any, context: grpc.ServicerContext) -> Any:
                if method == SUBMIT:
                    who = caller(context.invocation_metadata())
                    try:
                        limits.check_spec(request.spec)
                        limits.submit(who if who else f"tenant:{request.spec.tenant}")
                    except ResourceExhaustedError as exc:
                        refuse(exc, context)
                return behavior(request, context)

            return call

        def streaming(behavior: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
            def call(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                key = caller(context.invocation_metadata()) or context.peer()
                try:
                    limits.open_stream(key)
                except ResourceExhaustedError as exc:
                    refuse(exc, context)
                try:
                    yield from behavior(request, context)
                finally:
                    limits.close_stream(key)

            return call

        return rewrapped(handler, unary, streaming)
