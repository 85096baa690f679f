"""Wait in the main thread for SIGTERM or SIGINT without touching locks in a signal handler."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from typing import Any


def wait_for_signal(
    signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
) -> signal.Signals:
    """Block until one of `signals` arrives; returns it. Main thread only.

    The handler only records the signal; the main thread sleeps in a read on a
    pipe that the interpreter writes to when a signal arrives
    (signal.set_wakeup_fd), so a signal that comes before the read is not lost.
    """
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    received: list[int] = []

    def handle(signum: int, _frame: Any) -> None:
        received.append(signum)

    previous = {sig: signal.signal(sig, handle) for sig in signals}
    previous_fd = signal.set_wakeup_fd(write_fd)
    try:
        while not received:
            os.read(read_fd, 1)
        return signal.Signals(received[0])
    finally:
        signal.set_wakeup_fd(previous_fd)
        for sig, old in previous.items():
            signal.signal(sig, old)
        os.close(read_fd)
        os.close(write_fd)
