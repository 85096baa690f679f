"""The scheduler's heartbeat relays (gearshift.scheduler.api.heartbeat_relay) as child
processes: started with it, started again when one dies, stopped with it, told to reload
on SIGHUP; and which relay serves a worker.

A worker learns its relay's port when it registers; while a relay is down its workers
heartbeat the scheduler itself (port 0), and those that were on it register again when
a heartbeat there fails.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger("gearshift.scheduler.relays")

READY_TIMEOUT_S = 60.0
RESTART_DELAY_S = 1.0
STOP_TIMEOUT_S = 10.0


def relay_of(worker_id: str, ports: list[int]) -> int:
    """The port of the relay that serves a worker: the same one while the relays stay up."""
    if not ports:
        return 0
    return ports[zlib.crc32(worker_id.encode()) % len(ports)]


def wildcard_to_local(address: str) -> str:
    """How a child on this host dials an address the scheduler listens on."""
    host, _, port = address.rpartition(":")
    if host in ("0.0.0.0", "[::]", ""):
        host = "127.0.0.1"
    return f"{host}:{port}"


class HeartbeatRelays:
    """`count` relay processes listening on `host` (ports picked by the OS, or `first_port`
    and the ones after it); `env` carries the security settings (tokens, TLS) they share
    with the scheduler."""

    def __init__(self, count: int, host: str, env: Mapping[str, str], first_port: int = 0) -> None:
        self.count = count
        self.host = host
        self.env = dict(env)
        self.first_port = first_port
        self.restarts = 0
        self._ports = [0] * count
        self._processes: list[subprocess.Popen[bytes] | None] = [None] * count
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    def ports(self) -> list[int]:
        return list(self._ports)

    def port_for(self, worker_id: str) -> int:
        return relay_of(worker_id, self._ports)

    def start(self, upstream: str) -> None:
        """Start every relay and wait until each serves; RuntimeError names one that cannot.
        With none (count 0) nothing starts, and every worker heartbeats the scheduler."""
        if not self.count:
            return
        self.upstream = wildcard_to_local(upstream)
        for slot in range(self.count):
            self._ports[slot] = self._spawn(slot)
        for slot in range(self.count):
            thread = threading.Thread(
                target=self._keep, args=(slot,), name=f"relay-{slot}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        log.info("heartbeat relays serving", extra={"ports": self.ports()})

    def reload(self) -> None:
        """SIGHUP to every relay: they re-read the tokens file as the scheduler does."""
        for process in self._processes:
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGHUP)

    def stop(self) -> None:
        self._stopping.set()
        for slot in range(self.count):
            self._terminate(slot)
        for thread in self._threads:
            thread.join(timeout=STOP_TIMEOUT_S)
        for process in self._processes:
            if process is None:
                continue
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _terminate(self, slot: int) -> None:
        process = self._processes[slot]
        if process is not None and process.poll() is None:
            process.terminate()

    def _keep(self, slot: int) -> None:
        while not self._stopping.is_set():
            process = self._processes[slot]
            if process is not None:
                code = process.wait()
                self._ports[slot] = 0
                if self._stopping.is_set():
                    return
                log.warning(
                    "a heartbeat relay exited; starting it again",
                    extra={"slot": slot, "code": code},
                )
                self.restarts += 1
            if self._stopping.wait(RESTART_DELAY_S):
                return
            try:
                self._ports[slot] = self._spawn(slot)
            except RuntimeError as exc:
                self._processes[slot] = None
                log.error(
                    "a heartbeat relay did not start", extra={"slot": slot, "error": str(exc)}
                )
                continue
            if self._stopping.is_set():  # stop() may have missed the one just started
                self._terminate(slot)

    def _spawn(self, slot: int) -> int:
        """Start the slot's relay and return its port once it serves. Its ready file lives
        in a folder of its own for just that long: a scheduler killed later leaves none."""
        with tempfile.TemporaryDirectory(prefix="gearshift-relay-") as folder:
            return self._spawn_in(slot, Path(folder) / "ready.json")

    def _spawn_in(self, slot: int, ready: Path) -> int:
        port = self.first_port + slot if self.first_port else 0
        command = [
            sys.executable,
            *("-m", "gearshift.scheduler.api.heartbeat_relay"),  # no scheduler imports
            *("--listen", f"{self.host}:{port}"),
            *("--upstream", self.upstream),
            *("--parent-pid", str(os.getpid())),
            *("--ready-file", str(ready)),
        ]
        process = subprocess.Popen(command, env={**os.environ, **self.env})
        self._processes[slot] = process
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.exists():
            if process.poll() is not None:
                raise RuntimeError(
                    f"heartbeat relay {slot} exited with code {process.returncode} before it "
                    "served (its error is in this log)"
                )
            if time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(
                    f"heartbeat relay {slot} did not serve in {READY_TIMEOUT_S:.0f} s"
                )
            time.sleep(0.05)
        address = json.loads(ready.read_text())["address"]
        return int(address.rpartition(":")[2])
