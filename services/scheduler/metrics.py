"""The scheduler's Prometheus metrics (served with the RPC metrics, see gearshift.common.metrics).

Rounds are counted and timed where they end (`round_finished`); jobs by state,
devices and workers are read when Prometheus scrapes (`watch`), from the same
sources the jobs API answers with, so they cannot drift from what users see.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

import prometheus_client
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gearshift.scheduler.round.why import CODES
from gearshift.v1 import common_pb2, scheduler_pb2

ROUND_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
ROUND_SECONDS = prometheus_client.Histogram(
    "gearshift_scheduler_round_duration_seconds",
    "Seconds a scheduling round took: deciding placements, then stopping and starting tasks",
    buckets=ROUND_BUCKETS,
)
ROUND_PHASE_SECONDS = prometheus_client.Histogram(
    "gearshift_scheduler_round_phase_seconds",
    "Seconds each phase of a round took (gearshift.scheduler.round.rounds: asks, estimates, "
    "gather, snapshot, decide, reconcile, stop, start)",
    ["phase"],
    buckets=ROUND_BUCKETS,
)
RESCALES = prometheus_client.Counter(
    "gearshift_scheduler_rescales",
    "Jobs moved to a new placement (grown, shrunk or moved) by a round",
)
STARTS = prometheus_client.Counter(
    "gearshift_scheduler_job_starts", "Queued jobs given devices by a round"
)
PREEMPTIONS = prometheus_client.Counter(
    "gearshift_scheduler_preemptions", "Running jobs sent back to the queue by a round"
)
PENDING = prometheus_client.Gauge(
    "gearshift_jobs_pending",
    "Queued jobs by the reason the last round gave for their wait (a preempted job's: "
    "preempted, while it waits)",
    ["reason"],
)
LOST_WORKERS = prometheus_client.Counter(
    "gearshift_scheduler_workers_lost", "Workers declared lost (missed heartbeats)"
)


class RoundOutcome(Protocol):
    """What a round reports (gearshift.scheduler.round.rounds.RoundReport)."""

    @property
    def started(self) -> list[str]: ...
    @property
    def rescaled(self) -> list[str]: ...
    @property
    def preempted(self) -> list[str]: ...
    @property
    def lost_workers(self) -> list[str]: ...
    @property
    def phases(self) -> dict[str, float]: ...
    @property
    def pending(self) -> Mapping[str, int]: ...


def round_finished(report: RoundOutcome, seconds: float) -> None:
    """Called once at the end of every round."""
    ROUND_SECONDS.observe(max(seconds, 0.0))
    for phase, took in report.phases.items():
        ROUND_PHASE_SECONDS.labels(phase).observe(max(took, 0.0))
    RESCALES.inc(len(report.rescaled))
    STARTS.inc(len(report.started))
    PREEMPTIONS.inc(len(report.preempted))
    LOST_WORKERS.inc(len(report.lost_workers))
    pending_by_reason(report.pending)


def pending_by_reason(pending: Mapping[str, int]) -> None:
    """Every reason the round knows gets a value, 0 included: a reason no job has any more
    must not keep its last count."""
    for code in sorted(set(CODES) | set(pending)):
        PENDING.labels(code).set(pending.get(code, 0))


def state_name(state: int) -> str:
    return common_pb2.JobState.Name(state).removeprefix("JOB_STATE_").lower()  # type: ignore[arg-type]


def cluster_metrics(
    cluster: scheduler_pb2.ClusterState, job_counts: Mapping[int, int]
) -> list[Metric]:
    """Jobs by state, devices (offered and allocated) by type, workers by status."""
    jobs = GaugeMetricFamily("gearshift_jobs", "Jobs in each state", labels=["state"])
    for state in common_pb2.JobState.values():
        if state != common_pb2.JOB_STATE_UNSPECIFIED:
            jobs.add_metric([state_name(state)], job_counts.get(state, 0))
    offered: Counter[str] = Counter()
    for worker in cluster.workers:
        if worker.alive:
            for group in worker.devices:
                offered[group.accelerator_type] += group.count
    allocated = Counter(
        p.accelerator_type for a in cluster.allocations for p in a.placement.processes
    )
    devices = GaugeMetricFamily(
        "gearshift_devices", "Devices offered by live workers, by type", labels=["type"]
    )
    in_use = GaugeMetricFamily(
        "gearshift_devices_allocated", "Devices running a job's process, by type", labels=["type"]
    )
    for kind in sorted(offered | allocated):
        devices.add_metric([kind], offered[kind])
        in_use.add_metric([kind], allocated[kind])
    workers = GaugeMetricFamily("gearshift_workers", "Registered workers", labels=["status"])
    alive = sum(w.alive for w in cluster.workers)
    workers.add_metric(["alive"], alive)
    workers.add_metric(["lost"], len(cluster.workers) - alive)
    rounds = GaugeMetricFamily("gearshift_scheduler_round", "Number of the current round")
    rounds.add_metric([], cluster.round)
    return [jobs, devices, in_use, workers, rounds]


class _ClusterCollector(Collector):
    """Reads the scheduler's state at scrape time (nothing until `watch` is called)."""

    def __init__(self) -> None:
        self.source: (
            tuple[Callable[[], scheduler_pb2.ClusterState], Callable[[], Mapping[int, int]]] | None
        ) = None

    def collect(self) -> Iterator[Metric]:
        if self.source is None:
            return
        cluster, job_counts = self.source
        yield from cluster_metrics(cluster(), job_counts())

    def describe(self) -> Iterator[Metric]:
        """The families without values: the registry checks their names against the other
        metrics', and docs/reference/metrics.md lists them, before any scrape."""
        yield from cluster_metrics(scheduler_pb2.ClusterState(), {})


_COLLECTOR = _ClusterCollector()
prometheus_client.REGISTRY.register(_COLLECTOR)


def watch(
    cluster: Callable[[], scheduler_pb2.ClusterState], job_counts: Callable[[], Mapping[int, int]]
) -> None:
    """Serve the scheduler's state from these (Scheduler.cluster_state, Store.job_counts)."""
    _COLLECTOR.source = (cluster, job_counts)
