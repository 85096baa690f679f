"""A standby scheduler's gate: reads answered from the store, writes refused naming the leader.

A scheduler that waits for the leader lock (state/leader.py) serves already, as a standby.
The servicers are the leader's; the scheduler behind them has not recovered, so what they
read comes from the store (service.py), as the leader last committed it: possibly stale,
and every such answer says so in its initial metadata (`gearshift-standby`, and the
leader's advertised address as `gearshift-leader`: gearshift.common.leader_follow).

Every other call of the scheduler's services is refused with UNAVAILABLE before it
reaches a servicer, naming the leader in its trailers: connect()'s channel sends it on
there. A method this table does not name is refused (fail closed). Once the scheduler
leads, the gate lets every call through untouched.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from gearshift.common.handlers import Handler, WrappingInterceptor, rewrapped
from gearshift.common.leader_follow import refusal_trailers, standby_metadata

_JOBS = "/gearshift.v1.JobService/"
_REGISTRY = "/gearshift.v1.WorkerRegistry/"
GATED = (_JOBS, _REGISTRY)  # health and reflection pass
# What a standby answers. UploadCode writes, but only a content-addressed package into the
# store, which no scheduler state refers to until a job does: it touches nothing a leader
# holds, and its request stream could not be sent on to the leader again.
STANDBY_SERVES = frozenset(
    {
        *(
            _JOBS + name
            for name in (
                "GetJob",
                "ListJobs",
                "WatchJob",
                "GetClusterState",
                "StreamJobLogs",
                "StreamJobSteps",
                "HasCode",
                "UploadCode",
            )
        ),
        _REGISTRY + "FetchCode",
    }
)
LEADER_CACHE_SECONDS = 1.0


class Standing:
    """Whether this scheduler leads, and which address leads as the store says (read at
    most once a LEADER_CACHE_SECONDS: a standby names it in every answer)."""

    def __init__(self, leader_address: Callable[[], str], *, leading: bool = False) -> None:
        self._read = leader_address
        self._leading = threading.Event()
        if leading:
            self._leading.set()
        self._cached: tuple[float, str] | None = None

    @property
    def leading(self) -> bool:
        return self._leading.is_set()

    def lead(self) -> None:
        """Open the gate: this scheduler has recovered and runs its rounds."""
        self._leading.set()

    def leader(self) -> str:
        now = time.monotonic()
        cached = self._cached
        if cached is not None and now - cached[0] < LEADER_CACHE_SECONDS:
            return cached[1]
        try:
            address = self._read()
        except Exception:  # the database away: say no leader is known, do not fail the call
            address = ""
        self._cached = (now, address)
        return address


def refusal(method: str, leader: str) -> str:
    """A refused call's message: what it was, and where to go."""
    name = method.rpartition("/")[2]
    where = (
        f"the leader serves at {leader}"
        if leader
        else "no leader is known yet (a takeover is under way): try again in a second"
    )
    return f"{name}: this scheduler is a standby and answers only reads; {where}"


class StandbyGate(WrappingInterceptor):
    """While the scheduler does not lead: its reads marked as a standby's, the rest refused."""

    def __init__(self, standing: Standing) -> None:
        super().__init__()
        self.standing = standing

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Handler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        method: str = handler_call_details.method
        if self.standing.leading or not method.startswith(GATED):
            return continuation(handler_call_details)
        return super().intercept_service(continuation, handler_call_details)

    def wrap(self, handler: Handler, method: str) -> Handler:
        if method in STANDBY_SERVES:
            return rewrapped(handler, self._marked, self._marked_stream)
        return rewrapped(handler, self._refused(method), self._refused_stream(method))

    def _marked(self, behavior: Callable[..., Any]) -> Callable[..., Any]:
        def call(request: Any, context: grpc.ServicerContext) -> Any:
            context.send_initial_metadata(standby_metadata(self.standing.leader()))
            return behavior(request, context)

        return call

    def _marked_stream(self, behavior: Callable[..., Iterator[Any]]) -> Callable[..., Any]:
        def call(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            context.send_initial_metadata(standby_metadata(self.standing.leader()))
            yield from behavior(request, context)

        return call

    def _refuse(self, method: str, context: grpc.ServicerContext) -> None:
        leader = self.standing.leader()
        context.set_trailing_metadata(refusal_trailers(leader))
        context.abort(grpc.StatusCode.UNAVAILABLE, refusal(method, leader))

    def _refused(self, method: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def wrap(behavior: Callable[..., Any]) -> Callable[..., Any]:
            def call(request: Any, context: grpc.ServicerContext) -> Any:
                self._refuse(method, context)

            return call

        return wrap

    def _refused_stream(self, method: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def wrap(behavior: Callable[..., Any]) -> Callable[..., Any]:
            def call(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                self._refuse(method, context)
                yield from ()

            return call

        return wrap
