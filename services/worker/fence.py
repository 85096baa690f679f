"""The leader fence: a worker obeys only the newest scheduler leader it has heard from.

Schedulers that share a PostgreSQL database elect one leader; each election raises the
leader epoch by one, and every StartTask, StopTask and lease renewal carries it. A
deposed leader that still runs (a partition, a pause longer than its lock) sends a lower
epoch than its successor's, and is refused: it can neither start a task twice nor stop
one that the new leader keeps. Epoch 0 is a scheduler without an election (SQLite,
`gearshift up`); it is obeyed only by a worker that has never seen an elected one.
The epoch is kept in memory: a restarted worker has no task for an old leader to touch.
"""

from __future__ import annotations

import threading

from gearshift.common.errors import PreconditionError


def admits(seen: int, epoch: int) -> bool:
    """Whether a call carrying `epoch` is obeyed by a worker that has seen `seen`."""
    return epoch >= seen


class EpochFence:
    """The highest leader epoch this worker has seen, and the rule over it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seen = 0

    def admit(self, epoch: int, what: str) -> None:
        """Raise the epoch seen to `epoch`, or refuse the call (PreconditionError naming
        both epochs) when it comes from an older leader."""
        if epoch < 0:
            raise PreconditionError(f"{what}: epoch must be >= 0 (got {epoch})")
        with self._lock:
            if not admits(self.seen, epoch):
                raise PreconditionError(
                    f"{what} refused: leader epoch {epoch} is older than epoch {self.seen}, "
                    "already seen by this worker (a deposed scheduler leader)"
                )
            self.seen = epoch

    def current(self, epoch: int) -> bool:
        """For an answer (a lease renewal): True when it comes from the newest leader seen
        (which it then becomes), False when it is an older one's, to be ignored."""
        with self._lock:
            if not admits(self.seen, epoch):
                return False
            self.seen = epoch
            return True
