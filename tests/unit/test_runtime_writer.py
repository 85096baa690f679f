"""Snapshot-and-write checkpoints: the same bits as a synchronous one, and a writer killed
mid-write leaves the previous checkpoint the latest."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from gearshift.worker.runtime import checkpoint
from gearshift.worker.runtime.control import Progress
from gearshift.worker.runtime.digest import differences, tensor_bytes
from gearshift.worker.runtime.job import load_job
from gearshift.worker.runtime.process import seed_globals
from gearshift.worker.runtime.rng import restore, snapshot
from gearshift.worker.runtime.settings import RunSettings
from gearshift.worker.runtime.stop import Outcome, StopFlag
from gearshift.worker.runtime.trainer import RunResult, Trainer
from gearshift.worker.runtime.writer import CheckpointWriter, host_copy

MLP = "gearshift.examples.mlp"
# Adam: its state holds per-parameter tensors and step counts, all in the snapshot.
CONFIG = {"features": 8, "hidden": 16, "classes": 4, "samples": 256, "optimizer": "adam"}
SETTINGS = RunSettings(
    num_ests=2, global_batch_size=8, total_steps=6, shard_size=16, log_every=1, checkpoint_every=2
)


@pytest.fixture(autouse=True)
def keep_global_state() -> Iterator[None]:
    state, threads = snapshot(), torch.get_num_threads()
    yield
    restore(state)
    torch.set_num_threads(threads)


def train(
    directory: Path,
    *,
    async_checkpoint: bool,
    settings: RunSettings = SETTINGS,
    resume: bool = False,
    stop_at: int | None = None,
) -> RunResult:
    seed_globals(settings.seed)
    stop = StopFlag()

    def progress(p: Progress) -> None:
        if p.step == stop_at:
            stop.request()

    trainer = Trainer(
        load_job(MLP, dict(CONFIG)),
        settings,
        [[0, 1]],
        0,
        directory,
        job_ref={"module": MLP},
        resume=resume,
        stop=stop,
        on_progress=progress,
        async_checkpoint=async_checkpoint,
    )
    return trainer.run()


def test_an_async_checkpoint_restores_the_same_bits_as_a_sync_one(tmp_path: Path) -> None:
    whole = train(tmp_path / "whole", async_checkpoint=False)
    for mode in ("sync", "async"):
        folder = tmp_path / mode
        stopped = train(folder, async_checkpoint=mode == "async", stop_at=2)
        assert (stopped.outcome, stopped.step) == (Outcome.STOPPED, 3)
        # run() returned: the stop's checkpoint is durable, the periodic one before it too.
        assert [s for s, _ in checkpoint.checkpoints(folder)] == [2, 3]
        assert checkpoint.recorded(folder) == (3, folder / "ckpt-00000003.pt")
    for step in (2, 3):
        name = checkpoint.file_name(step)
        sync = checkpoint.load(tmp_path / "sync" / name)
        assert differences(sync, checkpoint.load(tmp_path / "async" / name)) == []
    resumed = train(tmp_path / "async", async_checkpoint=True, resume=True)
    assert (resumed.steps_run, resumed.digest) == (3, whole.digest)


def test_the_host_copy_is_a_snapshot_and_keeps_tied_tensors_tied() -> None:
    weight = torch.arange(4, dtype=torch.float32)
    state = {"a": weight, "tied": [weight, (-0.0, "x")], "n": 3}
    copy = host_copy(state)
    weight.add_(1.0)  # the next optimizer step
    assert tensor_bytes(copy["a"]) == tensor_bytes(torch.arange(4, dtype=torch.float32))
    assert copy["tied"][0] is copy["a"]
    assert copy["tied"][1] == (-0.0, "x") and copy["n"] == 3


def test_a_failed_write_is_raised_to_the_training_thread(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    writer = CheckpointWriter()
    writer.submit(blocker, 1, {"format": 1}, keep=2)
    with pytest.raises(OSError):
        writer.wait()
    writer.wait()  # raised once, not again


# The writer's process: one good checkpoint, then a write that stalls inside torch.save
# (pickling an object whose reduction blocks) after saying so, until it is killed.
_WRITER = """
import sys, threading, pathlib, torch
from gearshift.worker.runtime import checkpoint
from gearshift.worker.runtime.writer import CheckpointWriter, host_copy

folder = pathlib.Path(sys.argv[1])
checkpoint.save(folder, 5, {"format": 1, "step": 5, "w": torch.full((3,), 5.0)})

class Stall:
    def __reduce__(self):
        (folder / "mid-write").touch()
        threading.Event().wait()

writer = CheckpointWriter()
state = host_copy({"format": 1, "step": 10, "w": torch.zeros(1 << 16)})
writer.submit(folder, 10, state | {"stall": Stall()}, keep=2)
writer.wait()
"""


def test_a_writer_killed_mid_write_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)])
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "mid-write").exists():
            assert proc.poll() is None, "the writer exited before it stalled"
            assert time.monotonic() < deadline, "the writer never reached the stall"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert f".ckpt-00000010.pt.tmp-{proc.pid}" in names  # killed mid-write
    assert "ckpt-00000010.pt" not in names
    latest = checkpoint.latest(tmp_path)
    assert latest == tmp_path / "ckpt-00000005.pt"
    assert checkpoint.load(latest)["step"] == 5
    assert checkpoint.recorded(tmp_path) == (5, latest)
