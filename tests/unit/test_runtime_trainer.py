"""One process's loop in-process: stop on request, checkpoint every K, resume exactly."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from gearshift.common.errors import ValidationError
from gearshift.worker.runtime import checkpoint
from gearshift.worker.runtime.control import Progress
from gearshift.worker.runtime.data import PendingReads, SupersededError
from gearshift.worker.runtime.job import load_job
from gearshift.worker.runtime.process import seed_globals
from gearshift.worker.runtime.rng import restore, snapshot
from gearshift.worker.runtime.settings import Determinism, RunSettings
from gearshift.worker.runtime.stop import Outcome, StopFlag
from gearshift.worker.runtime.trainer import RunResult, Trainer

CONFIG = {"features": 8, "hidden": 16, "classes": 4, "samples": 256}
SETTINGS = RunSettings(num_ests=2, global_batch_size=16, total_steps=8, shard_size=16, log_every=1)


@pytest.fixture(autouse=True)
def keep_global_state() -> Iterator[None]:
    state, threads = snapshot(), torch.get_num_threads()
    yield
    restore(state)
    torch.set_num_threads(threads)


def train(
    directory: Path,
    settings: RunSettings = SETTINGS,
    *,
    resume: bool = False,
    stop_at: int | None = None,
    module: str = "gearshift.examples.mlp",
) -> RunResult:
    seed_globals(settings.seed)
    stop = StopFlag()

    def progress(p: Progress) -> None:
        if p.step == stop_at:
            stop.request()

    trainer = Trainer(
        load_job(module, CONFIG),
        settings,
        [[0, 1]],
        0,
        directory,
        job_ref={"module": module},
        resume=resume,
        stop=stop,
        on_progress=progress,
        record_losses=True,
    )
    return trainer.run()


def test_stop_on_request_checkpoints_and_resumes_bitwise(tmp_path: Path) -> None:
    whole = train(tmp_path / "whole")
    assert whole.outcome is Outcome.COMPLETED
    assert whole.step == 8
    assert len(whole.est_losses) == 8
    assert len(whole.est_losses[0]) == 2

    stopped = train(tmp_path / "split", replace(SETTINGS, checkpoint_every=3), stop_at=4)
    assert stopped.outcome is Outcome.STOPPED
    # Asked at the end of step 4; the processes agree on it during step 5 and stop after it.
    assert stopped.step == 5
    assert [s for s, _ in checkpoint.checkpoints(tmp_path / "split")] == [3, 5]
    resumed = train(tmp_path / "split", resume=True)
    assert resumed.steps_run == 3
    assert stopped.est_losses + resumed.est_losses == whole.est_losses
    assert resumed.digest == whole.digest

    again = train(tmp_path / "split", resume=True)
    assert (again.steps_run, again.digest) == (0, whole.digest)


def test_resume_without_a_checkpoint_starts_at_zero(tmp_path: Path) -> None:
    result = train(tmp_path, replace(SETTINGS, total_steps=2), resume=True)
    assert (result.step, result.steps_run) == (2, 2)


def test_resume_refuses_a_changed_fixed_setting(tmp_path: Path) -> None:
    train(tmp_path, replace(SETTINGS, total_steps=2))
    with pytest.raises(
        ValidationError, match=r"--batch-size: the checkpoint ckpt-00000002\.pt was"
    ):
        train(tmp_path, replace(SETTINGS, global_batch_size=32), resume=True)
    with pytest.raises(ValidationError, match=r"belongs to job 'gearshift\.examples\.mlp'"):
        train(tmp_path, resume=True, module="gearshift.examples.digits_cnn")


def test_d2_pins_its_thread_count_for_the_whole_job(tmp_path: Path) -> None:
    d2 = replace(SETTINGS, total_steps=2, determinism=Determinism.D2, d2_threads=1)
    train(tmp_path, d2)
    with pytest.raises(ValidationError, match="--d2-threads: the checkpoint ckpt-00000002"):
        train(tmp_path, replace(d2, d2_threads=2), resume=True)
    assert train(tmp_path, replace(d2, total_steps=3), resume=True).step == 3


def test_a_module_without_build_is_refused() -> None:
    with pytest.raises(ValidationError, match="has no build"):
        load_job("gearshift.worker.runtime.tree", {})


class RecordingFeed:
    """A BatchFeed that is CheckpointAware: hands out consecutive indices and records what
    the trainer tells it."""

    size = 256

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, tuple[Any, ...]]] = []
        self.handed: dict[int, int] = {}

    def next_samples(self, est: int, count: int) -> tuple[int, list[int]]:
        taken = self.handed.get(est, 0)
        self.handed[est] = taken + 1
        start = (taken * 2 + est) * count % self.size
        return 0, list(range(start, start + count))

    def begin(self, step: int, ests: Sequence[int]) -> None:
        self.calls.append(("begin", step, tuple(ests)))

    def pending_before(self, step: int) -> PendingReads:
        return {est: [(step, taken)] for est, taken in sorted(self.handed.items())}

    def checkpoint_durable(self, step: int, pending: Sequence[PendingReads] | None) -> None:
        self.calls.append(("durable", step, tuple(pending or ())))


def test_a_checkpoint_aware_feed_hears_the_start_and_every_durable_checkpoint(
    tmp_path: Path,
) -> None:
    """Told where the process starts before its first batch, and each checkpoint once it
    is on disk (the dynamic feed covers its shards then)."""
    settings = replace(SETTINGS, checkpoint_every=3)
    feeds = [RecordingFeed(), RecordingFeed()]
    for feed, resume, stop_at in ((feeds[0], False, 4), (feeds[1], True, None)):
        seed_globals(settings.seed)
        stop = StopFlag()

        def progress(p: Progress, at: int | None = stop_at, flag: StopFlag = stop) -> None:
            if p.step == at:
                flag.request()

        Trainer(
            load_job("gearshift.examples.mlp", CONFIG), settings, [[0, 1]], 0, tmp_path,
            job_ref={"module": "gearshift.examples.mlp"}, resume=resume, stop=stop,
            on_progress=progress, source=feed,
        ).run()  # fmt: skip

    # One process: it writes the checkpoints, and gets its own pending reads back.
    def durable(step: int, taken: int) -> tuple[str, int, tuple[PendingReads, ...]]:
        return ("durable", step, ({0: [(step, taken)], 1: [(step, taken)]},))

    assert feeds[0].calls == [("begin", 0, (0, 1)), durable(3, 3), durable(5, 5)]
    assert feeds[0].handed == {0: 5, 1: 5}
    assert feeds[1].calls == [("begin", 5, (0, 1)), durable(6, 1), durable(8, 3)]
    assert feeds[1].handed == {0: 3, 1: 3}


class SupersededFeed(RecordingFeed):
    """A feed whose cover of the checkpoint of `at` learns a newer placement took over."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at

    def checkpoint_durable(self, step: int, pending: Sequence[PendingReads] | None) -> None:
        super().checkpoint_durable(step, pending)
        if step == self.at:
            raise SupersededError("a newer placement of this job holds EST 0")


def test_a_checkpoint_written_by_a_superseded_placement_is_discarded(tmp_path: Path) -> None:
    """A stale placement that wrote a checkpoint before learning it was fenced removes it:
    a later resume starts from the last checkpoint of a placement that held the data."""
    settings = replace(SETTINGS, checkpoint_every=3)
    seed_globals(settings.seed)
    with pytest.raises(SupersededError):
        Trainer(
            load_job("gearshift.examples.mlp", CONFIG), settings, [[0, 1]], 0, tmp_path,
            job_ref={"module": "gearshift.examples.mlp"}, source=SupersededFeed(at=6),
        ).run()  # fmt: skip
    assert [step for step, _ in checkpoint.checkpoints(tmp_path)] == [3]
