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
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

PR_SET_PDEATHSIG = 1
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


@dataclass(frozen=True)
class SpawnRequest:
    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: Path
    log_path: Path


PARENT_VARIABLE = "GEARSHIFT_PARENT_PID"


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


class Spawner:
    """Starts processes from one long-lived thread; `spawn` may be called from any thread."""

    def __init__(self) -> None:
        self._requests: queue.Queue[tuple[SpawnRequest, Future[subprocess.Popen[bytes]]] | None]
        self._requests = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="spawner", daemon=True)
        self._thread.start()

    def spawn(self, request: SpawnRequest) -> subprocess.Popen[bytes]:
        """Start one process with stdout and stderr appended to its log file."""
        future: Future[subprocess.Popen[bytes]] = Future()
        self._requests.put((request, future))
        return future.result()

    def close(self) -> None:
        """Stop the thread; only when no child needs it any more (their death signal is tied
        to it), i.e. when the daemon exits."""
        self._requests.put(None)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # this thread only
        parent = str(os.getpid())
        while (item := self._requests.get()) is not None:
            request, future = item
            try:
                request.log_path.parent.mkdir(parents=True, exist_ok=True)
                with request.log_path.open("ab") as log:
                    process = subprocess.Popen(
                        list(request.argv),
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=request.cwd,
                        env={**request.env, PARENT_VARIABLE: parent},
                        start_new_session=True,
                    )
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(process)
