"""Each rescale's cost, decision to the new placement's first step, measured per job (and per
model type, the prior of jobs not yet rescaled), shown in the Job message and the CLI."""

from __future__ import annotations

import pytest

from gearshift.client.render import job_details
from gearshift.scheduler.api.servicer import job_message
from gearshift.scheduler.service import Scheduler, SchedulerSettings
from gearshift.scheduler.state.rescale_costs import MeasuredRescale, RescaleCosts
from gearshift.scheduler.types import RescaleCost
from gearshift.v1 import common_pb2, scheduler_pb2
from tests.sched_harness import Clock, job_spec, make_scheduler, register

C = common_pb2
S = scheduler_pb2


def beat(scheduler: Scheduler, job_id: str, **progress: float) -> None:
    """Each open task of the job reports, through its worker's heartbeat."""
    for task in scheduler.state.open_tasks(job_id):
        status = C.TaskStatus(
            task_id=task.task_id,
            job_id=job_id,
            state=C.TASK_STATE_RUNNING,
            progress=C.JobProgress(total_steps=1000, **progress),  # type: ignore[arg-type]
        )
        assert not scheduler.heartbeat(task.worker_id, [status])


def test_a_rescale_s_cost_is_measured_from_the_decision_to_the_first_step() -> None:
    clock = Clock()
    settings = SchedulerSettings(
        policy="easyscale", round_seconds=60.0, heartbeat_interval=1.0, heartbeat_timeout=60.0
    )
    scheduler, _ = make_scheduler(settings, clock=clock)
    try:
        register(scheduler, "a", {"t4": 1})
        job, _ = scheduler.submit(job_spec("cnn", 2), "")
        scheduler.run_round()
        beat(scheduler, job.job_id, step=5, first_step_at=clock.now + 0.5)
        assert scheduler.get(job.job_id).rescale_cost is None  # a first start is no rescale

        clock.now += 10.0
        register(scheduler, "b", {"t4": 1})
        decided = clock.now
        scheduler.run_round()  # grows onto b: RESCALING, then RESCALED
        record = scheduler.get(job.job_id)
        assert (record.rescale_count, len(record.placement.processes)) == (1, 2)
        clock.now += 3.0
        assert record.rescale_cost is None
        beat(scheduler, job.job_id, step=7, first_step_at=decided + 1.25)
        beat(scheduler, job.job_id, step=9, first_step_at=decided + 1.25)  # closed: once
        assert scheduler.get(job.job_id).rescale_cost == RescaleCost(1, 1.25, 1.25)
        costs = scheduler.state.rescale_costs
        assert costs.seconds(job.job_id, "cnn") == 1.25
        assert costs.seconds("job-other", "cnn") == 1.25  # the model's prior
        assert costs.seconds("job-other", "lm") is None
        assert scheduler.estimates.restart_seconds(job.job_id) == 1.25  # what rounds weigh
        said = [
            e.message
            for e in scheduler.state.store.events_after(job.job_id, 0)
            if e.message.startswith("rescale cost")
        ]
        assert said == [
            "rescale cost 1.25 s from the decision to the first step (mean 1.25 s over 1)"
        ]
        message = job_message(record)
        assert (message.rescale_cost.count, message.rescale_cost.mean_seconds) == (1, 1.25)
        assert "rescale     1.25 s last, 1.25 s mean over 1" in job_details(message)
    finally:
        scheduler.stop()


def test_the_book_keeps_per_job_means_and_the_model_prior_after_the_job_ends() -> None:
    costs = RescaleCosts()
    costs.decided("j1", 100.0)
    assert costs.first_step("j1", "cnn", 99.0) is None  # before the decision
    assert costs.first_step("j1", "cnn", 101.0) == MeasuredRescale(
        1.0, RescaleCost(1, 1.0, 1.0), False
    )
    assert costs.first_step("j1", "cnn", 102.0) is None  # no decision open
    costs.decided("j1", 200.0)
    costs.decided("j1", 201.0)  # decided again before it ran: the later one counts
    assert costs.first_step("j1", "cnn", 204.0) == MeasuredRescale(
        3.0, RescaleCost(2, 3.0, 2.0), False
    )
    # In place: the job's own figure on that path, out of the model's prior.
    costs.decided("j1", 300.0)
    costs.in_place("j1")
    assert costs.first_step("j1", "cnn", 300.5) == MeasuredRescale(
        0.5, RescaleCost(1, 0.5, 0.5), True
    )
    assert costs.of_model("cnn") == RescaleCost(2, 3.0, 2.0)
    costs.decided("j1", 400.0)  # a new decision is a restart until it goes in place
    assert costs.first_step("j1", "cnn", 401.0) == MeasuredRescale(
        1.0, RescaleCost(3, 1.0, 5 / 3), False
    )
    # In place, given up (the job requeued, resumed from the checkpoint): a restart's cost.
    costs.decided("j1", 500.0)
    costs.in_place("j1")
    costs.fell_back("j1")
    assert costs.first_step("j1", "cnn", 503.0) == MeasuredRescale(
        3.0, RescaleCost(4, 3.0, 2.0), False
    )
    assert costs.of_job("j1") == RescaleCost(4, 3.0, 2.0)
    costs.forget("j1")
    assert costs.of_job("j1") is None
    assert costs.of_model("cnn") == RescaleCost(4, 3.0, 2.0)
    assert costs.seconds("j2", "cnn") == 2.0


def test_in_place_the_cost_runs_from_when_the_job_paused_for_the_change() -> None:
    """The job trained on while its joiners started: only the pause counts. A pause from
    before the decision (an earlier change's) counts from the decision."""
    costs = RescaleCosts()
    costs.decided("j1", 100.0)
    costs.in_place("j1")
    measured = costs.first_step("j1", "cnn", 100.9, paused_from=100.8)
    assert measured is not None
    assert (measured.in_place, measured.from_pause) == (True, True)
    assert measured.seconds == pytest.approx(0.1)
    assert measured.cost.mean_s == pytest.approx(0.1)
    costs.decided("j1", 200.0)
    costs.in_place("j1")
    earlier = costs.first_step("j1", "cnn", 200.5, paused_from=100.8)
    assert earlier is not None and (earlier.seconds, earlier.from_pause) == (0.5, False)
    costs.decided("j1", 300.0)  # a restart: the pause says nothing about it
    restart = costs.first_step("j1", "cnn", 302.0, paused_from=301.5)
    assert restart is not None and (restart.seconds, restart.from_pause) == (2.0, False)
