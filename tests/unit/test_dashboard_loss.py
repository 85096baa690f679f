"""The loss curve from the step log: the worker's reading of steps.jsonl, the scheduler's
choice of a task to read it through, the dashboard's cache and the drawn envelope."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest

from gearshift.client.dashboard.loss_view import loss_curve
from gearshift.client.dashboard.series import LossPoint, envelope
from gearshift.client.dashboard.step_cache import StepCache
from gearshift.client.timeline import ProgressPoint
from gearshift.common.errors import UnavailableError
from gearshift.scheduler.state.job_logs import TaskSource
from gearshift.scheduler.state.job_steps import job_steps
from gearshift.v1 import common_pb2, worker_pb2
from gearshift.worker.step_log import read_steps


def bits(value: float) -> str:
    return struct.pack(">f", value).hex()


def record(step: int, *losses: float) -> str:
    return json.dumps({"step": step, "loss_bits": [bits(v) for v in losses], "time": 100.0 + step})


def test_the_step_log_reads_every_step_once_the_last_record_of_a_rerun_winning(
    tmp_path: Path,
) -> None:
    log = tmp_path / "steps.jsonl"
    lines = [record(1, 2.0, 4.0), record(2, 1.0, 1.0), record(3, 0.5, 0.5)]
    lines += ['{"step": 4, "loss_b', record(2, 1.5, 1.5), record(3, 0.25, 0.75)]  # a restart
    log.write_text("\n".join(lines) + "\n" + record(4, 9.0, 9.0)[:20])  # 4: still being written
    steps = read_steps(log, 0)
    assert [(s.step, s.loss, s.time) for s in steps] == [
        (1, 3.0, 101.0),
        (2, 1.5, 102.0),
        (3, 0.5, 103.0),
    ]
    assert [s.step for s in read_steps(log, 2)] == [3]
    assert [s.step for s in read_steps(log, 2, block=30)] == [3]  # blocks grow from the end
    assert read_steps(log, 3, block=30) == []


def test_a_read_after_a_step_reads_the_tail_of_a_long_log(tmp_path: Path) -> None:
    log = tmp_path / "steps.jsonl"
    log.write_text("".join(record(s, 1.0 / s) + "\n" for s in range(1, 2001)))
    # a restart from step 1990 reran 1991..1995
    with log.open("a") as f:
        f.write("".join(record(s, 5.0) + "\n" for s in range(1991, 1996)))
    assert [(s.step, s.loss) for s in read_steps(log, 1993, block=64)] == [(1994, 5.0), (1995, 5.0)]
    whole = read_steps(log, 0)
    assert [s.step for s in whole] == list(range(1, 2001))
    assert whole[1992].loss == 5.0 and whole[-1].loss == pytest.approx(1 / 2000)
    assert read_steps(tmp_path / "none.jsonl", 0) == []


def test_the_mean_loss_is_the_float32_losses_mean_as_progress_reports_it(tmp_path: Path) -> None:
    log = tmp_path / "steps.jsonl"
    log.write_text(
        record(1, 0.1, 0.2, 0.3) + "\n" + json.dumps({"step": 2, "loss_bits": ["7fc00000"]}) + "\n"
    )
    first, second = read_steps(log, 0)
    as_float32 = [struct.unpack(">f", struct.pack(">f", v))[0] for v in (0.1, 0.2, 0.3)]
    assert first.loss == sum(as_float32) / 3
    assert math.isnan(second.loss) and second.time == 0.0


class Refused(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.NOT_FOUND

    def details(self) -> str:
        return "task not found"


def test_the_scheduler_reads_the_step_log_through_the_newest_task_that_holds_rank_0() -> None:
    tasks = [
        TaskSource("j.g1.wA", "a:1", (0, 1), True),
        TaskSource("j.g2.wB", "b:1", (0,), True),  # forgotten by its worker
        TaskSource("j.g2.wC", "c:1", (1,), False),  # no rank 0: no step log there
    ]
    asked: list[tuple[str, str, int]] = []

    def read(address: str, request: worker_pb2.ReadStepLogRequest) -> Sequence[common_pb2.StepLoss]:
        asked.append((address, request.task_id, request.after_step))
        if address == "b:1":
            raise Refused()
        return [common_pb2.StepLoss(step=8, loss=0.5)]

    assert [s.step for s in job_steps("j", 7, tasks, read)] == [8]
    assert asked == [("b:1", "j.g2.wB", 7), ("a:1", "j.g1.wA", 7)]
    assert job_steps("j", 0, [], read) == []
    gone = [TaskSource("j.g1.wA", "", (0,), True), TaskSource("j.g2.wB", "b:1", (0,), True)]
    with pytest.raises(
        UnavailableError, match=r"j.g2.wB: task not found; task j.g1.wA: its worker is gone"
    ):
        job_steps("j", 0, gone, read)


def test_the_dashboard_asks_only_for_new_steps_and_stops_once_the_job_ended() -> None:
    cache = StepCache(max_jobs=1)
    log = [common_pb2.StepLoss(step=s, time=float(s), loss=1.0 / s) for s in range(1, 11)]
    asked: list[int] = []
    upto = 4

    def read(job_id: str, after: int) -> list[common_pb2.StepLoss]:
        asked.append(after)
        return [s for s in log[:upto] if s.step > after]

    assert [p.step for p in cache.read("j", False, read)] == [1, 2, 3, 4]
    upto = 10
    assert [p.step for p in cache.read("j", True, read)] == list(range(1, 11))
    assert len(cache.read("j", True, read)) == 10
    assert asked == [0, 4]  # the third read found the job ended and read in full
    cache.read("k", False, read)  # one job kept: j is dropped and read again from 0
    cache.read("j", True, read)
    assert asked[-1] == 0


def curve(n: int, spike: int = -1) -> list[LossPoint]:
    return [LossPoint(s, float(s), 100.0 if s == spike else 1.0 / s) for s in range(1, n + 1)]


def test_the_envelope_keeps_first_last_and_every_buckets_extremes() -> None:
    points = curve(4000, spike=2345)
    drawn = envelope(points, 500)
    assert len(drawn) <= 2 * 500 + 2
    assert drawn[0] == points[0] and drawn[-1] == points[-1]
    assert LossPoint(2345, 2345.0, 100.0) in drawn
    assert [p.step for p in drawn] == sorted(p.step for p in drawn)
    for bucket in range(500):  # every bucket of 8 steps keeps its lowest and highest loss
        inside = [p for p in points if (p.step - 1) * 500 // 4000 == bucket]
        kept = [p for p in drawn if (p.step - 1) * 500 // 4000 == bucket]
        assert (
            min(inside, key=lambda p: p.loss) in kept and max(inside, key=lambda p: p.loss) in kept
        )
    assert envelope(points[:1000], 500) == points[:1000]  # short enough: whole
    with pytest.raises(ValueError, match="buckets must be >= 1"):
        envelope(points, 0)


def test_the_envelope_keeps_a_non_finite_loss_as_a_gap() -> None:
    points = curve(3000)
    points[1500] = LossPoint(1501, 1501.0, math.nan)
    drawn = envelope(points, 100)
    assert any(p.step == 1501 and math.isnan(p.loss) for p in drawn)


def test_the_loss_curve_draws_the_step_log_and_says_when_progress_stands_in() -> None:
    view = loss_curve(curve(4000), [], buckets=500)
    assert view["source"] == "steps" and view["steps"] == 4000
    assert 100 < len(view["points"]) <= 1002
    assert view["points"][-1] == [4000, 1 / 4000] == view["last"]
    progress = [ProgressPoint(10.0, 100, math.nan, 5.0), ProgressPoint(11.0, 200, 0.5, 5.0)]
    fallback = loss_curve("no worker of job j can read its step log", progress)
    assert fallback["source"] == "progress" and fallback["points"] == [[100, None], [200, 0.5]]
    assert (
        fallback["note"]
        == "from progress events (the step log: no worker of job j can read its step log)"
    )
    assert loss_curve([], [])["points"] == [] and loss_curve([], [])["note"] == ""
