"""Progress reports, and the per-step control exchange that carries stop requests.

Every step, the processes exchange their stop flags (see `stop.py`) and whether they
were asked to change the job's membership (membership.py) together with their ESTs'
losses, so all of them see a request at the same global step and act on it there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from gearshift.worker.runtime.comm import Message

TAG_CONTROL = 5
_HEAD = 2  # stop flag, change flag; then one loss per EST


@dataclass(frozen=True)
class Progress:
    step: int  # global steps completed
    total_steps: int
    loss: float  # mean of the ESTs' losses
    samples_per_s: float  # over the steps since the last report
    est_losses: tuple[float, ...]  # per EST, exactly (float32 values)
    # This process's mean compute seconds per step since the last report: its ESTs'
    # data, forward and backward, without the gradient exchange (where fast processes
    # wait for slow ones). Every process reports it; the straggler detection compares.
    compute_s: float = 0.0
    # When this run finished its first global step (time.time()): the end of a (re)start,
    # from which the scheduler measures what a rescale cost.
    first_step_at: float = 0.0
    rank: int = 0  # the reporting process's rank (membership changes move it)
    ests_held: int = 0  # how many ESTs the reporting process holds
    # When this generation's processes stopped training to form it in place (time.time()
    # at the previous generation's last step; 0: no in-place change): the job trained on
    # until then, so a rescale in place costs only from there.
    paused_from: float = 0.0


ProgressCallback = Callable[[Progress], None]


class ControlExchange:
    """Each process sends [stop flag, change flag, its ESTs' losses] to every other process."""

    def __init__(self, num_ests: int, placement: Sequence[Sequence[int]], rank: int) -> None:
        self.num_ests = num_ests
        self.owner = {est: p for p, ests in enumerate(placement) for est in ests}
        self.rank = rank
        self.procs = len(placement)
        self._mine = torch.zeros(_HEAD + num_ests, dtype=torch.float64)
        self._theirs: dict[int, torch.Tensor] = {}

    def messages(
        self, stop: bool, losses: dict[int, torch.Tensor], *, change: bool = False
    ) -> tuple[list[Message], list[Message]]:
        mine = torch.zeros(_HEAD + self.num_ests, dtype=torch.float64)
        mine[0] = float(stop)
        mine[1] = float(change)
        if losses:
            # One copy for all ESTs (a GPU sync per EST otherwise).
            values = torch.stack([loss.detach() for loss in losses.values()])
            mine[[_HEAD + est for est in losses]] = values.to(device="cpu", dtype=torch.float64)
        self._mine = mine
        self._theirs = {
            peer: torch.empty_like(mine) for peer in range(self.procs) if peer != self.rank
        }
        sends = [Message(peer, mine, TAG_CONTROL) for peer in self._theirs]
        recvs = [Message(peer, buf, TAG_CONTROL) for peer, buf in self._theirs.items()]
        return sends, recvs

    def result(self) -> tuple[bool, list[float]]:
        """(anyone asked to stop, every EST's loss) after the exchange."""
        rows = {peer: row.tolist() for peer, row in {self.rank: self._mine, **self._theirs}.items()}
        stop = any(row[0] for row in rows.values())
        losses = [rows[self.owner[est]][_HEAD + est] for est in range(self.num_ests)]
        return stop, losses

    def change_asked_by(self) -> list[int]:
        """The ranks that were asked to change the membership, after the exchange."""
        rows = {self.rank: self._mine, **self._theirs}
        return sorted(peer for peer, row in rows.items() if row[1].item())
