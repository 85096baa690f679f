"""The pause gate a background task's training loop passes before each global step.

The worker daemon pauses a background task (DeepPool's multiplexing) by creating
a file; the loop waits at the next global-step boundary while it exists. Waiting
between steps never changes what the job computes: the same steps run in the
same order, only later. A stop request ends the wait, so a paused task can still
be stopped with a checkpoint (it runs one more step, at which its processes
agree on the stop, as always). No torch here: the gate is plain polling.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from gearshift.worker.runtime.stop import StopFlag

POLL_S = 0.05  # 20 Hz: a resume costs at most this much of the background's time


class PauseGate:
    """Holds the loop while `paused()` says so and no stop was asked for."""

    def __init__(
        self,
        paused: Callable[[], bool],
        *,
        poll_s: float = POLL_S,
        say: Callable[[str], None] = lambda text: None,
    ) -> None:
        self._paused = paused
        self.poll_s = poll_s
        self.say = say
        self.total_s = 0.0  # time spent paused so far
        self.count = 0  # pauses so far

    @classmethod
    def from_file(cls, path: Path, *, say: Callable[[str], None] = lambda text: None) -> PauseGate:
        """Paused while `path` exists (the worker daemon creates and removes it)."""
        return cls(path.exists, say=say)

    def wait(self, stop: StopFlag, step: int) -> float:
        """Wait while paused (before global step `step` + 1); the seconds waited."""
        if stop.is_set() or not self._paused():
            return 0.0
        began = time.perf_counter()
        self.count += 1
        self.say(f"paused before step {step + 1}")
        while not stop.is_set() and self._paused():
            time.sleep(self.poll_s)
        waited = time.perf_counter() - began
        self.total_s += waited
        why = "a stop was asked for" if stop.is_set() else "resumed"
        self.say(f"{why} after {waited:.2f} s paused (step {step + 1} next)")
        return waited
