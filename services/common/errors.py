"""Domain errors and their one mapping to gRPC status codes, both ways.

Domain code raises these; the server interceptor turns them into statuses with
a message that names the field or object, and the client turns statuses back
into the same types, so callers on either side catch one family of errors.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from typing import ClassVar, TypeVar

import grpc

R = TypeVar("R")


class GearshiftError(Exception):
    """Base of every error a Gearshift service or client reports."""

    code: ClassVar[grpc.StatusCode] = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @classmethod
    def from_details(cls, details: str) -> GearshiftError:
        """Rebuild the error from a status message, on the client side."""
        return cls(details)


class ValidationError(GearshiftError):
    """A request field has a bad value; `field` is its dotted path (e.g. "spec.num_ests")."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field = field
        self.problem = problem

    @classmethod
    def from_details(cls, details: str) -> GearshiftError:
        field, sep, problem = details.partition(": ")
        return cls(field, problem) if sep and " " not in field else cls("", details)


class NotFoundError(GearshiftError):
    """A named object does not exist."""

    code = grpc.StatusCode.NOT_FOUND

    def __init__(self, kind: str, ident: str = "") -> None:
        super().__init__(f"{kind} {ident!r} not found" if ident else kind)
        self.kind = kind
        self.ident = ident

    @classmethod
    def from_details(cls, details: str) -> GearshiftError:
        return cls(details)


class ConflictError(GearshiftError):
    """The object exists already in a form that contradicts the request."""

    code = grpc.StatusCode.ALREADY_EXISTS


class PreconditionError(GearshiftError):
    """The request is well formed but the object's state does not allow it."""

    code = grpc.StatusCode.FAILED_PRECONDITION

    @classmethod
    def from_details(cls, details: str) -> GearshiftError:
        """A fence's refusal comes back as FencedError (its message says so), others as this."""
        if details.startswith(FencedError.PREFIX):
            return FencedError.from_details(details)
        return cls(details)


class FencedError(PreconditionError):
    """A shard holder's call from a placement older than the one that holds it now.

    The holders of a dynamic-mode job's ESTs are shared by all its placements; the shard
    manager refuses the calls of a stale placement (one that should be gone but still
    runs) so it cannot undo or finalize the newer one's reads. The message starts with
    `PREFIX` and names the holder and both generations; a client rebuilds this type from
    it, so a training process tells a fence from other refusals and stops instead of
    retrying (a newer placement of its job does its work).
    """

    PREFIX = "fenced: "
    _PATTERN = re.compile(
        r"^fenced: holder (?P<holder>.+) of dataset (?P<dataset>.+) belongs to generation "
        r"(?P<current>\d+) of its job; generation (?P<generation>\d+) is stale"
    )

    def __init__(
        self, dataset_id: str, holder_id: str, generation: int, current: int, rpc: str = ""
    ) -> None:
        refused = f" ({rpc} refused)" if rpc else ""
        super().__init__(
            f"{self.PREFIX}holder {holder_id!r} of dataset {dataset_id!r} belongs to generation "
            f"{current} of its job; generation {generation} is stale: a newer placement of "
            f"the job holds it{refused}"
        )
        self.dataset_id = dataset_id
        self.holder_id = holder_id
        self.generation = generation
        self.current = current

    @classmethod
    def from_details(cls, details: str) -> GearshiftError:
        match = cls._PATTERN.match(details)
        if match is None:  # not our wording: still a refusal, just not a typed fence
            return PreconditionError(details)
        fenced = cls(
            _unquote(match["dataset"]),
            _unquote(match["holder"]),
            int(match["generation"]),
            int(match["current"]),
        )
        fenced.message = details  # the server's words, whole
        fenced.args = (details,)
        return fenced


def _unquote(text: str) -> str:
    """A name as repr() wrote it, back (the text itself when it is not a quoted literal)."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return value if isinstance(value, str) else text


class UnavailableError(GearshiftError):
    """A dependency (database, Redis, another service) cannot be reached; retry later."""

    code = grpc.StatusCode.UNAVAILABLE


class UnauthenticatedError(GearshiftError):
    """Missing or wrong bearer token."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDeniedError(GearshiftError):
    """The caller is known but may not do this (its role, or another's object)."""

    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhaustedError(GearshiftError):
    """A limit (queued jobs, submissions per second, streams, sizes) would be passed."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class UnimplementedError(GearshiftError):
    """The server does not implement this call (yet)."""

    code = grpc.StatusCode.UNIMPLEMENTED


class DeadlineExceededError(GearshiftError):
    """The call did not finish before its deadline."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class InternalError(GearshiftError):
    """A bug or an unexpected state on the server; its log has the details."""

    code = grpc.StatusCode.INTERNAL


_BY_CODE: dict[grpc.StatusCode, type[GearshiftError]] = {
    cls.code: cls
    for cls in (
        ValidationError,
        NotFoundError,
        ConflictError,
        PreconditionError,
        UnavailableError,
        UnauthenticatedError,
        PermissionDeniedError,
        ResourceExhaustedError,
        UnimplementedError,
        DeadlineExceededError,
        InternalError,
    )
}


def rpc_code(exc: grpc.RpcError) -> grpc.StatusCode | None:
    """The status code of a failed call (grpc raises errors that are also grpc.Call objects)."""
    code = getattr(exc, "code", None)
    return code() if callable(code) else None


def rpc_details(exc: grpc.RpcError) -> str:
    """The server's message of a failed call."""
    details = getattr(exc, "details", None)
    return (details() if callable(details) else None) or str(exc)


def error_from_status(code: grpc.StatusCode | None, details: str) -> GearshiftError:
    """The typed error for a status code and message, wherever they came from (a failed
    call, or a refusal answered in-band on a stream)."""
    cls = _BY_CODE.get(code, GearshiftError) if code is not None else GearshiftError
    return cls.from_details(details)


def error_from_rpc(exc: grpc.RpcError) -> GearshiftError:
    """The typed error for a failed call, carrying the server's message."""
    return error_from_status(rpc_code(exc), rpc_details(exc))


def typed_call(call: Callable[[], R]) -> R:
    """`call()`, a failed call raised as its typed error (for callers that map errors, not
    statuses: the CLI's exit codes, the dashboard's pages)."""
    try:
        return call()
    except grpc.RpcError as exc:
        raise error_from_rpc(exc) from None
