"""Bearer tokens and TLS / mTLS between real processes."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gearshift.client.processes import start_daemon
from gearshift.common.auth import ClientTls
from gearshift.common.channel import connect
from gearshift.common.errors import UnauthenticatedError, error_from_rpc
from gearshift.common.health import wait_serving
from gearshift.v1 import brain_pb2, brain_pb2_grpc
from tests.conftest import DaemonFactory
from tests.helpers import wait_until


def _call_brain(address: str, token: str | None, tls: ClientTls | None = None) -> grpc.StatusCode:
    with connect(address, token=token, tls=tls, retry=False, timeout=10) as channel:
        try:
            brain_pb2_grpc.BrainStub(channel).GetJobHistory(
                brain_pb2.GetJobHistoryRequest(job_id="x")
            )
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def test_token_required_when_configured(daemons: DaemonFactory) -> None:
    daemon = daemons("brain", env={"GEARSHIFT_TOKEN": "s3cret"})
    assert _call_brain(daemon.address, None) == grpc.StatusCode.UNAUTHENTICATED
    assert _call_brain(daemon.address, "wrong") == grpc.StatusCode.UNAUTHENTICATED
    # With the token the call reaches the servicer, which looks the job up.
    assert _call_brain(daemon.address, "s3cret") == grpc.StatusCode.NOT_FOUND


def test_unauthenticated_maps_to_a_typed_error(daemons: DaemonFactory) -> None:
    daemon = daemons("brain", ["--token", "s3cret"])
    with connect(daemon.address, retry=False) as channel, pytest.raises(grpc.RpcError) as exc:
        brain_pb2_grpc.BrainStub(channel).GetJobHistory(brain_pb2.GetJobHistoryRequest())
    error = error_from_rpc(exc.value)
    assert isinstance(error, UnauthenticatedError)
    assert "missing bearer token" in error.message


def test_health_stays_open_without_token(daemons: DaemonFactory) -> None:
    daemon = daemons("brain", env={"GEARSHIFT_TOKEN": "s3cret"})
    with connect(daemon.address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_tls_and_mtls(pki: dict[str, Path], tmp_path: Path) -> None:
    daemon = start_daemon(
        "brain",
        [
            "--tls-cert",
            str(pki["server_cert"]),
            "--tls-key",
            str(pki["server_key"]),
            "--tls-client-ca",
            str(pki["ca"]),
        ],
        run_dir=tmp_path / "tls",
    )
    try:
        # The ready file appears once serving; health is checked over TLS below.
        wait_until(daemon.ready_file.exists, 30, "TLS brain never became ready")
        port = json.loads(daemon.ready_file.read_text())["address"].rsplit(":", 1)[1]
        address = f"localhost:{port}"
        mtls = ClientTls(pki["ca"], pki["client_cert"], pki["client_key"])
        wait_serving(address, 30, tls=mtls)
        assert _call_brain(address, None, mtls) == grpc.StatusCode.NOT_FOUND
        # Trusting the CA but presenting no client certificate is refused by mTLS.
        assert _call_brain(address, None, ClientTls(pki["ca"])) == grpc.StatusCode.UNAVAILABLE
        # Plaintext against a TLS port fails too.
        assert _call_brain(address, None) == grpc.StatusCode.UNAVAILABLE
    finally:
        assert daemon.stop() == 0
