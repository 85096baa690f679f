"""Hooks around the loop: stop requests, progress reports, and the per-step control exchange.

A stop request (a call, or SIGUSR1/SIGTERM) only sets a flag. Every step, the
processes exchange their flags together with their ESTs' losses, so all of
them see the request at the same global step, checkpoint there and exit.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import FrameType

import torch

from gearshift.worker.runtime.comm import Message

TAG_CONTROL = 5
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class Outcome(enum.StrEnum):
    COMPLETED = "completed"  # reached total steps
    STOPPED = "stopped"  # checkpointed on request; resume later, with any placement


EXIT_CODES = {Outcome.COMPLETED: 0, Outcome.STOPPED: 75}
"""Process exit status per outcome (75 = EX_TEMPFAIL: stopped, resume later)."""


class StopFlag:
    """Set by `request()` or a signal; read at global-step boundaries."""

    def __init__(self) -> None:
        self._set = False

    def request(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def install(self, signals: Iterable[signal.Signals] = STOP_SIGNALS) -> None:
        """Turn these signals into stop requests (main thread only)."""

        def handle(_signum: int, _frame: FrameType | None) -> None:
            self._set = True

        for sig in signals:
            signal.signal(sig, handle)


@dataclass(frozen=True)
class Progress:
    step: int  # global steps completed
    total_steps: int
    loss: float  # mean of the ESTs' losses
    samples_per_s: float  # over the steps since the last report
    est_losses: tuple[float, ...]  # per EST, exactly (float32 values)


ProgressCallback = Callable[[Progress], None]


class ControlExchange:
    """Each process sends [stop flag, its ESTs' losses] to every other process."""

    def __init__(self, num_ests: int, placement: Sequence[Sequence[int]], rank: int) -> None:
        self.num_ests = num_ests
        self.owner = {est: p for p, ests in enumerate(placement) for est in ests}
        self.rank = rank
        self.procs = len(placement)
        self._mine = torch.zeros(1 + num_ests, dtype=torch.float64)
        self._theirs: dict[int, torch.Tensor] = {}

    def messages(
        self, stop: bool, losses: dict[int, torch.Tensor]
    ) -> tuple[list[Message], list[Message]]:
        mine = torch.zeros(1 + self.num_ests, dtype=torch.float64)
        mine[0] = float(stop)
        for est, loss in losses.items():
            mine[1 + est] = loss.detach().to(device="cpu", dtype=torch.float64)
        self._mine = mine
        self._theirs = {
            peer: torch.empty_like(mine) for peer in range(self.procs) if peer != self.rank
        }
        sends = [Message(peer, mine, TAG_CONTROL) for peer in self._theirs]
        recvs = [Message(peer, buf, TAG_CONTROL) for peer, buf in self._theirs.items()]
        return sends, recvs

    def result(self) -> tuple[bool, list[float]]:
        """(anyone asked to stop, every EST's loss) after the exchange."""
        rows = {self.rank: self._mine, **self._theirs}
        stop = any(bool(row[0]) for row in rows.values())
        losses = [float(rows[self.owner[est]][1 + est]) for est in range(self.num_ests)]
        return stop, losses
