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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gearshift.common.auth import ClientTls
from gearshift.common.health import wait_serving

SERVICES = ("scheduler", "brain", "shardmanager", "worker")


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
        self.address = json.loads(self.ready_file.read_text())["address"]
        wait_serving(self.address, max(deadline - time.monotonic(), 1.0), tls=self.tls)
        return self.address

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


def start_daemon(
    name: str,
    args: Sequence[str] = (),
    *,
    run_dir: Path,
    env: Mapping[str, str] | None = None,
    module: str | None = None,
    listen: str = "127.0.0.1:0",
    tls: ClientTls | None = None,
) -> DaemonProcess:
    """Start `python -m gearshift.<name>` with logs in run_dir/<name>.log (text format)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / f"{name}.log"
    ready_file = run_dir / f"{name}.ready"
    ready_file.unlink(missing_ok=True)
    command = [
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
    return DaemonProcess(name, process, log_path, ready_file, tls=tls)
