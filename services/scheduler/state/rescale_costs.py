"""What rescales cost, measured: from the scheduler's decision to the new placement's first
step, per job and, as a prior for jobs not yet rescaled, per model type.

The round notes each decision (`decided`, at the RESCALING event); the first progress of
the new placement that carries its rank 0's first-step time closes it (`first_step`). A
first step from before the decision (the old placement's, reported late) never closes it.
The times are the scheduler's clock and the worker's wall clock: on one machine, or
machines whose clocks agree (NTP), the difference is the cost. Kept in memory only: a
restarted scheduler measures again. Allocators and the simulator read `seconds`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gearshift.scheduler.types import RescaleCost


@dataclass(frozen=True)
class MeasuredRescale:
    """One closed decision: its cost, the job's figures on its path, and where it ran from."""

    seconds: float
    cost: RescaleCost
    in_place: bool
    from_pause: bool = False  # in place, the job paused after the decision: from there


class RescaleCosts:
    """Open decisions and the measured figures (under the scheduler's lock), kept apart
    for the two paths: checkpoint and restart (what the allocators weigh) and in place."""

    def __init__(self) -> None:
        self._open: dict[str, float] = {}  # job -> time of its pending rescale decision
        self._open_in_place: set[str] = set()  # the open decisions applied in place
        self._jobs: dict[str, RescaleCost] = {}
        self._models: dict[str, RescaleCost] = {}
        self._in_place: dict[str, RescaleCost] = {}  # job -> its in-place rescales

    def decided(self, job_id: str, at: float) -> None:
        """The round decided to rescale the job at `at` (a later decision replaces it: the
        cost is that of the placement that runs)."""
        self._open[job_id] = at
        self._open_in_place.discard(job_id)

    def in_place(self, job_id: str) -> None:
        """The job's open decision went in place (round.rescaleInPlace)."""
        if job_id in self._open:
            self._open_in_place.add(job_id)

    def fell_back(self, job_id: str) -> None:
        """The job's processes are gone (requeued) while its decision was open: an in-place
        change they gave up resumes from that step's checkpoint, so the resumed placement's
        first step closes the decision as a restart."""
        self._open_in_place.discard(job_id)

    def first_step(
        self, job_id: str, model_type: str, at: float, *, paused_from: float = 0.0
    ) -> MeasuredRescale | None:
        """The job's new placement finished its first step at `at`: what it cost when that
        closes an open decision, else None. In place, the job trained on until its processes
        paused for the change (`paused_from`, when after the decision): the cost runs from
        there. An in-place figure stays out of the model's prior: a move that cannot go in
        place still restarts."""
        decided = self._open.get(job_id)
        if decided is None or at < decided:
            return None
        del self._open[job_id]
        seconds = at - decided
        none = RescaleCost(0, 0.0, 0.0)
        if job_id in self._open_in_place:
            self._open_in_place.discard(job_id)
            paused = min(paused_from, at)
            seconds = at - max(decided, paused)
            cost = self._in_place[job_id] = self._in_place.get(job_id, none).plus(seconds)
            return MeasuredRescale(seconds, cost, True, from_pause=paused > decided)
        cost = self._jobs[job_id] = self._jobs.get(job_id, none).plus(seconds)
        if model_type:
            self._models[model_type] = self._models.get(model_type, none).plus(seconds)
        return MeasuredRescale(seconds, cost, False)

    def of_job(self, job_id: str) -> RescaleCost | None:
        return self._jobs.get(job_id)

    def of_model(self, model_type: str) -> RescaleCost | None:
        """The prior: every measured rescale of jobs of this model type."""
        return self._models.get(model_type)

    def seconds(self, job_id: str, model_type: str) -> float | None:
        """What a rescale of the job is expected to cost: its own mean, else its model
        type's, else None (nothing measured: the caller's default applies)."""
        cost = self._jobs.get(job_id) or self._models.get(model_type)
        return cost.mean_s if cost is not None else None

    def forget(self, job_id: str) -> None:
        """The job ended: its open decision goes; its figures stay in the model's prior."""
        self._open.pop(job_id, None)
        self._open_in_place.discard(job_id)
        self._jobs.pop(job_id, None)
        self._in_place.pop(job_id, None)
