"""The GearshiftJob operator run by kopf's runner against KMock (a mock Kubernetes API,
served over real HTTP) and a real scheduler process: create, status, Events, delete
through the finalizer, a bad spec, a scheduler unreachable then back, and a scheduler that
serves mTLS only.

Verified against a mock API, not a real cluster: KMock keeps objects and serves watches
but checks no schema and merges patches naively.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import kmock
import pytest
from kopf.testing import KopfRunner

from gearshift.client import Client
from gearshift.client.operator.__main__ import main as operator_main
from gearshift.client.processes import DaemonProcess, start_daemon
from gearshift.common.auth import CA_VARIABLE, CERT_VARIABLE, KEY_VARIABLE, ClientTls
from gearshift.common.codepkg import package
from gearshift.common.errors import UnavailableError
from gearshift.v1 import common_pb2
from tests.helpers import wait_until

JOBS = "/apis/gearshift.dev/v1alpha1/namespaces/default/gearshiftjobs"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"
EVENTS = "/api/v1/namespaces/default/events"
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))
WAIT = 30.0


class Emulator(kmock.KubernetesEmulator):
    """KMock's emulator, but an object created with metadata.generateName gets a name, as an
    API server gives one (kopf names its Events so)."""

    async def _handle(self, request: Any) -> Any:
        meta = request.data.get("metadata") if isinstance(request.data, dict) else None
        if request.action == kmock.action.CREATE and meta and not meta.get("name"):
            meta["name"] = meta.get("generateName", "object-") + uuid.uuid4().hex[:8]
        return await super()._handle(request)


class MockKubernetes:
    """KMock's emulator on a loop of its own thread, so the test and kopf may block."""

    def __init__(self) -> None:
        self.url = ""
        self._ready: Future[str] = Future()
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._serve(),))

    async def _serve(self) -> None:
        try:
            async with Emulator() as api, kmock.Server(api) as server:
                api.resources["gearshift.dev/v1alpha1/gearshiftjobs"] = kmock.ResourceInfo(
                    kind="GearshiftJob",
                    singular="gearshiftjob",
                    namespaced=True,
                    subresources={"status"},
                    verbs={"list", "watch", "get", "create", "patch", "update", "delete"},
                )
                for plural, kind in (("configmaps", "ConfigMap"), ("events", "Event")):
                    api.resources[f"v1/{plural}"] = kmock.ResourceInfo(
                        kind=kind,
                        namespaced=True,
                        verbs={"list", "watch", "get", "create", "patch", "delete"},
                    )
                # What kopf looks for in any cluster before it watches anything.
                api.resources["v1/namespaces"] = kmock.ResourceInfo(
                    kind="Namespace", namespaced=False, verbs={"list", "watch", "get"}
                )
                api.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = (
                    kmock.ResourceInfo(
                        kind="CustomResourceDefinition",
                        namespaced=False,
                        verbs={"list", "watch", "get"},
                    )
                )
                self._ready.set_result(str(server.url).rstrip("/"))
                await self._stop.wait()
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)
            raise

    def __enter__(self) -> MockKubernetes:
        self._thread.start()
        self.url = self._ready.result(timeout=WAIT)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(WAIT)
        self._loop.close()

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """One API request as kubectl makes it; None for a 404."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        try:
            with _LOCAL.open(request, timeout=WAIT) as reply:
                return json.loads(reply.read() or b"null")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def job(self, name: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self.call("GET", f"{JOBS}/{name}")
        return found

    def wait_job(
        self, name: str, predicate: Callable[[dict[str, Any]], object], message: str
    ) -> dict[str, Any]:
        """The object once predicate(object) holds (AssertionError after WAIT seconds)."""
        found: list[dict[str, Any]] = []

        def check() -> bool:
            obj = self.job(name)
            if obj is not None and predicate(obj):
                found.append(obj)
                return True
            return False

        wait_until(check, WAIT, message)
        return found[-1]

    def events(self, name: str) -> list[dict[str, Any]]:
        items = (self.call("GET", EVENTS) or {}).get("items", [])
        return [e for e in items if e.get("involvedObject", {}).get("name") == name]


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    for found in (obj.get("status") or {}).get("conditions") or []:
        if found["type"] == type_:
            return dict(found)
    return {}


def _submitted(obj: dict[str, Any]) -> bool:
    return bool((obj.get("status") or {}).get("jobId"))


def gearshift_job(name: str, **spec: Any) -> dict[str, Any]:
    body = {
        "name": name,
        "entrypoint": {"module": "gearshift.examples.mlp"},
        "num_ests": 2,
        "global_batch_size": 4,
        "total_steps": 5,
        "dataset": {"size": 64, "shard_size": 8},
        **spec,
    }
    return {
        "apiVersion": "gearshift.dev/v1alpha1",
        "kind": "GearshiftJob",
        # What an API server would assign (KMock assigns nothing; kopf's patches test the
        # resourceVersion, which KMock then never changes).
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "creationTimestamp": "2026-11-29T00:00:00Z",
        },
        "spec": body,
    }


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MockKubernetes]:
    """A mock API and a kubeconfig that points kopf at it (its built-in kubeconfig login)."""
    # The handlers read these when kopf first imports them; every test here wants the same.
    monkeypatch.setenv("GEARSHIFT_OPERATOR_POLL_SECONDS", "0.3")
    monkeypatch.setenv("GEARSHIFT_OPERATOR_RETRY_SECONDS", "0.3")
    with MockKubernetes() as api:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "mock",
                    "contexts": [{"name": "mock", "context": {"cluster": "mock", "user": "t"}}],
                    "clusters": [{"name": "mock", "cluster": {"server": api.url}}],
                    "users": [{"name": "t", "user": {"token": "test"}}],
                }
            )
        )
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        yield api


class LateScheduler:
    """A scheduler at a fixed address, started when a test asks: the outage test starts it
    late; the others share it (a start costs seconds on an idle machine, many more on a
    loaded one). The jobs' names keep the tests apart."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.address = f"127.0.0.1:{_free_port()}"
        self.daemon: DaemonProcess | None = None

    def start(self) -> str:
        if self.daemon is None:
            self.daemon = start_daemon(
                "scheduler", own_database(self.folder), run_dir=self.folder, listen=self.address
            )
            self.daemon.wait_ready(60)
        return self.address

    def stop(self) -> None:
        if self.daemon is not None:
            assert self.daemon.stop() == 0
            self.daemon = None


@pytest.fixture(scope="module")
def late_scheduler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LateScheduler]:
    late = LateScheduler(tmp_path_factory.mktemp("scheduler"))
    try:
        yield late
    finally:
        late.stop()


@pytest.fixture
def scheduler(late_scheduler: LateScheduler) -> str:
    """The shared scheduler's address, started."""
    return late_scheduler.start()


def own_database(folder: Path) -> list[str]:
    """The scheduler's database in the test's folder (the default is shared by the cwd)."""
    return ["--database-url", f"sqlite:///{folder}/scheduler.db"]


def operator(scheduler: str, monkeypatch: pytest.MonkeyPatch, *, reraise: bool = True) -> Any:
    monkeypatch.setenv("GEARSHIFT_SCHEDULER", scheduler)
    return KopfRunner(
        ["run", "--standalone", "-A", "-m", "gearshift.client.operator.handlers"],
        timeout=WAIT,
        reraise=reraise,
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_an_unreachable_scheduler_then_back(
    cluster: MockKubernetes, late_scheduler: LateScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    late_scheduler.stop()  # not started yet when the tests run in the file's order
    address = late_scheduler.address
    with operator(address, monkeypatch):
        cluster.call("POST", JOBS, gearshift_job("op-outage"))
        obj = cluster.wait_job(
            "op-outage",
            lambda j: condition(j, "Submitted"),
            "the Submitted condition set while the scheduler is away",
        )
        submitted = condition(obj, "Submitted")
        assert (submitted["status"], submitted["reason"]) == ("False", "SchedulerUnavailable")
        assert address in submitted["message"]

        late_scheduler.start()
        obj = cluster.wait_job(
            "op-outage", _submitted, "the job submitted once the scheduler is back"
        )
        assert condition(obj, "Submitted")["status"] == "True"
        assert [j.spec.name for j in client_jobs(address)].count("op-outage") == 1


def test_create_mirror_and_delete_through_the_finalizer(
    cluster: MockKubernetes,
    scheduler: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    code = {"train.py": "from gearshift.examples.mlp import build  # noqa: F401\n"}
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text(code["train.py"])
    with Client(scheduler) as client, operator(scheduler, monkeypatch) as runner:
        cluster.call(
            "POST",
            JOBS,
            gearshift_job(
                "op-lifecycle",
                entrypoint={"module": "train", "config": {"width": 8}},
                code={"configMap": "train-code"},
            ),
        )
        # Its code's ConfigMap comes later: the job waits for it, and says so.
        obj = cluster.wait_job(
            "op-lifecycle", lambda j: condition(j, "Submitted"), "the job waits for its code"
        )
        assert condition(obj, "Submitted")["reason"] == "CodeNotFound"
        cluster.call(
            "POST",
            CONFIGMAPS,
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": "train-code",
                    "namespace": "default",
                    "labels": {"gearshift.dev/code": "true"},
                },
                "data": code,
            },
        )
        obj = cluster.wait_job("op-lifecycle", _submitted, "the operator submitted the job")
        job_id = obj["status"]["jobId"]
        job = client.get(job_id)
        assert job.spec.name == "op-lifecycle"
        assert json.loads(job.spec.entrypoint.config_json) == {"width": 8}
        # The code came from the ConfigMap, packaged as `gearshift submit` packages a folder.
        assert job.spec.entrypoint.code_sha256 == package(tmp_path / "code").sha256
        assert obj["status"]["codeSha256"] == job.spec.entrypoint.code_sha256
        assert "gearshift.dev/finalizer" in obj["metadata"]["finalizers"]
        assert condition(obj, "Submitted")["status"] == "True"
        # No worker: the job waits, and the status says so as `gearshift jobs` would.
        assert obj["status"]["state"] == "queued"
        assert obj["status"]["devices"] == "-"
        # The scheduler's SUBMITTED event, mirrored as a Kubernetes Event.
        wait_until(
            lambda: any(
                e["reason"] == "Submitted" and "[1]" in e["message"]
                for e in cluster.events("op-lifecycle")
            ),
            WAIT,
            "the scheduler's first event mirrored",
        )

        # A change made outside Kubernetes is mirrored: state, condition and event.
        client.cancel(job_id, reason="cancelled from the CLI")
        obj = cluster.wait_job(
            "op-lifecycle",
            lambda j: j["status"]["state"] == "cancelled",
            "the cancellation mirrored into status",
        )
        assert condition(obj, "Finished") == {
            **condition(obj, "Finished"),
            "status": "True",
            "reason": "Cancelled",
        }
        assert "cancelled from the CLI" in condition(obj, "Finished")["message"]
        wait_until(
            lambda: any(e["reason"] == "Cancelled" for e in cluster.events("op-lifecycle")),
            WAIT,
            "the CANCELLED event mirrored",
        )

        # A second job, deleted while it waits: the finalizer holds it until it is cancelled.
        cluster.call("POST", JOBS, gearshift_job("op-delete"))
        second = cluster.wait_job("op-delete", _submitted, "the second job submitted")
        second_id = second["status"]["jobId"]
        assert client.get(second_id).state == common_pb2.JOB_STATE_QUEUED
        cluster.call("DELETE", f"{JOBS}/op-delete")
        wait_until(lambda: cluster.job("op-delete") is None, WAIT, "the object released")
        cancelled = client.get(second_id)
        assert cancelled.state == common_pb2.JOB_STATE_CANCELLED
        assert "GearshiftJob default/op-delete deleted" in cancelled.message
    assert runner.exception is None
    # One submission per object, however often kopf ran the handler.
    names = [j.spec.name for j in client_jobs(scheduler)]
    assert (names.count("op-lifecycle"), names.count("op-delete")) == (1, 1)


def client_jobs(address: str) -> list[Any]:
    with Client(address) as client:
        return list(client.list().jobs)


def test_a_bad_spec_gets_a_condition_and_is_never_submitted(
    cluster: MockKubernetes, scheduler: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with operator(scheduler, monkeypatch):
        cluster.call("POST", JOBS, gearshift_job("op-bad", global_batch_size=5))
        obj = cluster.wait_job("op-bad", lambda j: condition(j, "Valid"), "the Valid condition set")
        valid = condition(obj, "Valid")
        assert valid["status"] == "False"
        assert valid["reason"] == "InvalidSpec"
        assert "spec.global_batch_size" in valid["message"]
        assert "jobId" not in obj["status"]
        wait_until(
            lambda: any(
                e["type"] == "Warning" and e["reason"] == "InvalidSpec"
                for e in cluster.events("op-bad")
            ),
            WAIT,
            "a Warning event names the problem",
        )
    assert "op-bad" not in [j.spec.name for j in client_jobs(scheduler)]


def test_a_job_is_submitted_to_a_scheduler_that_serves_mtls_only(
    cluster: MockKubernetes,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    pki: dict[str, Path],
) -> None:
    # The operator's TLS comes from the variables the CLI reads (and the chart sets).
    user = ClientTls(pki["ca"], pki["client_cert"], pki["client_key"])
    for variable, value in user.environment().items():
        monkeypatch.setenv(variable, value)
    tls = ["--tls-cert", str(pki["server_cert"]), "--tls-key", str(pki["server_key"]),
           "--tls-ca", str(pki["ca"]), "--tls-client-ca", str(pki["ca"])]  # fmt: skip
    daemon = start_daemon(
        "scheduler", [*own_database(tmp_path), *tls], run_dir=tmp_path, tls=user,
        listen=f"127.0.0.1:{_free_port()}",
    )  # fmt: skip
    try:
        daemon.wait_ready(60)
        address = daemon.address
        with operator(address, monkeypatch) as runner:
            cluster.call("POST", JOBS, gearshift_job("op-tls"))
            obj = cluster.wait_job(
                "op-tls",
                lambda j: (j.get("status") or {}).get("state") == "queued",
                "the job submitted over mTLS and its state mirrored",
            )
            assert condition(obj, "Submitted")["status"] == "True"
        assert runner.exception is None
        with Client(address, tls=user) as client:
            assert client.get(obj["status"]["jobId"]).spec.name == "op-tls"
        with Client(address, timeout=5.0) as plaintext, pytest.raises(UnavailableError):
            plaintext.list()  # TLS only: what the operator called without TLS before
    finally:
        assert daemon.stop() == 0


def test_a_missing_tls_file_stops_the_start_naming_it(
    cluster: MockKubernetes,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    missing = tmp_path / "absent-ca.crt"
    monkeypatch.setenv(CA_VARIABLE, str(missing))
    for variable in (CERT_VARIABLE, KEY_VARIABLE):
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(SystemExit) as exited:
        operator_main(["--scheduler", "127.0.0.1:1"])
    assert exited.value.code == 2
    assert f"{CA_VARIABLE}: {missing} is not a file" in capsys.readouterr().err
    # Under `kopf run -m` (no gearshift-operator): the startup handler fails, permanently.
    with operator("127.0.0.1:1", monkeypatch, reraise=False) as runner:
        pass
    assert runner.exit_code != 0
    assert f"{CA_VARIABLE}: {missing} is not a file" in runner.output
