"""The scheduler's heartbeat relays as real processes (heartbeats.relays): workers learn
their relay when they register and heartbeat it (on a stream, as the worker daemon does);
the relays hand the heartbeats on in batches and keep the workers alive; a killed relay is
started again and its workers find it by registering again; the relays go when the
scheduler does; a bad heartbeat or batch is refused whole; the relays check identities as
the scheduler does (each message of a stream) and re-read the tokens file on its SIGHUP
(which, without one, leaves them be); and a relay that cannot serve stops the scheduler,
saying why."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from bench.load import helper_pids
from gearshift.client.processes import DaemonProcess, start_daemon
from gearshift.common.channel import connect
from gearshift.common.identity import create_job_key, create_token
from gearshift.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from gearshift.worker.registration import HeartbeatStream
from tests.conftest import DaemonFactory
from tests.helpers import running, scheduler_config, wait_until

C = common_pb2
S = scheduler_pb2
WAIT = 30.0
TIMEOUT = 2.0  # heartbeats.timeoutSeconds


def start(daemons: DaemonFactory, folder: Path, database: str, *extra: str) -> DaemonProcess:
    config = scheduler_config(
        folder,
        round={"seconds": 60},
        heartbeats={"intervalSeconds": 0.3, "timeoutSeconds": TIMEOUT, "relays": 2},
    )
    return daemons("scheduler", ["--database-url", database, *config, *extra])


def start_guarded(daemons: DaemonFactory, tmp_path: Path, tokens: Path) -> DaemonProcess:
    """A scheduler (with relays) that checks identities against `tokens`."""
    key = tmp_path / "job.key"
    create_job_key(key)
    return start(
        daemons, tmp_path, f"sqlite:///{tmp_path / 's.db'}", "--tokens-file", str(tokens),
        "--job-key-file", str(key), "--token", "internal-service-token",
    )  # fmt: skip


def relays(scheduler: DaemonProcess) -> list[int]:
    """Pids of the scheduler's relay processes."""
    return helper_pids(scheduler.process.pid)["relays"]


def ready_file_of(pid: int) -> str:
    """The --ready-file a relay process was started with."""
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return args[args.index("--ready-file") + 1]


def registration(worker_id: str) -> S.RegisterWorkerRequest:
    return S.RegisterWorkerRequest(
        worker_id=worker_id,
        address="127.0.0.1:9",
        devices=[C.DeviceGroup(accelerator_type="cpu", count=1)],
    )


def at(port: int, token: str | None = None) -> scheduler_pb2_grpc.WorkerRegistryStub:
    return scheduler_pb2_grpc.WorkerRegistryStub(connect(f"127.0.0.1:{port}", token=token))


def code_of(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details() or ""


def alive(jobs: scheduler_pb2_grpc.JobServiceStub) -> dict[str, bool]:
    state = jobs.GetClusterState(S.GetClusterStateRequest())
    return {w.worker_id: w.alive for w in state.workers}


def test_workers_heartbeat_through_relays_that_come_back_and_go_with_the_scheduler(
    daemons: DaemonFactory, tmp_path: Path, postgres_db: str
) -> None:
    scheduler = start(daemons, tmp_path, postgres_db)
    channel = connect(scheduler.address)
    registry = scheduler_pb2_grpc.WorkerRegistryStub(channel)
    jobs = scheduler_pb2_grpc.JobServiceStub(channel)
    names = [f"w{i}" for i in range(8)]
    ports = {name: registry.RegisterWorker(registration(name)).heartbeat_port for name in names}
    own_port = int(scheduler.address.rpartition(":")[2])
    assert len(set(ports.values())) == 2 and own_port not in ports.values(), ports
    registry.RegisterWorker(registration("silent"))  # heartbeats nowhere: it is lost

    # A bad batch changes nothing: "silent"'s heartbeat in it is not applied.
    bad = S.HeartbeatBatchRequest(
        heartbeats=[S.HeartbeatRequest(worker_id="silent"), S.HeartbeatRequest(worker_id="a b")]
    )
    code, details = code_of(lambda: registry.HeartbeatBatch(bad))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "heartbeats[1].worker_id" in details

    # Heartbeats through the relays alone, each worker's on one open stream, keep the
    # workers alive past the timeout.
    streams = {name: HeartbeatStream(at(ports[name])) for name in names}

    def beat() -> bool:
        for name in names:
            assert not streams[name].beat(S.HeartbeatRequest(worker_id=name)).reregister
        return alive(jobs).get("silent") is False

    wait_until(beat, WAIT, "the silent worker was never declared lost")
    assert all(alive(jobs)[name] for name in names)
    # A bad message ends its stream with the status naming the field; the scheduler
    # itself serves no streams.
    with pytest.raises(grpc.RpcError) as info:
        streams["w0"].beat(S.HeartbeatRequest(worker_id=""))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert "worker_id" in (info.value.details() or "")
    code, details = code_of(lambda: HeartbeatStream(registry).beat(S.HeartbeatRequest()))
    assert code == grpc.StatusCode.UNIMPLEMENTED and "relays" in details
    for stream in streams.values():
        stream.close()
    # The relay answers as the scheduler does: an unknown worker registers again.
    assert at(ports["w0"]).Heartbeat(S.HeartbeatRequest(worker_id="nobody")).reregister
    code, details = code_of(lambda: at(ports["w0"]).Heartbeat(S.HeartbeatRequest(worker_id="")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "worker_id" in details
    code, details = code_of(
        lambda: at(ports["w0"]).RenewLease(S.RenewLeaseRequest(worker_id="w0", task_id="t"))
    )
    assert code == grpc.StatusCode.UNIMPLEMENTED and "call the scheduler itself" in details

    # A killed relay: heartbeats there fail, it is started again on a new port, and a
    # worker that registers again is sent there.
    pids: list[int] = wait_until(
        lambda: relays(scheduler)[1:] and relays(scheduler), WAIT, "relays"
    )
    for pid in pids:  # their ready files are gone once they serve: a killed scheduler leaves none
        ready = Path(ready_file_of(pid))
        assert not ready.parent.exists(), ready
    os.kill(pids[0], signal.SIGKILL)

    def dead_port() -> int:
        for port in set(ports.values()):
            try:
                at(port).Heartbeat(S.HeartbeatRequest(worker_id="w0"), timeout=2)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc.details()
                return port
        return 0

    dead = wait_until(dead_port, WAIT, "every relay still answers after one was killed")
    wait_until(
        lambda: pids[0] not in relays(scheduler) and len(relays(scheduler)) == 2,
        WAIT,
        "the killed relay was not started again",
    )
    orphan = next(name for name, port in ports.items() if port == dead)

    def moved() -> int:
        port = registry.RegisterWorker(registration(orphan)).heartbeat_port
        return port if port and port not in ports.values() else 0

    new_port = wait_until(moved, WAIT, f"{orphan} was never sent to the new relay")
    assert not at(new_port).Heartbeat(S.HeartbeatRequest(worker_id=orphan)).reregister

    # The scheduler killed: its relays stop too.
    left = relays(scheduler)
    scheduler.kill()
    wait_until(lambda: not any(map(running, left)), WAIT, f"relays {left} outlived the scheduler")


def test_relays_check_identities_as_the_scheduler_does(
    daemons: DaemonFactory, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens"
    w1, tenant = create_token(tokens, "worker:w1"), create_token(tokens, "tenant:a")
    scheduler = start_guarded(daemons, tmp_path, tokens)
    registry = scheduler_pb2_grpc.WorkerRegistryStub(connect(scheduler.address, token=w1))
    port = registry.RegisterWorker(registration("w1")).heartbeat_port
    assert port
    assert not at(port, w1).Heartbeat(S.HeartbeatRequest(worker_id="w1")).reregister
    code, details = code_of(lambda: at(port, w1).Heartbeat(S.HeartbeatRequest(worker_id="w2")))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "w2" in details
    # On a stream each message is checked: its own id passes, another's ends the stream.
    stream = HeartbeatStream(at(port, w1))
    assert not stream.beat(S.HeartbeatRequest(worker_id="w1")).reregister
    code, details = code_of(lambda: stream.beat(S.HeartbeatRequest(worker_id="w2")))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "w2" in details
    code, _ = code_of(lambda: at(port, "wrong").Heartbeat(S.HeartbeatRequest(worker_id="w1")))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    # Only a service (the relays, with the scheduler's own token) hands on batches.
    batch = S.HeartbeatBatchRequest(heartbeats=[S.HeartbeatRequest(worker_id="w1")])
    for token in (w1, tenant):
        stub = scheduler_pb2_grpc.WorkerRegistryStub(connect(scheduler.address, token=token))
        code, _ = code_of(lambda stub=stub: stub.HeartbeatBatch(batch))  # type: ignore[misc]
        assert code == grpc.StatusCode.PERMISSION_DENIED


def test_a_relay_that_cannot_serve_stops_the_scheduler_saying_why(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = scheduler_config(tmp_path, heartbeats={"relays": 1, "relayPort": port})
        daemon = start_daemon(
            "scheduler",
            ["--database-url", f"sqlite:///{tmp_path / 's.db'}", *config],
            run_dir=tmp_path / "run",
        )
        try:
            assert daemon.process.wait(60) == 1
        finally:
            daemon.kill()
    log = daemon.log_path.read_text()
    assert "heartbeat relay 0 exited with code 1 before it served" in log, log[-2000:]
    assert f"127.0.0.1:{port}" in log  # the relay's own error names the address it wanted
    assert "Traceback" not in log  # an error line, not a crash


def test_sighup_reaches_the_relays_with_the_tokens_file_and_spares_them_without(
    daemons: DaemonFactory, tmp_path: Path
) -> None:
    plain = start(daemons, tmp_path, f"sqlite:///{tmp_path / 'plain.db'}")
    before = wait_until(lambda: relays(plain)[1:] and relays(plain), WAIT, "relays")
    plain.process.send_signal(signal.SIGHUP)  # a tenants-file reload: the relays stay
    registry = scheduler_pb2_grpc.WorkerRegistryStub(connect(plain.address))
    port = registry.RegisterWorker(registration("w1")).heartbeat_port
    assert not at(port).Heartbeat(S.HeartbeatRequest(worker_id="w1")).reregister
    assert sorted(relays(plain)) == sorted(before)

    tokens = tmp_path / "tokens"
    create_token(tokens, "admin")
    guarded = start_guarded(daemons, tmp_path, tokens)
    w2 = create_token(tokens, "worker:w2")  # after the start: unknown until a reload
    registry = scheduler_pb2_grpc.WorkerRegistryStub(connect(guarded.address, token=w2))
    code, _ = code_of(lambda: registry.RegisterWorker(registration("w2")))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    guarded.process.send_signal(signal.SIGHUP)
    port = wait_until(lambda: _registered(registry, "w2"), WAIT, "the reloaded token never worked")

    def relay_knows_it() -> bool:
        try:
            return not at(port, w2).Heartbeat(S.HeartbeatRequest(worker_id="w2")).reregister
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAUTHENTICATED, exc.details()
            return False

    wait_until(relay_knows_it, WAIT, "the relay never reloaded the tokens file")


def _registered(registry: scheduler_pb2_grpc.WorkerRegistryStub, worker_id: str) -> int:
    try:
        return registry.RegisterWorker(registration(worker_id)).heartbeat_port
    except grpc.RpcError:
        return 0
