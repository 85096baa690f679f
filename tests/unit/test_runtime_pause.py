"""The pause gate of a background task: pausing between global steps changes nothing the job
computes, a stop request ends a pause, and paused time is not counted in samples/s."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from gearshift.worker.runtime.control import Progress
from gearshift.worker.runtime.job import load_job
from gearshift.worker.runtime.pause import PauseGate
from gearshift.worker.runtime.process import seed_globals
from gearshift.worker.runtime.rng import restore, snapshot
from gearshift.worker.runtime.settings import RunSettings
from gearshift.worker.runtime.stop import Outcome, StopFlag
from gearshift.worker.runtime.trainer import RunResult, Trainer

MLP = "gearshift.examples.mlp"
CONFIG = {"features": 8, "hidden": 16, "classes": 4, "samples": 256}
SETTINGS = RunSettings(num_ests=2, global_batch_size=16, total_steps=8, shard_size=16, log_every=1)


@pytest.fixture(autouse=True)
def keep_global_state() -> Iterator[None]:
    state, threads = snapshot(), torch.get_num_threads()
    yield
    restore(state)
    torch.set_num_threads(threads)


class Script:
    """A pause predicate: paused for `polls` polls before each step in `before`, as the worker
    daemon's file would be; `on_poll` runs at every poll while paused."""

    def __init__(self, trainer_step: list[int], before: set[int], polls: int) -> None:
        self.step = trainer_step
        self.before = before
        self.polls = polls
        self.left: dict[int, int] = {}
        self.on_poll: Callable[[], None] = lambda: None

    def __call__(self) -> bool:
        step = self.step[0]
        if step not in self.before:
            return False
        left = self.left.setdefault(step, self.polls)
        if left == 0:
            return False
        self.left[step] = left - 1
        self.on_poll()
        return True


def train(
    directory: Path,
    gate: PauseGate | None = None,
    step: list[int] | None = None,
    stop: StopFlag | None = None,
) -> tuple[RunResult, list[Progress]]:
    """The MLP job on one process; `step[0]` follows the steps done (the scripts read it)."""
    seed_globals(SETTINGS.seed)
    reports: list[Progress] = []

    def progress(p: Progress) -> None:
        reports.append(p)
        if step is not None:
            step[0] = p.step

    trainer = Trainer(
        load_job(MLP, CONFIG),
        SETTINGS,
        [[0, 1]],
        0,
        directory,
        job_ref={"module": MLP},
        stop=stop,
        on_progress=progress,
        pause=gate,
        record_losses=True,
    )
    return trainer.run(), reports


def test_a_paused_and_resumed_run_has_the_digest_of_an_unpaused_one(tmp_path: Path) -> None:
    alone, _ = train(tmp_path / "alone")
    step = [0]
    gate = PauseGate(Script(step, before={0, 3, 4, 7}, polls=3), poll_s=0.0)
    said: list[str] = []
    gate.say = said.append
    paused, _ = train(tmp_path / "paused", gate, step)
    assert paused.outcome is Outcome.COMPLETED and paused.step == SETTINGS.total_steps
    assert paused.digest == alone.digest
    assert paused.est_losses == alone.est_losses
    assert gate.count == 4 and paused.paused_s == gate.total_s
    assert said[0] == "paused before step 1" and said[1].startswith("resumed after"), said


def test_a_stop_request_ends_a_pause_and_checkpoints(tmp_path: Path) -> None:
    """Paused for good before step 4; the stop comes while paused: the loop leaves the gate,
    runs the step at which its processes agree on the stop, checkpoints and stops."""
    stop = StopFlag()
    step = [0]
    script = Script(step, before={3}, polls=10**9)
    script.on_poll = stop.request
    result, _ = train(tmp_path, PauseGate(script, poll_s=0.0), step, stop)
    assert result.outcome is Outcome.STOPPED and result.step == 4
    assert result.checkpoint is not None and result.checkpoint.exists()


def test_paused_time_is_not_counted_in_samples_per_second(tmp_path: Path) -> None:
    """A pause of about 1 s before step 2: counted, it would make step 2's window (one step of
    16 samples) report at most 16 samples/s; the steps themselves take milliseconds."""
    step = [0]
    gate = PauseGate(Script(step, before={1}, polls=20), poll_s=0.05)
    result, reports = train(tmp_path, gate, step)
    assert gate.total_s >= 0.9 and result.paused_s == gate.total_s
    assert reports[1].step == 2
    assert reports[1].samples_per_s > 2 * SETTINGS.global_batch_size / gate.total_s


def test_a_file_pauses_while_it_exists(tmp_path: Path) -> None:
    flag = tmp_path / "pause"
    gate = PauseGate.from_file(flag)
    stop = StopFlag()
    assert gate.wait(stop, 0) == 0.0 and gate.count == 0
    flag.touch()
    stop.request()  # a stop is never held up by a pause
    assert gate.wait(stop, 0) == 0.0 and gate.count == 0
