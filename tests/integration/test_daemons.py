"""Each daemon as a real process: serves health, stops on SIGTERM, documents its flags,
answers UNIMPLEMENTED for logic still to come, and INVALID_ARGUMENT naming the field."""

from __future__ import annotations

import importlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gearshift.common.channel import connect
from gearshift.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from tests.conftest import DaemonFactory

SERVICES = ["scheduler", "brain", "shardmanager", "worker"]


@pytest.mark.parametrize("name", SERVICES)
def test_daemon_serves_then_stops_on_sigterm(daemons: DaemonFactory, name: str) -> None:
    daemon = daemons(name)
    with connect(daemon.address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert reply.status == health_pb2.HealthCheckResponse.SERVING

    started = time.monotonic()
    daemon.process.send_signal(signal.SIGTERM)
    code = daemon.process.wait(timeout=10)
    elapsed = time.monotonic() - started
    assert code == 0, daemon.log_tail()
    assert elapsed < 5.0, f"{name} took {elapsed:.1f}s to stop"


@pytest.mark.parametrize("name", SERVICES)
def test_help_documents_every_flag(name: str) -> None:
    module = importlib.import_module(f"gearshift.{name}.daemon")
    text = subprocess.run(
        [sys.executable, "-m", f"gearshift.{name}", "--help"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for option in module.OPTIONS:
        assert option.flag in text, option.flag
        assert option.env in text, option.env
        assert option.help.split()[0] in text


def test_console_scripts_run() -> None:
    bin_dir = Path(sys.executable).parent
    for name in SERVICES:
        out = subprocess.run(
            [str(bin_dir / f"gearshift-{name}"), "--help"],
            check=True,
            capture_output=True,
            text=True,
        )
        assert f"gearshift-{name}" in out.stdout


def test_bad_setting_fails_fast_with_a_clear_message() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gearshift.brain", "--listen", "127.0.0.1:0", "--tls-cert", "x.pem"],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert "--tls-cert and --tls-key must be given together" in result.stderr


def _spec() -> common_pb2.JobSpec:
    return common_pb2.JobSpec(
        name="j",
        entrypoint=common_pb2.Entrypoint(module="gearshift.examples.mlp"),
        num_ests=2,
        global_batch_size=8,
        total_steps=10,
        dataset=common_pb2.DatasetSpec(size=100, shard_size=10),
    )


def test_invalid_argument_names_the_field(daemons: DaemonFactory) -> None:
    daemon = daemons("scheduler")
    spec = _spec()
    spec.num_ests = 0
    with connect(daemon.address) as channel:
        stub = scheduler_pb2_grpc.JobServiceStub(channel)
        with pytest.raises(grpc.RpcError) as exc:
            stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert str(exc.value.details()).startswith("spec.num_ests:")
