"""Throughput estimates the round reasons with: measured first, then the Brain's, then 1.0.

Units are mini-batches per second (one EST's step), as in the pipeline's snapshot.

- Measured: as Gavel keeps a moving average of what jobs report, every progress
  of a job running on a known placement (as its worker's heartbeat carries it, when
  it advances the job) updates an exponentially weighted
  average of its rate in that device configuration, and - from a one-type
  configuration - the capability of that type: one EST's mini-batches/s on one
  device = (ESTs on its busiest device) x steps/s. The EST planner and the
  policies then work from what the job really does; types the job has not run on
  keep the estimate's speed relative to the measured ones.
- The Brain (EstimateThroughput), per job and type, for one device and for the
  job's max_devices: fetched outside the scheduler's lock, and again every
  `refresh_seconds`, so that what the Brain learns reaches jobs already running.
- Otherwise 1.0 global step/s per device.
- Restart cost: from the stop of a job's tasks to the first progress of its next
  placement, averaged the same way (the default until one is measured).
- Collocated runs are kept apart from solo ones: a job sharing its devices (Gavel's
  space sharing) measures its pair rate with that partner, which the packed
  policies read (before a measurement: `pair_prior` times its solo rate); a
  foreground job measures its rate with a background job beside it, against its
  solo rate its slowdown; a background job's rate says nothing of its solo speed.
- DeepPool (with `burst_amp_limit`): the Brain's burst-parallel plan over the job's
  layer profile, when it holds one - the share of its devices' time it leaves idle
  and the devices an elastic job should ask for.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gearshift.common.profiles import profile_key
from gearshift.scheduler.round.brain import DEFAULT_THROUGHPUT, BrainAdvisor
from gearshift.scheduler.round.placement import count_by_type, placement_devices
from gearshift.scheduler.state.records import JobRecord
from gearshift.scheduler.types import Config, config_of
from gearshift.v1 import common_pb2


@dataclass(frozen=True)
class EstimateRequest:
    """What to ask the Brain about one job."""

    job_id: str
    model_type: str
    max_devices: int
    spec: common_pb2.JobSpec | None = None  # for its layer profile's keys (DeepPool)


@dataclass(frozen=True)
class BurstFacts:
    """What the job's burst-parallel plan says for scheduling."""

    idle_fraction: float  # of the devices it holds, per iteration
    elastic_devices: int  # the fewest devices as fast as its best plan


DEFAULT_PAIR_PRIOR = 0.6
BURST_RETRY_SECONDS = 5.0  # a job without a layer profile may get one (its rank 0 profiles)


def _blend(old: float | None, new: float, alpha: float) -> float:
    return new if old is None else (1 - alpha) * old + alpha * new


class Estimates:
    """Per-job rates: measured, the Brain's, or the default; thread-safe."""

    def __init__(
        self,
        brain: BrainAdvisor,
        *,
        refresh_seconds: float = 60.0,
        alpha: float = 0.3,
        default_restart_seconds: float = 10.0,
        default_in_place_seconds: float = 1.0,
        burst_amp_limit: float = 0.0,
        pair_prior: float = DEFAULT_PAIR_PRIOR,
    ) -> None:
        self.brain = brain
        self.burst_amp_limit = burst_amp_limit
        self.pair_prior = pair_prior
        self.refresh_seconds = refresh_seconds
        self.alpha = alpha
        self.default_restart_seconds = default_restart_seconds
        self.default_in_place_seconds = default_in_place_seconds
        self._lock = threading.Lock()
        self._config_rate: dict[str, dict[Config, float]] = {}
        self._capability: dict[str, dict[str, float]] = {}
        self._single: dict[str, dict[str, float]] = {}  # Brain: global steps/s, one device
        self._full: dict[str, dict[str, float]] = {}  # Brain: global steps/s, max devices
        self._fetched: dict[str, tuple[float, tuple[str, ...]]] = {}
        self._restart: dict[str, float] = {}
        self._in_place: dict[str, float] = {}  # job -> its rescales in place, blended
        self._stopped_at: dict[str, float] = {}
        self._generation: dict[str, int] = {}
        self._version: dict[str, int] = {}  # bumped on every change of a job's rates
        self._pair_rate: dict[str, dict[tuple[str, str], float]] = {}  # (partner, type)
        self._fg_rate: dict[str, dict[Config, float]] = {}  # with a background beside it
        self._burst: dict[str, BurstFacts] = {}

    # Measurements --------------------------------------------------------------------
    def observe(
        self, job: JobRecord, generation: int, progress: common_pb2.JobProgress, now: float
    ) -> None:
        """A progress of a job running on job.placement (gearshift.scheduler.api.registry)."""
        spec = job.spec
        with self._lock:
            if self._generation.get(job.job_id) != generation:
                self._generation[job.job_id] = generation
                stopped = self._stopped_at.pop(job.job_id, None)
                if stopped is not None and now > stopped:
                    old = self._restart.get(job.job_id)
                    self._restart[job.job_id] = _blend(old, now - stopped, self.alpha)
            if progress.samples_per_second <= 0 or spec.global_batch_size <= 0:
                return
            steps = progress.samples_per_second / spec.global_batch_size
            self._bump(job.job_id)
            config = config_of(count_by_type(placement_devices(job.placement)))
            role = job.collocation.role
            if role == common_pb2.COLLOCATION_ROLE_BACKGROUND:
                return
            if role == common_pb2.COLLOCATION_ROLE_SHARED and len(config) == 1:
                pairs = self._pair_rate.setdefault(job.job_id, {})
                key = (job.collocation.partner_job_id, config[0][0])
                pairs[key] = _blend(pairs.get(key), steps * spec.num_ests, self.alpha)
                return
            if role == common_pb2.COLLOCATION_ROLE_FOREGROUND:
                beside = self._fg_rate.setdefault(job.job_id, {})
                beside[config] = _blend(beside.get(config), steps * spec.num_ests, self.alpha)
                return
            rates = self._config_rate.setdefault(job.job_id, {})
            rates[config] = _blend(rates.get(config), steps * spec.num_ests, self.alpha)
            if len(config) == 1:
                busiest = max(len(p.est_ids) for p in job.placement.processes)
                kind = config[0][0]
                capability = self._capability.setdefault(job.job_id, {})
                capability[kind] = _blend(capability.get(kind), busiest * steps, self.alpha)

    def _bump(self, job_id: str) -> None:
        self._version[job_id] = self._version.get(job_id, 0) + 1

    def stopping(self, job_id: str, now: float) -> None:
        """The job's tasks are being stopped to move it: its restart clock starts."""
        with self._lock:
            self._stopped_at[job_id] = now

    def measured_restart(self, job_id: str, seconds: float) -> None:
        """A rescale's cost as the job's first step dates it (state/rescale_costs.py): it
        replaces the coarser measure to the first heartbeat that the restart clock would
        take for this move, blended into the job's restart seconds like it."""
        with self._lock:
            self._stopped_at.pop(job_id, None)
            self._restart[job_id] = _blend(self._restart.get(job_id), seconds, self.alpha)
            self._bump(job_id)

    def measured_in_place(self, job_id: str, seconds: float) -> None:
        """A rescale in place, decision to first step: blended into what the job's resizes
        that keep its devices are expected to cost (JobSnapshot.resize_seconds)."""
        with self._lock:
            self._in_place[job_id] = _blend(self._in_place.get(job_id), seconds, self.alpha)
            self._bump(job_id)

    def in_place_seconds(self, job_id: str) -> float:
        with self._lock:
            return self._in_place.get(job_id, self.default_in_place_seconds)

    def restart_seconds(self, job_id: str) -> float:
        with self._lock:
            return self._restart.get(job_id, self.default_restart_seconds)

    def marks(self, job_ids: Iterable[str]) -> dict[str, tuple[int, float]]:
        """Each job's (version, restart_seconds) under one hold of the lock: a round reads
        every job's to know which snapshots it may keep (two holds a job were 6 ms of a
        round at 7,000 jobs)."""
        default = self.default_restart_seconds
        with self._lock:
            version, restart = self._version, self._restart
            return {j: (version.get(j, 0), restart.get(j, default)) for j in job_ids}

    def forget(self, job_id: str) -> None:
        with self._lock:
            for table in (
                self._config_rate,
                self._capability,
                self._single,
                self._full,
                self._fetched,
                self._restart,
                self._in_place,
                self._stopped_at,
                self._generation,
                self._version,
                self._pair_rate,
                self._fg_rate,
                self._burst,
            ):
                table.pop(job_id, None)

    # The Brain -------------------------------------------------------------------------
    def due(
        self, requests: Sequence[EstimateRequest], types: Sequence[str], now: float
    ) -> list[EstimateRequest]:
        """The jobs whose Brain estimates are missing, stale, or lack a type."""
        if not self.brain.address:
            return []
        wanted = tuple(sorted(types))
        with self._lock:
            return [
                r
                for r in requests
                if (got := self._fetched.get(r.job_id)) is None
                or now - got[0] >= self.refresh_seconds
                or not set(wanted) <= set(got[1])
                or (
                    self.burst_amp_limit > 0
                    and r.job_id not in self._burst
                    and now - got[0] >= BURST_RETRY_SECONDS
                )
            ]

    def refresh(
        self, requests: Sequence[EstimateRequest], types: Sequence[str], now: float
    ) -> None:
        """Ask the Brain (call outside the scheduler's lock: each is an RPC)."""
        for request in requests:
            single: dict[str, float] = {}
            full: dict[str, float] = {}
            for kind in types:
                single[kind] = self.brain.throughput(request.job_id, request.model_type, kind, 1)
                full[kind] = (
                    self.brain.throughput(
                        request.job_id, request.model_type, kind, request.max_devices
                    )
                    if request.max_devices > 1
                    else single[kind]
                )
            burst = self._burst_facts(request, types)
            with self._lock:
                if burst is not None:
                    self._burst[request.job_id] = burst
                self._single[request.job_id] = single
                self._full[request.job_id] = full
                self._fetched[request.job_id] = (now, tuple(sorted(types)))
                self._bump(request.job_id)

    def _burst_facts(self, request: EstimateRequest, types: Sequence[str]) -> BurstFacts | None:
        """The plan over the job's profile, measured on the cluster's kind of device first."""
        spec = request.spec
        if self.burst_amp_limit <= 0 or spec is None:
            return None
        devices = ["cpu", "cuda"] if all(t == "cpu" for t in types) else ["cuda", "cpu"]
        plan = self.brain.burst_plan(
            [profile_key(spec, d) for d in devices],
            global_batch=spec.global_batch_size,
            max_devices=request.max_devices,
            amp_limit=self.burst_amp_limit,
        )
        if plan is None:
            return None
        idle = idle_fraction(plan.iteration_seconds, plan.device_seconds, plan.peak_devices)
        return BurstFacts(idle, max(plan.elastic_devices, 1))

    # What the round reads ------------------------------------------------------------------
    def burst(self, job_id: str) -> BurstFacts | None:
        with self._lock:
            return self._burst.get(job_id)

    def collocated_slowdown(self, job_id: str) -> float:
        """How much slower the job ran with a background job beside it than alone, in the
        configurations it ran both ways (0: not measured)."""
        with self._lock:
            beside = self._fg_rate.get(job_id, {})
            alone = self._config_rate.get(job_id, {})
            ratios = [beside[c] / alone[c] for c in beside if alone.get(c, 0.0) > 0]
        return max(0.0, 1.0 - sum(ratios) / len(ratios)) if ratios else 0.0

    def pair_rates(
        self, job: JobRecord, partners: Sequence[str], solo: Mapping[str, float]
    ) -> dict[tuple[str, str], float]:
        """The job's mini-batches/s sharing its devices with each partner, per type: measured,
        else `pair_prior` times its solo rate there (Gavel's colocated throughputs)."""
        with self._lock:
            measured = dict(self._pair_rate.get(job.job_id, {}))
        return {
            (p, t): measured.get((p, t), self.pair_prior * rate)
            for p in partners
            for t, rate in solo.items()
            if rate > 0
        }

    def capability(self, job: JobRecord, types: Sequence[str]) -> dict[str, float]:
        """One EST's mini-batches/s on one device of each type: measured where the job ran
        alone on that type; elsewhere the Brain's (or the default) estimate, scaled by how
        the job's measurements compare with the estimates of the types it ran on - the
        estimate keeps its word on which type is faster, the measurement on how fast."""
        n = job.spec.num_ests
        with self._lock:
            measured = self._capability.get(job.job_id, {})
            brain = self._single.get(job.job_id, {})
        prior = {t: brain.get(t, DEFAULT_THROUGHPUT) * n for t in {*types, *measured}}
        ratios = [measured[t] / prior[t] for t in measured if prior[t] > 0]
        scale = sum(ratios) / len(ratios) if ratios else 1.0
        return {t: measured[t] if t in measured else prior[t] * scale for t in types}

    def throughputs(
        self, job: JobRecord, types: Sequence[str], max_devices: int
    ) -> dict[str, float]:
        """Mini-batches/s on max_devices devices of each type (a rigid job's view)."""
        n = job.spec.num_ests
        with self._lock:
            measured = self._config_rate.get(job.job_id, {})
            brain = self._full.get(job.job_id, {})
            out: dict[str, float] = {}
            for t in types:
                config: Config = ((t, max_devices),)
                if config in measured:
                    out[t] = measured[config]
                elif t in brain:
                    out[t] = brain[t] * n
                else:
                    out[t] = DEFAULT_THROUGHPUT * n * max_devices
            return out

    def measured(self, job_id: str) -> Mapping[Config, float]:
        with self._lock:
            return dict(self._config_rate.get(job_id, {}))


def idle_fraction(iteration_seconds: float, device_seconds: float, peak_devices: int) -> float:
    """The share of a burst-parallel job's device time left idle: it holds `peak_devices`
    for an iteration, and its layers use `device_seconds` of them."""
    held = iteration_seconds * peak_devices
    if held <= 0:
        return 0.0
    return min(max(1.0 - device_seconds / held, 0.0), 1.0)
