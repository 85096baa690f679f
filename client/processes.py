"""Start Gearshift daemons as child processes, wait until they serve, stop them cleanly.

Used by `gearshift up` and by the integration and end-to-end tests, so both
start daemons the same way. Daemons are started by module name
(`python -m gearshift.<service>`): the client never imports a service package.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gearshift.common.auth import ClientTls
from gearshift.common.health import wait_serving

SERVICES = ("scheduler", "brain", "shardmanager", "worker")
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


class DaemonError(RuntimeError):
    """A daemon exited or did not become ready; the message ends with its log tail."""


@dataclass
class DaemonProcess:
    """A running daemon: its process, log file and (once ready) address."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    ready_file: Path
    address: str = ""
    tls: ClientTls | None = None  # how to reach it when it serves TLS (its health check too)
    metrics: str = ""  # host:port of its Prometheus endpoint, once ready ("" when not served)
    http: bool = False  # a web server (the dashboard): ready once it answers GET /healthz

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, timeout: float = 30.0) -> str:
        """Wait for the ready file, then for health SERVING; returns the address."""
        deadline = time.monotonic() + timeout
        while not self.ready_file.exists():
            if self.process.poll() is not None:
                raise DaemonError(
                    f"{self.name} exited with code {self.process.returncode} before it was "
                    f"ready; log {self.log_path}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise DaemonError(f"{self.name} not ready after {timeout:.0f}s:\n{self.log_tail()}")
            time.sleep(0.05)
        ready = json.loads(self.ready_file.read_text())
        self.address = ready["address"]
        self.metrics = ready.get("metrics", "")
        if self.http:
            wait_http(f"http://{self.address}/healthz", max(deadline - time.monotonic(), 1.0))
        else:
            wait_serving(self.address, max(deadline - time.monotonic(), 1.0), tls=self.tls)
        return self.address

    @property
    def metrics_url(self) -> str:
        return f"http://{self.metrics}/metrics" if self.metrics else ""

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, wait up to timeout, then SIGKILL; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def http_status(url: str, timeout: float = 2.0) -> str:
    """SERVING when GET url answers 200, else what went wrong (as `health_status` words it)."""
    try:
        with _LOCAL.open(url, timeout=timeout) as reply:
            return "SERVING" if reply.status == 200 else f"HTTP {reply.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except OSError:
        return "UNREACHABLE"


def wait_http(url: str, timeout: float) -> None:
    """Until GET url answers 200; DaemonError after timeout seconds."""
    deadline = time.monotonic() + timeout
    while http_status(url) != "SERVING":
        if time.monotonic() > deadline:
            raise DaemonError(f"{url} not answering after {timeout:.0f}s")
        time.sleep(0.1)


def start_daemon(
    name: str,
    args: Sequence[str] = (),
    *,
    run_dir: Path,
    env: Mapping[str, str] | None = None,
    module: str | None = None,
    listen: str = "127.0.0.1:0",
    tls: ClientTls | None = None,
    http: bool = False,
    wrapper: Sequence[str] = (),
) -> DaemonProcess:
    """Start `python -m gearshift.<name>` with logs in run_dir/<name>.log (text format),
    under `wrapper` when given (a command that execs the rest, such as `ip netns exec NS`)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / f"{name}.log"
    ready_file = run_dir / f"{name}.ready"
    ready_file.unlink(missing_ok=True)
    command = [
        *wrapper,
        sys.executable,
        "-m",
        module or f"gearshift.{name}",
        "--listen",
        listen,
        "--ready-file",
        str(ready_file),
        *args,
    ]
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # Ctrl-C in the launcher's terminal is ours to forward
        )
    return DaemonProcess(name, process, log_path, ready_file, tls=tls, http=http)
