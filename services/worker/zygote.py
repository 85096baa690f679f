"""`python -m gearshift.worker.zygote`: a process that has imported torch and the runtime once,
and forks a training process for each request, so that a rescale does not wait for every
new process to import torch again (about 2 s of CPU each; 4 processes on 2 cores: ~4 s).

The worker daemon starts it (see spawner.py) and talks to it over its stdin and stdout,
one JSON object per line:

    daemon -> zygote  {"id": 7, "argv": [...run's arguments...], "env": {...}, "cwd": "...",
                       "log": "..."}
    zygote -> daemon  {"id": 7, "pid": 1234}   or   {"id": 7, "error": "..."}
                      {"exit": 1234, "code": 0}  when a child ends (negative: its signal)

A child is what `python -m gearshift.worker.run ARGV` would be: its own session, stdout
and stderr appended to its log, the environment and folder it was given, the runtime's
stop signals blocked until the runtime handles them, SIGKILL when the zygote dies (and the
zygote gets SIGKILL when the daemon dies: a lost node takes everything along). The zygote
runs no thread of its own and never touches a device or a gRPC channel before it forks.

Only jobs whose settings torch reads at import time cannot be forked this way: D2 pins
the CPU kernels' ISA through ATEN_CPU_CAPABILITY, read when torch loads; the daemon starts
those processes from a fresh interpreter.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import sys
import traceback
from typing import Any

from gearshift.worker.spawner import PARENT_VARIABLE, PRELOAD, STOP_SIGNALS, die_with_parent


def _preload() -> None:
    """Import what every training process needs (PRELOAD)."""
    for name in PRELOAD:
        importlib.import_module(name)


def _child(request: dict[str, Any], zygote: int, close: list[int]) -> None:
    """In the forked child: become the training process, then exit with its status."""
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in close:
            os.close(fd)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ[PARENT_VARIABLE] = str(zygote)  # run.main dies with the zygote
        argv = list(request["argv"])
        sys.argv = ["gearshift.worker.run", *argv]
        from gearshift.worker.run import main  # noqa: PLC0415 - preloaded

        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(requests: int, replies: int) -> int:
    """Fork a child per request line on `requests`; report pids and exits on `replies`."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    out = os.fdopen(replies, "w", buffering=1)
    pending = b""
    me = os.getpid()

    def send(message: dict[str, Any]) -> None:
        out.write(json.dumps(message) + "\n")

    while True:
        readable, _, _ = select.select([requests, wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
        while True:  # reap every ended child
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if requests not in readable:
            continue
        data = os.read(requests, 1 << 16)
        if not data:
            return 0  # the daemon is gone or closed us: leave (children follow)
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            out.flush()
            sys.stderr.flush()
            try:
                pid = os.fork()
            except OSError as exc:
                send({"id": request["id"], "error": str(exc)})
                continue
            if pid == 0:
                _child(request, me, [wake_r, wake_w, requests, replies])
            send({"id": request["id"], "pid": pid})


def main() -> int:
    die_with_parent()
    # The protocol owns stdout; anything else printed goes to stderr (the daemon's log).
    replies = os.dup(1)
    os.dup2(2, 1)
    _preload()
    return serve(0, replies)


if __name__ == "__main__":
    sys.exit(main())
