"""The daemon and `gearshift simulate` run one pipeline: one small trace driven through the
scheduler as the daemon wires it (Scheduler with its rounds, registry, estimates and task
control; an in-memory store; simulated workers; a manual clock) and through the simulator
gives the same allocations, round by round."""

from __future__ import annotations

import pytest

from gearshift.common.gavel import JobKey, ThroughputTable
from gearshift.scheduler.api import jobs_api
from gearshift.scheduler.plugins.allocators import make_allocator
from gearshift.scheduler.round.placement import count_by_type
from gearshift.scheduler.round.rounds import RoundReport
from gearshift.scheduler.service import SchedulerSettings
from gearshift.scheduler.sim.simulator import simulate_pipeline
from gearshift.scheduler.sim.trace import TraceJob
from gearshift.scheduler.types import Config, config_of
from gearshift.v1 import common_pb2
from tests.sched_harness import Clock, TableBrain, make_scheduler

ROUND = 360.0
START = 1000.0
CLUSTER = {"v100": 2, "k80": 4}
# Job types with linear scaling (so the daemon's default efficiency of 1 is the truth):
# (1-device throughput on v100, on k80), steps per second.
SPEEDS = {"fast": (4.0, 1.0), "even": (1.0, 1.0), "k80ish": (1.0, 2.0)}
# (job type, scale factor = ESTs, arrival round); long jobs, so none ends in the window.
WORKLOAD = [("fast", 2, 0), ("even", 4, 0), ("k80ish", 1, 1), ("fast", 4, 2), ("even", 1, 2)]
ROUNDS = 6


def table() -> ThroughputTable:
    isolated: dict[str, dict[JobKey, float]] = {"v100": {}, "k80": {}}
    for name, (v100, k80) in SPEEDS.items():
        for scale in (1, 2, 4):
            isolated["v100"][JobKey(name, scale)] = v100 * scale
            isolated["k80"][JobKey(name, scale)] = k80 * scale
    return ThroughputTable(isolated, {"v100": {}, "k80": {}})


def arrival(round_number: int) -> float:
    return START + round_number * ROUND


def trace() -> list[TraceJob]:
    return [TraceJob(name, 10**9 * scale, scale, arrival(r)) for name, scale, r in WORKLOAD]


def spec(name: str, scale: int) -> common_pb2.JobSpec:
    return common_pb2.JobSpec(
        name=name,
        entrypoint=common_pb2.Entrypoint(module="gearshift.examples.mlp"),
        model_type=name,
        num_ests=scale,
        global_batch_size=8 * scale,
        total_steps=10**9,
        dataset=common_pb2.DatasetSpec(name="d", size=100, shard_size=10),
        determinism=common_pb2.DETERMINISM_LEVEL_D1,
        elastic=common_pb2.ElasticBounds(min_devices=1, max_devices=scale),
    )


def simulated(policy: str, elastic: bool) -> list[dict[str, Config]]:
    rounds: list[dict[str, Config]] = []

    def seen(now: float, configs: dict[str, Config]) -> None:
        if len(rounds) < ROUNDS:
            rounds.append(configs)

    allocator = make_allocator(policy, elastic=elastic, round_seconds=ROUND, seed=0)
    simulate_pipeline(
        trace(),
        CLUSTER,
        table(),
        allocator,
        round_seconds=ROUND,
        rescale_seconds=10.0,
        elastic=elastic,
        determinism="D1",
        on_round=seen,
        max_rounds=ROUNDS,
    )
    return rounds


def daemon(policy: str, elastic: bool, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Config]]:
    # Jobs that arrive together are taken in arrival order by both; the daemon breaks
    # ties by job id, so ids count up here.
    counter = iter(range(1, 1000))
    monkeypatch.setattr(jobs_api, "new_job_id", lambda: f"job-{next(counter):012d}")
    clock = Clock(START)
    ids: dict[str, tuple[str, int]] = {}
    settings = SchedulerSettings(
        policy=policy,
        elastic=elastic,
        round_seconds=ROUND,
        heartbeat_timeout=1e9,
        restart_seconds=10.0,
    )

    def estimate(job_id: str, worker_type: str, count: int) -> float:
        name, ests = ids[job_id]  # global steps/s: mini-batches/s over N ESTs
        return SPEEDS[name][0 if worker_type == "v100" else 1] * count / ests

    scheduler, _ = make_scheduler(
        settings,
        clock=clock,
        brain=TableBrain(estimate),
        allocator=make_allocator(policy, elastic=elastic, round_seconds=ROUND, seed=0),
    )
    for kind, count in sorted(CLUSTER.items()):
        for i in range(count):  # one device per worker, named as the simulator names them
            scheduler.register_worker(
                f"{kind}-{i}",
                f"127.0.0.1:{1 + len(ids) + i}",
                "sim",
                [common_pb2.DeviceGroup(accelerator_type=kind, count=1)],
                [],
            )
    order: list[str] = []
    rounds: list[dict[str, Config]] = []
    try:
        for number in range(ROUNDS):
            clock.now = arrival(number)
            for name, scale, at in WORKLOAD:
                if at == number:
                    job, _ = scheduler.submit(spec(name, scale), "")
                    ids[job.job_id] = (name, scale)
                    order.append(job.job_id)
            report: RoundReport = scheduler.run_round()
            index = {job_id: str(i) for i, job_id in enumerate(order)}
            rounds.append(
                {
                    index[j]: config_of(count_by_type(d for d, _ in a))
                    for j, a in report.desired.items()
                    if a
                }
            )
    finally:
        scheduler.stop()
    return rounds


@pytest.mark.parametrize(
    ("policy", "elastic"), [("las", True), ("las", False), ("easyscale", True)]
)
def test_the_daemons_wiring_and_the_simulator_allocate_alike(
    policy: str, elastic: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = simulated(policy, elastic)
    live = daemon(policy, elastic, monkeypatch)
    assert len(sim) == len(live) == ROUNDS
    for number, (a, b) in enumerate(zip(sim, live, strict=True)):
        assert a == b, f"round {number}: simulator {a} != daemon {b}"
    # The window is not trivial: jobs share the cluster and allocations change.
    assert any(len(r) >= 2 for r in sim)
    assert len({tuple(sorted(r.items())) for r in sim}) >= 3
