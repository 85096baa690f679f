"""The collocate stage (DeepPool's multiplexing) and space sharing on the daemon's wiring: who
lends, who is lent to, where the background job lands, what its worker is told, what the job
shows, and how its pauses become events; pair rates for the packed policies; the planner's
device count for an elastic job (issue 20, points 4-6)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gearshift.common.gavel import JobKey, ThroughputTable
from gearshift.scheduler.api.servicer import job_message
from gearshift.scheduler.plugins.allocators import make_allocator
from gearshift.scheduler.plugins.deeppool.collocation import Multiplexing
from gearshift.scheduler.round.brain import BrainAdvisor
from gearshift.scheduler.round.estimates import Estimates, idle_fraction
from gearshift.scheduler.round.placement import place
from gearshift.scheduler.service import Scheduler, SchedulerSettings
from gearshift.scheduler.sim.simulator import Multiplexed, simulate_pipeline
from gearshift.scheduler.sim.trace import TraceJob
from gearshift.scheduler.types import Device, JobSnapshot, Snapshot, Target
from gearshift.v1 import brain_pb2, common_pb2, scheduler_pb2
from tests.sched_harness import Clock, job_spec, make_scheduler, register

C = common_pb2
S = scheduler_pb2


def snap(job_id: str, **fields: object) -> JobSnapshot:
    base: dict[str, object] = {
        "job_id": job_id,
        "num_ests": 1,
        "min_devices": 1,
        "max_devices": 1,
        "types": ("cpu",),
        "capability": {"cpu": 1.0},
        "throughputs": {"cpu": 1.0},
        "steps_remaining": 100.0,
        "arrival_time": 0.0,
    }
    base.update(fields)
    return JobSnapshot(**base)  # type: ignore[arg-type]


def target(job_id: str, count: int, kind: str = "cpu") -> Target:
    return Target(job_id, ((kind, count),), {kind: (1,) * count})


DEVICES = tuple(Device("w", i, "cpu") for i in range(4))


def test_idle_fraction_of_a_plan() -> None:
    assert idle_fraction(1.0, 2.0, 4) == pytest.approx(0.5)
    assert idle_fraction(1.0, 4.0, 4) == 0.0
    assert idle_fraction(0.0, 0.0, 1) == 0.0  # a plan of no time idles nothing


def test_the_most_idle_lender_takes_the_first_waiting_background_job() -> None:
    jobs = (
        snap("busy", max_devices=2, idle_fraction=0.05),
        snap("idle", max_devices=2, idle_fraction=0.4),
        snap("idler", max_devices=2, idle_fraction=0.6, collocated_slowdown=0.5),  # too slow
        snap("bg1", background=True),
        snap("bg2", background=True),
        snap("gpu-only", background=True, types=("gpu",)),
    )
    targets = {j: target(j, 2) for j in ("busy", "idle", "idler")}
    out = Multiplexing(min_idle=0.1, max_slowdown=0.2).collocate(
        Snapshot(0.0, DEVICES, jobs), targets
    )
    assert out["idle"].role == "foreground" and out["idle"].partners == ("bg1",)
    assert out["bg1"] == Target("bg1", (("cpu", 1),), {"cpu": (1,)}, ("idle",), "background")
    assert "bg2" not in out and "gpu-only" not in out  # one background per foreground
    assert out["busy"] == targets["busy"] and out["idler"] == targets["idler"]


@pytest.mark.parametrize("running", [True, False])
def test_a_background_job_keeps_its_lender_when_an_idler_one_comes(running: bool) -> None:
    """bg1 runs beside "idle"; "idler" starts lending and bg2 waits. bg1 stays where it is
    (another lender runs it no faster, a move costs it a restart) and bg2 takes "idler".
    Without the pairing in the snapshot the first guest takes the idlest lender: both move."""
    bg1 = (
        snap("bg1", background=True, current=(("cpu", 1),), partners=("idle",))
        if running
        else snap("bg1", background=True)
    )
    jobs = (
        snap("idle", max_devices=2, idle_fraction=0.4),
        snap("idler", max_devices=2, idle_fraction=0.6),
        bg1,
        snap("bg2", background=True),
    )
    targets = {j: target(j, 2) for j in ("idle", "idler")}
    out = Multiplexing().collocate(Snapshot(0.0, DEVICES, jobs), targets)
    first, second = ("idle", "idler") if running else ("idler", "idle")
    assert out["bg1"].partners == (first,) and out[first].partners == ("bg1",)
    assert out["bg2"].partners == (second,) and out[second].partners == ("bg2",)


def test_a_background_job_moves_when_its_lender_stops_lending() -> None:
    jobs = (
        snap("slowed", max_devices=2, idle_fraction=0.4, collocated_slowdown=0.5),
        snap("idle", max_devices=2, idle_fraction=0.3),
        snap("bg", background=True, current=(("cpu", 1),), partners=("slowed",)),
    )
    targets = {j: target(j, 2) for j in ("slowed", "idle")}
    out = Multiplexing().collocate(Snapshot(0.0, DEVICES, jobs), targets)
    assert out["bg"].partners == ("idle",)


def test_a_background_job_the_allocator_placed_is_not_lent_to() -> None:
    jobs = (snap("fg", max_devices=2, idle_fraction=0.5), snap("bg", background=True))
    targets = {"fg": target("fg", 2), "bg": target("bg", 1)}
    out = Multiplexing().collocate(Snapshot(0.0, DEVICES, jobs), targets)
    assert out == targets


def test_a_background_job_lands_on_its_foregrounds_rank_0_device_and_follows_it() -> None:
    fg = Target("fg", (("cpu", 2),), {"cpu": (1, 1)}, ("bg",), "foreground")
    bg = Target("bg", (("cpu", 1),), {"cpu": (1,)}, ("fg",), "background")
    other = target("other", 1)
    held = {"fg": [(DEVICES[2], 1), (DEVICES[3], 1)], "bg": [(DEVICES[2], 1)]}
    out = place({"fg": fg, "bg": bg}, DEVICES, held)
    assert out["bg"] == [(DEVICES[2], 1)] and out["fg"] == held["fg"]
    # The foreground moves (devices 2 and 3 are gone): the background goes with it, though
    # its old device would still be free.
    moved = place({"fg": fg, "bg": bg, "other": other}, DEVICES[:3], held)
    assert [d for d, _ in moved["bg"]] == [moved["fg"][0][0]]
    # The foreground does not fit: the background takes no device of its own.
    assert place({"fg": fg, "bg": bg}, DEVICES[:1], {}) == {}


class PlanningBrain(BrainAdvisor):
    """A Brain whose burst-parallel plan of every profiled job leaves half its devices idle
    and asks for `elastic` devices."""

    def __init__(self, elastic: int = 2, profiled: Sequence[str] = ()) -> None:
        super().__init__("planning")
        self.elastic = elastic
        self.asked: list[tuple[str, ...]] = []

    def throughput(self, job_id: str, model_type: str, worker_type: str, count: int) -> float:
        return 1.0 * count

    def burst_plan(
        self, keys: Sequence[str], *, global_batch: int, max_devices: int, amp_limit: float
    ) -> brain_pb2.BurstParallelPlan | None:
        self.asked.append(tuple(keys))
        return brain_pb2.BurstParallelPlan(
            iteration_seconds=1.0,
            device_seconds=max_devices * 0.5,
            peak_devices=max_devices,
            elastic_devices=self.elastic,
        )

    def report_event(self, *args: object, **kwargs: object) -> None:
        return None


def deeppool(policy: str = "fifo_strict") -> SchedulerSettings:
    return SchedulerSettings(
        policy=policy,
        round_seconds=60.0,
        heartbeat_interval=1.0,
        heartbeat_timeout=5.0,
        collocation="deeppool",
        max_foreground_slowdown=0.15,
    )


def events(scheduler: Scheduler, job_id: str) -> list[tuple[int, str]]:
    return [(e.type, e.message) for e in scheduler.state.store.events_after(job_id, 0)]


def test_the_daemon_starts_a_background_job_on_a_lent_device_and_records_its_pauses() -> None:
    clock = Clock()
    scheduler, agents = make_scheduler(deeppool(), clock=clock, brain=PlanningBrain())
    try:
        register(scheduler, "w", {"cpu": 2})
        fg, _ = scheduler.submit(job_spec("fg", 2), "")
        clock.now += 1.0  # FIFO: arrival order
        bg, _ = scheduler.submit(job_spec("bg", 1), "")
        clock.now += 1.0
        scheduler.submit(job_spec("g", 1, service_class=C.SERVICE_CLASS_GUARANTEED), "")
        scheduler.run_round()
        started = {r.job_id: r for r in agents.started}
        assert set(started) == {fg.job_id, bg.job_id}  # the guaranteed job is no background
        lent = started[bg.job_id]
        assert lent.collocation == C.Collocation(
            role=C.COLLOCATION_ROLE_BACKGROUND,
            partner_job_id=fg.job_id,
            max_foreground_slowdown=0.15,
        )
        assert not started[fg.job_id].profile_first  # the Brain has its profile
        rank0 = started[fg.job_id].placement.processes[0]
        assert [p.device_index for p in lent.placement.processes] == [rank0.device_index]
        shown = job_message(scheduler.get(fg.job_id)).collocation
        assert shown.role == C.COLLOCATION_ROLE_FOREGROUND and shown.partner_job_id == bg.job_id
        started_msg = [m for k, m in events(scheduler, bg.job_id) if k == S.JOB_EVENT_TYPE_STARTED]
        assert f"in the background on {fg.job_id}'s device" in started_msg[-1]
        codes = {j: getattr(scheduler.get(j).reason, "code", "") for j in (fg.job_id, bg.job_id)}
        assert codes == {fg.job_id: "lent_device", bg.job_id: "in_background"}  # round/why.py

        task = next(t for t in scheduler.state.tasks.values() if t.job_id == bg.job_id)

        def beat(paused: bool, reason: str) -> None:
            status = C.TaskStatus(
                task_id=task.task_id,
                job_id=bg.job_id,
                state=C.TASK_STATE_RUNNING,
                paused=paused,
                pause_reason=reason,
            )
            scheduler.heartbeat("w", [status])

        beat(True, "foreground at 0.31 s/step > bound 0.26 s")
        beat(True, "foreground at 0.31 s/step > bound 0.26 s")  # no second event
        assert job_message(scheduler.get(bg.job_id)).paused
        beat(False, "foreground back at 0.22 s/step")
        kinds = [k for k, _ in events(scheduler, bg.job_id)]
        assert kinds[-2:] == [S.JOB_EVENT_TYPE_PAUSED, S.JOB_EVENT_TYPE_RESUMED]
        assert events(scheduler, bg.job_id)[-2][1] == "foreground at 0.31 s/step > bound 0.26 s"
        assert not job_message(scheduler.get(bg.job_id)).paused

        scheduler.run_round()  # the same pair again: nothing restarts
        assert len(agents.started) == 2 and not agents.stopped
        # what the collocate stage saw: the pairing the first round made (it keeps it)
        seen = scheduler.rounds._snapshots[bg.job_id][1]
        assert seen.partners == (fg.job_id,) and seen.current == (("cpu", 1),)
    finally:
        scheduler.stop()


def test_without_a_layer_profile_nothing_is_lent() -> None:
    class Unprofiled(PlanningBrain):
        def burst_plan(
            self, keys: Sequence[str], *, global_batch: int, max_devices: int, amp_limit: float
        ) -> brain_pb2.BurstParallelPlan | None:
            return None

    clock = Clock()
    scheduler, agents = make_scheduler(deeppool(), clock=clock, brain=Unprofiled())
    try:
        register(scheduler, "w", {"cpu": 2})
        fg, _ = scheduler.submit(job_spec("fg", 2), "")
        clock.now += 1.0
        scheduler.submit(job_spec("bg", 1), "")
        scheduler.run_round()
        assert [r.job_id for r in agents.started] == [fg.job_id]
        assert not agents.started[0].HasField("collocation")
        assert agents.started[0].profile_first  # its rank 0 measures one for the next rounds
    finally:
        scheduler.stop()


def test_an_elastic_job_asks_for_the_planners_device_count() -> None:
    """Point 6: four devices free, the plan is as fast on two: the job gets two."""
    brain = PlanningBrain(elastic=2)
    scheduler, agents = make_scheduler(deeppool("easyscale"), clock=Clock(), brain=brain)
    try:
        register(scheduler, "w", {"cpu": 4})
        scheduler.submit(job_spec("elastic", 4), "")
        scheduler.run_round()
        assert len(agents.started[0].placement.processes) == 2
        assert brain.asked and len(brain.asked[0]) == 2  # the cpu profile first, then cuda
    finally:
        scheduler.stop()


def test_shared_runs_measure_pair_rates_apart_from_solo_ones() -> None:
    estimates = Estimates(BrainAdvisor(), pair_prior=0.5)
    scheduler, _ = make_scheduler(
        SchedulerSettings(policy="las_packed", round_seconds=60.0), clock=Clock()
    )
    try:
        register(scheduler, "w", {"cpu": 1})
        job, _ = scheduler.submit(job_spec("a", 1), "")
        record = scheduler.get(job.job_id)
        record.placement.processes.add(rank=0, worker_id="w", accelerator_type="cpu", est_ids=[0])
        record.collocation.CopyFrom(
            C.Collocation(role=C.COLLOCATION_ROLE_SHARED, partner_job_id="b")
        )
        progress = C.JobProgress(step=1, total_steps=10, samples_per_second=4.0)  # batch 8
        estimates.observe(record, 1, progress, 1.0)
        rates = estimates.pair_rates(record, ["b", "c"], {"cpu": 3.0})
        assert rates == {("b", "cpu"): pytest.approx(0.5), ("c", "cpu"): pytest.approx(1.5)}
        assert estimates.measured(job.job_id) == {}  # not a solo rate
    finally:
        scheduler.stop()


def test_the_simulator_runs_a_waiting_job_in_the_background_at_the_measured_rates() -> None:
    """One device type, two devices: a two-device job holds both for 1,000 s, a one-device
    job waits behind it (strict FIFO). Multiplexed, the small job runs beside it at
    `background_share` of its speed and ends sooner; the big one pays its slowdown."""
    isolated = {"cpu": {JobKey("big", 2): 2.0, JobKey("small", 1): 1.0}}
    table = ThroughputTable(isolated, {"cpu": {}})
    workload = [TraceJob("big", 2000, 2, 0.0), TraceJob("small", 200, 1, 1.0)]

    def run(multiplexed: Multiplexed | None) -> dict[str, float]:
        result = simulate_pipeline(
            workload,
            {"cpu": 2},
            table,
            make_allocator("fifo_strict", round_seconds=60.0),
            round_seconds=60.0,
            multiplexed=multiplexed,
        )
        return {j.job_type: j.finish_time for j in result.jobs}

    alone = run(None)
    shared = run(Multiplexed(idle_fraction=0.5, foreground_slowdown=0.1, background_share=0.5))
    assert alone["big"] == pytest.approx(1000.0, abs=61.0)
    assert alone["small"] > alone["big"]
    assert shared["small"] < 600.0  # 200 steps at 0.5 steps/s, from the first rounds
    assert shared["big"] > alone["big"]  # 10% slower while the small job runs beside it
    assert shared["big"] < alone["big"] * 1.1 + 61.0
    never = run(Multiplexed(idle_fraction=0.05))  # below the least idle share: no lending
    assert never == alone


def test_a_round_sets_each_role_and_clears_it_when_the_role_or_the_job_is_gone() -> None:
    """The round looks only at jobs with a role now or in the last round (not every job):
    a role given, changed, taken away, and the role of a job that ended, are all shown as
    the round decided (what `gearshift job` and a start read)."""
    scheduler, _ = make_scheduler(SchedulerSettings(round_seconds=60.0), clock=Clock())
    try:
        fg, bg, other = (scheduler.submit(job_spec(n, 1), "")[0].job_id for n in "abc")
        jobs = scheduler.state.jobs
        roles = scheduler.rounds._collocations

        def shown() -> dict[str, tuple[int, str, bool]]:
            return {
                j: (jobs[j].collocation.role, jobs[j].collocation.partner_job_id, jobs[j].paused)
                for j in (fg, bg, other)
            }

        def decide(**given: str) -> None:
            targets = {j: target(j, 1) for j in (fg, bg, other)}
            for job_id, role in given.items():
                partner = bg if job_id == fg else fg
                targets[job_id] = Target(job_id, (("cpu", 1),), {"cpu": (1,)}, (partner,), role)  # type: ignore[arg-type]
            with scheduler.state.lock:
                roles(targets, {j: [] for j in (fg, bg, other)})

        decide(**{fg: "foreground", bg: "background"})
        assert shown() == {
            fg: (C.COLLOCATION_ROLE_FOREGROUND, bg, False),
            bg: (C.COLLOCATION_ROLE_BACKGROUND, fg, False),
            other: (0, "", False),
        }
        jobs[bg].paused = True  # as its worker's heartbeat says
        decide(**{fg: "foreground"})  # bg lost its role: cleared, not paused
        assert shown() == {
            fg: (C.COLLOCATION_ROLE_FOREGROUND, bg, False),
            bg: (0, "", False),
            other: (0, "", False),
        }
        decide(**{fg: "foreground"})
        jobs[fg].state = C.JOB_STATE_CANCELLED  # ended after the round's snapshot
        decide(**{fg: "foreground"})
        assert shown()[fg] == (0, "", False)
        decide()
        assert shown() == dict.fromkeys((fg, bg, other), (0, "", False))
    finally:
        scheduler.stop()
