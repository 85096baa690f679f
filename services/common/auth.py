"""Bearer-token checks and TLS / mTLS credentials, for servers and clients.

Health checks stay open so that orchestrators can probe a daemon without the
token; every other call must carry `authorization: Bearer <token>` when the
server has one configured.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

AUTH_HEADER = "authorization"
TOKEN_VARIABLE = "GEARSHIFT_TOKEN"  # the environment variable that holds a bearer token
_OPEN_PREFIXES = ("/grpc.health.v1.Health/",)


def _deny(message: str) -> grpc.RpcMethodHandler[Any, Any]:
    def abort(request: Any, context: grpc.ServicerContext) -> None:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return grpc.unary_unary_rpc_method_handler(abort)


class BearerTokenServerInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Rejects calls whose bearer token does not match, with UNAUTHENTICATED."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("token must not be empty")
        self._expected = f"Bearer {token}".encode()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method: str = handler_call_details.method
        if method.startswith(_OPEN_PREFIXES):
            return continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        given = metadata.get(AUTH_HEADER)
        if given is None:
            return _deny(f"{method}: missing bearer token (metadata '{AUTH_HEADER}')")
        given_bytes = given.encode() if isinstance(given, str) else bytes(given)
        if not hmac.compare_digest(given_bytes, self._expected):
            return _deny(f"{method}: invalid bearer token")
        return continuation(handler_call_details)


class _ClientCallDetails(grpc.ClientCallDetails):
    def __init__(self, base: grpc.ClientCallDetails, metadata: Any, timeout: float | None) -> None:
        self.method = base.method
        self.timeout = timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...] | None:
    """A call's metadata carrying `token` (None without one), for calls made without the
    interceptor below (plain and grpc.aio channels on hot paths)."""
    return ((AUTH_HEADER, f"Bearer {token}"),) if token else None


class ClientDefaultsInterceptor(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamStreamClientInterceptor,  # type: ignore[type-arg]
):
    """Adds the bearer token and a default deadline to every call that lacks one.

    Streaming calls get no default deadline: a watch may rightly last for hours.
    """

    def __init__(self, token: str | None, default_timeout: float | None) -> None:
        self._token = token
        self._timeout = default_timeout

    def _details(self, details: grpc.ClientCallDetails, streaming: bool) -> _ClientCallDetails:
        metadata = list(details.metadata or ())
        metadata.extend(bearer_metadata(self._token) or ())
        timeout = details.timeout
        if timeout is None and not streaming:
            timeout = self._timeout
        return _ClientCallDetails(details, metadata, timeout)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details, streaming=False), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details, streaming=True), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details, streaming=False), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details, streaming=True), requests)


@dataclass(frozen=True)
class ServerTls:
    """Server certificate and key; with client_ca set, clients must present a certificate (mTLS)."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None

    def credentials(self) -> grpc.ServerCredentials:
        client_ca = self.client_ca_file.read_bytes() if self.client_ca_file else None
        return grpc.ssl_server_credentials(
            [(self.key_file.read_bytes(), self.cert_file.read_bytes())],
            root_certificates=client_ca,
            require_client_auth=client_ca is not None,
        )


# The environment of a daemon's child processes (training processes) for their calls.
CA_VARIABLE = "GEARSHIFT_TLS_CA"
CERT_VARIABLE = "GEARSHIFT_TLS_CERT"
KEY_VARIABLE = "GEARSHIFT_TLS_KEY"


@dataclass(frozen=True)
class ClientTls:
    """CA to trust (None: system roots) and, for mTLS, the client's own certificate and key."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    def environment(self) -> dict[str, str]:
        """The variables that hand these settings to a child process (see from_environment)."""
        files = {
            CA_VARIABLE: self.ca_file,
            CERT_VARIABLE: self.cert_file,
            KEY_VARIABLE: self.key_file,
        }
        return {name: str(path.absolute()) for name, path in files.items() if path}

    @classmethod
    def from_environment(cls, env: Mapping[str, str]) -> ClientTls | None:
        """What `environment()` wrote; None when no CA is set (plaintext calls)."""
        if not env.get(CA_VARIABLE):
            return None

        def path(name: str) -> Path | None:
            return Path(env[name]) if env.get(name) else None

        return cls(path(CA_VARIABLE), path(CERT_VARIABLE), path(KEY_VARIABLE))

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: Path | None) -> bytes | None:
            return path.read_bytes() if path else None

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file),
            private_key=read(self.key_file),
            certificate_chain=read(self.cert_file),
        )
