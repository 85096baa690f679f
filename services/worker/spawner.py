"""Starting training processes so that they die with their worker daemon.

A daemon killed with SIGKILL cannot stop its children, yet they must not
outlive it: a lost node must look lost, not leave half a job training and
writing checkpoints. Each child asks the kernel for SIGKILL when its parent
goes away (`prctl(PR_SET_PDEATHSIG)`): the first thing `python -m
gearshift.worker.run` does when PARENT_VARIABLE names its parent (see
`die_with_parent`); a child whose parent is already gone by then exits. No
Python runs between fork and exec (a `preexec_fn` in a process with gRPC's
threads can crash the child). The kernel ties the signal to the *thread* that
forked, so every child is started from one thread that lives as long as the
daemon, never from a short-lived gRPC handler thread.

That thread keeps the runtime's stop signals blocked, and children inherit the
mask: the runtime unblocks them once it can turn them into a
checkpoint-and-stop, so a stop that comes early waits instead of killing the
process. Children start in a session of their own (a Ctrl-C meant for the
daemon's terminal is the daemon's to handle).

Processes that may be forked (`SpawnRequest.forkable`) come from a zygote instead: a
process started the same way that has imported torch and the runtime once and forks a
child per request (see zygote.py), so a new placement does not spend seconds importing
torch in every process. A zygote that died is started again for the next request.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import logging
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

log = logging.getLogger("gearshift.worker.spawner")

PR_SET_PDEATHSIG = 1
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
PARENT_VARIABLE = "GEARSHIFT_PARENT_PID"
RUN_MODULE = ("-m", "gearshift.worker.run")
FORK_TIMEOUT_S = 120.0  # includes the zygote's own start (imports) for the first request
# What every training process imports, loaded once by a process that forks them (the
# zygote, the launcher's fork server); none starts a thread, a device or a channel.
# torch._dynamo is what an optimizer's constructor imports on first use (about 1.5 s);
# gearshift.worker.wiring brings gRPC (imported, never called, before a fork).
PRELOAD = (
    "numpy",
    "torch",
    "torch._dynamo",
    "gearshift.worker.run",
    "gearshift.worker.runtime.process",
    "gearshift.worker.runtime.trainer",
    "gearshift.worker.wiring",
)


class Child(Protocol):
    """A started process, as a subprocess.Popen is one."""

    pid: int

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...


@dataclass(frozen=True)
class SpawnRequest:
    argv: Sequence[str]  # [python, "-m", "gearshift.worker.run", ...]
    env: Mapping[str, str]
    cwd: Path
    log_path: Path
    forkable: bool = False  # nothing that torch reads at import differs from the zygote's


def die_with_parent() -> None:
    """In a child: SIGKILL when the parent named by PARENT_VARIABLE dies (Linux); exit now if
    it already has. A no-op without the variable (a process started by hand)."""
    parent = os.environ.get(PARENT_VARIABLE, "")
    if not parent.isdigit():
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != int(parent):
        os._exit(1)


class ForkedChild:
    """A training process forked by the zygote: its exit code comes from the zygote."""

    def __init__(self, pid: int, zygote: Zygote) -> None:
        self.pid = pid
        self.code: int | None = None
        self._zygote = zygote

    def poll(self) -> int | None:
        if self.code is None and not self._zygote.alive():
            self.code = -signal.SIGKILL  # it died with the zygote
        return self.code

    def send_signal(self, sig: int) -> None:
        if self.code is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


class Zygote:
    """The daemon's end of `python -m gearshift.worker.zygote` (created on the spawner thread)."""

    def __init__(self, python: str, env: Mapping[str, str]) -> None:
        self.process = subprocess.Popen(
            [python, "-m", "gearshift.worker.zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**env, PARENT_VARIABLE: str(os.getpid())},
            start_new_session=True,
        )
        self._lock = threading.Lock()
        self._next = 0
        self._waiting: dict[int, Future[ForkedChild]] = {}
        self._children: dict[int, ForkedChild] = {}
        threading.Thread(target=self._read, name="zygote-reader", daemon=True).start()

    def alive(self) -> bool:
        return self.process.poll() is None

    def fork(self, request: SpawnRequest) -> Future[ForkedChild]:
        future: Future[ForkedChild] = Future()
        stdin = self.process.stdin
        assert stdin is not None
        with self._lock:
            self._next += 1
            self._waiting[self._next] = future
            message = {
                "id": self._next,
                "argv": list(request.argv[3:]),
                "env": dict(request.env),
                "cwd": str(request.cwd),
                "log": str(request.log_path),
            }
            try:
                stdin.write((json.dumps(message) + "\n").encode())
                stdin.flush()
            except OSError as exc:
                self._waiting.pop(self._next, None)
                future.set_exception(exc)
        return future

    def _read(self) -> None:
        stdout: IO[bytes] | None = self.process.stdout
        assert stdout is not None
        for line in stdout:
            message: dict[str, Any] = json.loads(line)
            with self._lock:
                if "exit" in message:
                    child = self._children.pop(int(message["exit"]), None)
                    if child is not None:
                        child.code = int(message["code"])
                    continue
                future = self._waiting.pop(int(message["id"]), None)
                if future is None:
                    continue
                if "pid" in message:
                    child = ForkedChild(int(message["pid"]), self)
                    self._children[child.pid] = child
                    future.set_result(child)
                else:
                    future.set_exception(OSError(f"the zygote could not fork: {message['error']}"))
        self.process.wait()
        log.warning("zygote exited", extra={"code": self.process.returncode})
        with self._lock:
            for future in self._waiting.values():
                future.set_exception(OSError("the zygote exited"))
            self._waiting.clear()
            for child in self._children.values():
                child.code = -signal.SIGKILL


class Spawner:
    """Starts processes from one long-lived thread; `spawn` may be called from any thread.

    With `zygote_python`, forkable requests are forked by a zygote (started at once, in
    the background, so that it is warm when the first task comes).
    """

    def __init__(
        self, *, zygote_python: str | None = None, env: Mapping[str, str] | None = None
    ) -> None:
        self._requests: queue.Queue[tuple[Callable[[], Any], Future[Any]] | None]
        self._requests = queue.Queue()
        self._zygote_python = zygote_python
        self._env = dict(os.environ if env is None else env)
        self._zygote: Zygote | None = None
        self._thread = threading.Thread(target=self._run, name="spawner", daemon=True)
        self._thread.start()
        if zygote_python:
            self._on_thread(self._warm_zygote)

    def spawn(self, request: SpawnRequest) -> Child:
        """Start one process with stdout and stderr appended to its log file."""
        request.log_path.parent.mkdir(parents=True, exist_ok=True)
        if request.forkable and self._zygote_python:
            zygote: Zygote = self._on_thread(self._warm_zygote).result()
            return zygote.fork(request).result(timeout=FORK_TIMEOUT_S)
        child: Child = self._on_thread(lambda: self._popen(request)).result()
        return child

    def close(self) -> None:
        """Stop the thread; only when no child needs it any more (their death signal is tied
        to it), i.e. when the daemon exits."""
        self._requests.put(None)
        self._thread.join(timeout=5)

    def _on_thread(self, fn: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        self._requests.put((fn, future))
        return future

    def _warm_zygote(self) -> Zygote:
        if self._zygote is None or not self._zygote.alive():
            assert self._zygote_python is not None
            self._zygote = Zygote(self._zygote_python, self._env)
        return self._zygote

    @staticmethod
    def _popen(request: SpawnRequest) -> subprocess.Popen[bytes]:
        with request.log_path.open("ab") as log_file:
            return subprocess.Popen(
                list(request.argv),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=request.cwd,
                env={**request.env, PARENT_VARIABLE: str(os.getpid())},
                start_new_session=True,
            )

    def _run(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # this thread only
        while (item := self._requests.get()) is not None:
            fn, future = item
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)
