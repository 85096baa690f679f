"""The Brain's Prometheus metrics (served with the RPC metrics, see gearshift.common.metrics)."""

from __future__ import annotations

import prometheus_client

SAMPLES = prometheus_client.Counter(
    "gearshift_brain_samples_ingested",
    "Runtime samples committed (a repeated batch adds none): rate() is the ingest rate",
)
BATCHES = prometheus_client.Counter(
    "gearshift_brain_sample_batches",
    "Sample batches received, by outcome (committed, or repeated: a retry already recorded)",
    ["outcome"],
)
EVENTS = prometheus_client.Counter(
    "gearshift_brain_job_events", "Job lifecycle events recorded (a repeated one adds none)"
)
ESTIMATES = prometheus_client.Counter(
    "gearshift_brain_estimates",
    "Throughput estimates answered, by where they came from",
    ["source"],
)


def samples_ingested(count: int) -> None:
    """A batch was received; `count` samples of it were committed (0: a repeat)."""
    SAMPLES.inc(count)
    BATCHES.labels("committed" if count else "repeated").inc()


def event_recorded(new: bool) -> None:
    if new:
        EVENTS.inc()


def estimate_answered(source: str) -> None:
    ESTIMATES.labels(source).inc()
