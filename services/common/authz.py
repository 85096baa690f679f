"""Authorization in one place for every servicer: who calls (their token's identity), whether
their role may call the method, whether the object is theirs, and an audit line per
mutating call. Servicers never check roles themselves.

Installed instead of the single-token check when a daemon has `--tokens-file`
(gearshift.common.identity): UNAUTHENTICATED for no or an unknown token,
PERMISSION_DENIED naming the identity and the object for a call its role or scope does
not allow. Health checks stay open.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from gearshift.common.auth import AUTH_HEADER
from gearshift.common.errors import GearshiftError, PermissionDeniedError
from gearshift.common.handlers import Handler, Metadata, rewrapped
from gearshift.common.identity import Identity, TokenTable
from gearshift.common.rpc_roles import (
    Rule,
    Scopes,
    check_request,
    filter_response,
    rule_for,
)

audit = logging.getLogger("gearshift.audit")
_OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def _bearer(metadata: Metadata) -> str | None:
    value = dict(metadata or ()).get(AUTH_HEADER)
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else str(value)
    return text.removeprefix("Bearer ").strip() if text.startswith("Bearer ") else None


# The identity of the call this thread serves (unary calls of a sync server), for the
# servicers that record who did something (a PS job's counts "set by <identity>").
_CALLER: contextvars.ContextVar[Identity | None] = contextvars.ContextVar(
    "gearshift_caller", default=None
)


def current_identity() -> Identity | None:
    """Who the unary call being served is from; None without a tokens file (no identities)."""
    return _CALLER.get()


@dataclass(frozen=True)
class Admitted:
    identity: Identity
    rule: Rule


def decide(
    tokens: TokenTable, details: grpc.HandlerCallDetails
) -> Admitted | grpc.RpcMethodHandler[Any, Any]:
    """The caller and the method's rule, or a handler that refuses the call."""
    method: str = details.method
    token = _bearer(details.invocation_metadata)
    if token is None:
        message = f"{method}: missing bearer token (metadata '{AUTH_HEADER}')"
        return _refuse(grpc.StatusCode.UNAUTHENTICATED, message)
    identity = tokens.identify(token)
    if identity is None:
        return _refuse(grpc.StatusCode.UNAUTHENTICATED, f"{method}: invalid bearer token")
    try:
        return Admitted(identity, rule_for(identity, method))
    except GearshiftError as exc:
        _audit(identity, method, exc.code.name)
        return _refuse(exc.code, exc.message)


def caller_of(tokens: TokenTable | None) -> Callable[[Metadata], str]:
    """Who a call is from, for per-caller limits: its identity, or "" without a tokens file."""

    def caller(metadata: Metadata) -> str:
        token = _bearer(metadata) if tokens is not None else None
        identity = tokens.identify(token) if tokens is not None and token else None
        return str(identity) if identity is not None else ""

    return caller


def _refuse(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler[Any, Any]:
    def abort(request: Any, context: grpc.ServicerContext) -> None:
        context.abort(code, message)

    return grpc.unary_unary_rpc_method_handler(abort)


class AuthorizationInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Identity, role and scope checks (gearshift.common.rpc_roles) for a sync server."""

    def __init__(self, tokens: TokenTable, scopes: Callable[[], Scopes | None]) -> None:
        self.tokens = tokens
        self.scopes = scopes  # late: the service that knows its objects starts after the server

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method: str = handler_call_details.method
        if method.startswith(_OPEN_PREFIXES):
            return continuation(handler_call_details)
        decided = decide(self.tokens, handler_call_details)
        if not isinstance(decided, Admitted):
            return decided
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        return self._guarded(handler, decided.identity, method, decided.rule)

    def _guarded(
        self,
        handler: grpc.RpcMethodHandler[Any, Any],
        identity: Identity,
        method: str,
        rule: Rule,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        request_streaming = bool(handler.request_streaming)

        def refuse(exc: GearshiftError, context: grpc.ServicerContext) -> None:
            _audit(identity, method, exc.code.name)
            context.abort(exc.code, exc.message)

        def each_checked(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
            for message in requests:
                try:
                    check_request(identity, method, rule, message, self.scopes())
                except GearshiftError as exc:
                    refuse(exc, context)
                yield message

        def admit(request: Any, context: grpc.ServicerContext) -> Any:
            """The request, checked (a client stream: each message as it comes)."""
            try:
                if request_streaming:
                    if identity.job:  # no request stream of a thread-pool server names a job
                        raise PermissionDeniedError(f"{identity} may not call {method}")
                    return each_checked(request, context) if rule.scope else request
                check_request(identity, method, rule, request, self.scopes())
            except GearshiftError as exc:
                refuse(exc, context)
            return request

        def unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
            def call(request: Any, context: grpc.ServicerContext) -> Any:
                request = admit(request, context)
                reset = _CALLER.set(identity)
                try:
                    reply = behavior(request, context)
                except BaseException:
                    _audit_outcome(rule, identity, method, context, failed=True)
                    raise
                finally:
                    _CALLER.reset(reset)
                _audit_outcome(rule, identity, method, context, failed=False)
                return filter_response(identity, rule, reply, self.scopes())

            return call

        def streaming(behavior: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
            def call(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                yield from behavior(admit(request, context), context)

            return call

        return rewrapped(handler, unary, streaming)


def _audit(identity: Identity, method: str, result: str) -> None:
    audit.info("call", extra={"who": str(identity), "what": method, "result": result})


def _audit_outcome(
    rule: Rule, identity: Identity, method: str, context: grpc.ServicerContext, *, failed: bool
) -> None:
    if not rule.mutates:
        return
    code = getattr(context, "code", lambda: None)()
    result = code.name if code is not None else ("ERROR" if failed else "OK")
    _audit(identity, method, result)


class AioAuthorizationInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Identity and role checks on grpc.aio (the shard manager, the heartbeat relays): a job's
    token and a scoped rule (a worker's own id) are checked on each request and each message
    of a stream. No tenant-owned object is served on grpc.aio (no Scopes here)."""

    def __init__(self, tokens: TokenTable) -> None:
        self.tokens = tokens

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler_call_details.method.startswith(_OPEN_PREFIXES):
            return handler
        decided = decide(self.tokens, handler_call_details)
        if not isinstance(decided, Admitted):
            return decided
        if not (decided.identity.job or decided.rule.scope):
            return handler
        return _scoped(handler, decided.identity, handler_call_details.method, decided.rule)


def _scoped(handler: Handler, identity: Identity, method: str, rule: Rule) -> Handler:
    """An aio handler that refuses what a caller asks about another's object (a job's token
    about another job, a worker about another worker)."""
    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }

    def check(message: Any) -> None:
        try:
            check_request(identity, method, rule, message, None)
        except GearshiftError as exc:
            _audit(identity, method, exc.code.name)
            raise

    if handler.unary_unary is not None:
        unary: Any = handler.unary_unary  # a coroutine function on grpc.aio

        async def one(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            try:
                check(request)
            except GearshiftError as exc:
                await context.abort(exc.code, exc.message)
            return await unary(request, context)

        return grpc.unary_unary_rpc_method_handler(one, **kwargs)
    if handler.stream_stream is not None:
        streaming: Any = handler.stream_stream  # an async generator function on grpc.aio

        async def each(
            requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            async def checked() -> AsyncIterator[Any]:
                async for message in requests:
                    check(message)  # raised into the servicer: its stream ends with the status
                    yield message

            replies = streaming(checked(), context)
            if inspect.isawaitable(replies):  # a handler that writes with context.write
                await replies
                return
            async for reply in replies:
                yield reply

        return grpc.stream_stream_rpc_method_handler(each, **kwargs)
    return _refuse(grpc.StatusCode.PERMISSION_DENIED, f"{identity} may not call {method}")
