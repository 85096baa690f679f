"""A standby scheduler's answers, and a channel that follows its refusals to the leader.

A standby scheduler (docs/architecture/failover.md) answers reads from the database and
refuses every write with UNAVAILABLE and trailing metadata: `gearshift-standby`, the
leader's advertised address as `gearshift-leader` (empty while no leader is known), and a
retry pushback that tells gRPC's retry policy not to send the call to the same standby
again. Its reads carry the same two keys as initial metadata: the answer may be stale.

gRPC's pick_first keeps a connection that answers, so a channel given several addresses
that reached a standby would send every later write there too. `LeaderFollowing` wraps a
channel: a unary call that a standby refused (nothing was done: safe for any call) is sent
again to the leader it names, on a channel of its own, and later calls go there too until
that channel fails; then they go back to the wrapped channel, whose address list and
retry policy find whoever serves. It follows for at most FOLLOW_SECONDS, the most a
takeover may take (issue 46). Streaming calls go where unary ones go, unfollowed: a
standby serves the streaming reads (WatchJob, logs, steps, FetchCode) and UploadCode.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc

from gearshift.common.errors import rpc_code

STANDBY_KEY = "gearshift-standby"
LEADER_KEY = "gearshift-leader"
# gRFC A6: a negative pushback asks the client's retry policy not to retry.
PUSHBACK_KEY = "grpc-retry-pushback-ms"
FOLLOW_SECONDS = 5.0
FIRST_WAIT_S, MOST_WAIT_S = 0.05, 0.5  # between refusals that name no new leader
R = TypeVar("R")


def standby_metadata(leader: str) -> tuple[tuple[str, str], ...]:
    """What a standby attaches to a read (initial metadata): who leads, that it does not."""
    return ((STANDBY_KEY, "1"), (LEADER_KEY, leader))


def refusal_trailers(leader: str) -> tuple[tuple[str, str], ...]:
    """What a standby attaches to a refused write (trailing metadata)."""
    return (*standby_metadata(leader), (PUSHBACK_KEY, "-1"))


def standby_leader(metadata: Sequence[Any] | None) -> str | None:
    """The leader named by a standby's metadata ("" when it knows none); None when the
    metadata is not a standby's."""
    pairs = {item[0]: item[1] for item in metadata or ()}
    if pairs.get(STANDBY_KEY) != "1":
        return None
    leader = pairs.get(LEADER_KEY, "")
    return leader if isinstance(leader, str) else leader.decode()


def redirect_of(exc: grpc.RpcError) -> str | None:
    """The leader a standby's refusal names ("" when none is known), None for any other
    failure (which may have reached a server that acted on it)."""
    if rpc_code(exc) != grpc.StatusCode.UNAVAILABLE:
        return None
    trailers = getattr(exc, "trailing_metadata", None)
    return standby_leader(trailers() if callable(trailers) else None)


def _streaming(kind: str) -> Callable[..., Any]:
    """A grpc.Channel method making `kind`'s multicallables, sent where unary calls go."""

    def multicallable(
        self: LeaderFollowing,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        _registered_method: bool | None = False,
    ) -> _Routed:
        calls = _PerChannel(kind, method, request_serializer, response_deserializer)
        return _Routed(self, calls.registered(_registered_method))

    return multicallable


class LeaderFollowing(grpc.Channel):
    """`base`, with unary calls that a standby refused sent on to the leader it names
    (`dial(address)` makes that channel; without a retry policy, so a dead leader is
    left at once)."""

    def __init__(
        self,
        base: grpc.Channel,
        dial: Callable[[str], grpc.Channel],
        *,
        idempotent: Callable[[str], bool],
        follow_seconds: float = FOLLOW_SECONDS,
    ) -> None:
        self._base = base
        self._dial = dial
        self._idempotent = idempotent
        self.follow_seconds = follow_seconds
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}  # every leader followed, closed with this
        self._leader = ""  # the address followed now ("": the base channel)

    def route(self) -> tuple[str, grpc.Channel]:
        """Where calls go now: (the leader followed or "", its channel)."""
        with self._lock:
            leader = self._leader
            return leader, self._channels[leader] if leader else self._base

    def follow(self, leader: str) -> None:
        with self._lock:
            if leader not in self._channels:
                self._channels[leader] = self._dial(leader)
            self._leader = leader

    def leave(self, leader: str) -> None:
        """Stop following `leader` (it failed, or a standby knows no leader)."""
        with self._lock:
            if self._leader == leader:
                self._leader = ""

    def call(self, method: str, attempt: Callable[[grpc.Channel], R]) -> R:
        """`attempt` on the channel of the moment, again on the leader a standby names."""
        deadline: float | None = None
        wait = FIRST_WAIT_S
        while True:
            leader, channel = self.route()
            try:
                return attempt(channel)
            except grpc.RpcError as exc:
                named = redirect_of(exc)
                if named is None:
                    # Not a standby's refusal. The base channel retried already; a followed
                    # leader that fails is left, and an idempotent call tries the base.
                    if not leader or rpc_code(exc) != grpc.StatusCode.UNAVAILABLE:
                        raise
                    self.leave(leader)
                    if not self._idempotent(method):
                        raise
                elif named and named != leader:
                    self.follow(named)
                    continue  # a new leader named: go there at once
                elif named:
                    pass  # the leader named itself: it is taking over; wait for it
                else:
                    self.leave(leader)  # no leader known: a takeover is under way
                now = time.monotonic()
                deadline = now + self.follow_seconds if deadline is None else deadline
                if now >= deadline:
                    raise
                time.sleep(min(wait, deadline - now))
                wait = min(2 * wait, MOST_WAIT_S)

    # grpc.Channel ---------------------------------------------------------------------------
    def unary_unary(
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        _registered_method: bool | None = False,
    ) -> grpc.UnaryUnaryMultiCallable:  # type: ignore[type-arg]
        calls = _PerChannel("unary_unary", method, request_serializer, response_deserializer)
        return _Unary(self, method, calls.registered(_registered_method))

    unary_stream = _streaming("unary_stream")
    stream_unary = _streaming("stream_unary")
    stream_stream = _streaming("stream_stream")

    def subscribe(self, callback: Callable[..., None], try_to_connect: bool = False) -> None:
        self._base.subscribe(callback, try_to_connect)

    def unsubscribe(self, callback: Callable[..., None]) -> None:
        self._base.unsubscribe(callback)

    def close(self) -> None:
        with self._lock:
            channels, self._channels, self._leader = list(self._channels.values()), {}, ""
        for channel in [self._base, *channels]:
            channel.close()

    def __enter__(self) -> LeaderFollowing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _PerChannel:
    """A method's multicallable on each channel it went through (made once per channel)."""

    def __init__(self, kind: str, method: str, *serdes: Any) -> None:
        self.kind, self.method, self.serdes = kind, method, serdes
        self._options: dict[str, Any] = {}
        self._made: dict[int, tuple[grpc.Channel, Any]] = {}

    def registered(self, registered: bool | None) -> _PerChannel:
        """Pass on the generated stubs' `_registered_method` (gRPC registers the method once)."""
        if registered:
            self._options["_registered_method"] = True
        return self

    def on(self, channel: grpc.Channel) -> Any:
        made = self._made.get(id(channel))
        if made is None or made[0] is not channel:
            multicallable = getattr(channel, self.kind)(self.method, *self.serdes, **self._options)
            made = self._made[id(channel)] = (channel, multicallable)
        return made[1]


class _Unary(grpc.UnaryUnaryMultiCallable):  # type: ignore[type-arg]
    def __init__(self, owner: LeaderFollowing, method: str, calls: _PerChannel) -> None:
        self._owner = owner
        self._method = method
        self._calls = calls

    def __call__(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        return self._owner.call(
            self._method, lambda channel: self._calls.on(channel)(request, *args, **kwargs)
        )

    def with_call(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        return self._owner.call(
            self._method,
            lambda channel: self._calls.on(channel).with_call(request, *args, **kwargs),
        )

    def future(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        """Not followed: a future's failure comes after this returns."""
        return self._calls.on(self._owner.route()[1]).future(request, *args, **kwargs)


class _Routed:
    """A streaming method, sent where unary calls go at the moment of each call."""

    def __init__(self, owner: LeaderFollowing, calls: _PerChannel) -> None:
        self._owner = owner
        self._calls = calls

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._calls.on(self._owner.route()[1])(*args, **kwargs)

    def with_call(self, *args: Any, **kwargs: Any) -> Any:
        return self._calls.on(self._owner.route()[1]).with_call(*args, **kwargs)

    def future(self, *args: Any, **kwargs: Any) -> Any:
        return self._calls.on(self._owner.route()[1]).future(*args, **kwargs)
