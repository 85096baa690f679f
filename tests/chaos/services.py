"""PostgreSQL and Redis servers of the chaos run's own, which it kills and restarts without
touching the shared ones other tests use. Redis appends every write to its AOF and fsyncs
it (`appendfsync always`), so a SIGKILL loses no acknowledged write."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from gearshift.common.ports import free_port_in


def _postgres_bin() -> Path:
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if not versions:
        raise RuntimeError("no PostgreSQL server binaries (pg_ctl) on this machine")
    return versions[-1].parent


def _as_postgres(command: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run it as the `postgres` user then."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def _run(command: list[str], what: str, timeout: float = 60.0) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}): {done.stdout}{done.stderr}")


@dataclass
class PrivatePostgres:
    """A throwaway PostgreSQL cluster on a free port; `crash()` stops it as a power cut would."""

    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gs-chaos-pg-")))
    port: int = 0

    def __post_init__(self) -> None:
        self.bin = _postgres_bin()
        self.data = self.root / "data"
        self.port = self.port or free_port_in(15000, 17000)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        _run(
            _as_postgres(
                [str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres"]
            ),
            "initdb",
        )

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _ctl(self, *args: str) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=on"
        _run(
            _as_postgres(
                [str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options, "-w", *args]
            ),
            f"pg_ctl {' '.join(args)}",
        )

    def start(self) -> None:
        self._ctl("-l", str(self.root / "log"), "start")

    def crash(self) -> None:
        """Immediate shutdown: no checkpoint, clients cut off; recovery replays the WAL."""
        self._ctl("-m", "immediate", "stop")

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._ctl("-m", "immediate", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class PrivateRedis:
    """A redis-server with its AOF on, killed with SIGKILL and started again on the same port."""

    root: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.port = self.port or free_port_in(17000, 19000)
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 30.0) -> None:
        server = shutil.which("redis-server")
        if server is None:
            raise RuntimeError("redis-server is not on PATH")
        log = (self.root / "redis.log").open("ab")
        self.process = subprocess.Popen(
            [server, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.root),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on {self.port} did not start; see {log.name}")
            time.sleep(0.05)

    def _answers(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def close(self) -> None:
        self.kill()
