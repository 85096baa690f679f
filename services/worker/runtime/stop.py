"""Stop requests and run outcomes (no torch, so an entry point can install them first).

A stop request — `request()`, or SIGUSR1 / SIGTERM — only sets a flag; the loop
reads it at global-step boundaries, checkpoints and exits with STOPPED.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Iterable
from types import FrameType

from gearshift.common.facts import EXIT_COMPLETED, EXIT_STOPPED

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class Outcome(enum.StrEnum):
    COMPLETED = "completed"  # reached total steps
    STOPPED = "stopped"  # checkpointed on request; resume later, with any placement
    LEFT = "left"  # handed its ESTs to the job's other processes (membership.py) and left


EXIT_CODES = {
    Outcome.COMPLETED: EXIT_COMPLETED,
    Outcome.STOPPED: EXIT_STOPPED,
    Outcome.LEFT: EXIT_COMPLETED,  # its part is done; the job goes on elsewhere
}


class StopFlag:
    """Set by `request()` or a signal; read at global-step boundaries."""

    def __init__(self) -> None:
        self._set = False

    def request(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def install(self, signals: Iterable[signal.Signals] = STOP_SIGNALS) -> None:
        """Turn these signals into stop requests, then let through any that were held back.

        A launcher spawns training processes with these signals blocked, so a
        request that comes before the handler exists waits instead of killing
        the process. Main thread only.
        """
        signals = tuple(signals)

        def handle(_signum: int, _frame: FrameType | None) -> None:
            self._set = True

        for sig in signals:
            signal.signal(sig, handle)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
