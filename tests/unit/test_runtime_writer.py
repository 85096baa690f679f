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
from typing import Any

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
from gearshift.worker.runtime.writer import CheckpointWriter, fill, layout, unpack

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


def test_the_snapshot_is_taken_at_submit_and_keeps_tied_tensors_tied() -> None:
    weight = torch.arange(4, dtype=torch.float32)
    state = {"a": weight, "tied": [weight, (-0.0, "x")], "n": 3, "half": torch.ones(3).half()}
    skeleton, tensors, size = layout(state)
    assert len(tensors) == 2 and size == 4 * 4 + 3 * 2
    arena = torch.zeros(size, dtype=torch.uint8)
    fill(arena, tensors)
    weight.add_(1.0)  # the next optimizer step
    copy = unpack(skeleton, arena)
    assert tensor_bytes(copy["a"]) == tensor_bytes(torch.arange(4, dtype=torch.float32))
    assert copy["tied"][0] is copy["a"]
    assert copy["tied"][1] == (-0.0, "x") and copy["n"] == 3
    assert copy["half"].dtype == torch.float16 and copy["half"].tolist() == [1.0, 1.0, 1.0]


def test_a_failed_write_is_raised_to_the_training_process(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    writer = CheckpointWriter()
    try:
        writer.submit(blocker, 1, {"format": 1}, keep=2)
        with pytest.raises(OSError):
            writer.wait()
        writer.wait()  # raised once, not again
        writer.submit(tmp_path, 2, {"format": 1, "w": torch.ones(2)}, keep=2)  # goes on
        writer.wait()
        assert writer.written == [tmp_path / "ckpt-00000002.pt"]
    finally:
        writer.close()


# Both scripts: one good checkpoint first, and an object whose pickling in the writer
# process (inside torch.save) says so, with the writer's pid, then waits on `hold`.
_PRELUDE = """
import os, sys, threading, pathlib, torch
from gearshift.worker.runtime import checkpoint
from gearshift.worker.runtime.writer import CheckpointWriter

folder = pathlib.Path(sys.argv[1])
checkpoint.save(folder, 5, {"format": 1, "step": 5, "w": torch.full((3,), 5.0)})

class Hold:
    def __init__(self, owner):
        self.owner = owner
    def __reduce__(self):
        if os.getpid() == self.owner:  # pickled to the writer: nothing happens here
            return (Hold, (self.owner,))
        (folder / "mid-write").write_text(str(os.getpid()))
        hold(self.owner)
        return (int, (0,))
"""

# The writer stalls until the test kills it; then a third write, by a new writer.
_WRITER = (
    _PRELUDE
    + """
def hold(owner):
    threading.Event().wait()

writer = CheckpointWriter()
writer.submit(folder, 10, {"format": 1, "step": 10, "w": torch.zeros(1 << 16),
                           "hold": Hold(os.getpid())}, keep=2)
try:
    writer.wait()
except RuntimeError as exc:
    print("ERROR:", exc, flush=True)
names = sorted(p.name for p in folder.iterdir())
print("NAMES:", " ".join(names), flush=True)
writer.submit(folder, 15, {"format": 1, "step": 15, "w": torch.full((3,), 15.0)}, keep=3)
writer.wait()
"""
)


def _wait_for(path: Path, proc: subprocess.Popen[Any]) -> int:
    deadline = time.monotonic() + 60
    while not path.exists() or not path.read_text():
        assert proc.poll() is None, "the training process exited before the writer stalled"
        assert time.monotonic() < deadline, "the writer never reached the stall"
        time.sleep(0.01)
    return int(path.read_text())


def test_a_writer_killed_mid_write_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        writer_pid = _wait_for(tmp_path / "mid-write", proc)
        assert writer_pid != proc.pid
        os.kill(writer_pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == 0, out
    assert "ERROR: the checkpoint writer process died mid-write" in out
    # Right after the kill: the temporary file is left, the step-10 file never landed.
    names = out.split("NAMES:")[1].split()
    assert f".ckpt-00000010.pt.tmp-{writer_pid}" in names and "ckpt-00000010.pt" not in names
    assert checkpoint.recorded(tmp_path) == (15, tmp_path / "ckpt-00000015.pt")
    assert [s for s, _ in checkpoint.checkpoints(tmp_path)] == [5, 15]
    assert checkpoint.load(tmp_path / "ckpt-00000005.pt")["step"] == 5


# The writer goes on once the test has killed the training process (if it is still alive).
_TRAINER_KILLED = (
    _PRELUDE
    + """
def hold(owner):
    while os.getppid() == owner:
        threading.Event().wait(0.01)

writer = CheckpointWriter()
writer.submit(folder, 10, {"format": 1, "step": 10, "hold": Hold(os.getpid())}, keep=2)
threading.Event().wait()
"""
)


def test_a_trainer_killed_mid_write_takes_its_writer_with_it(tmp_path: Path) -> None:
    """No checkpoint lands after its training process is gone (a newer placement may own
    the folder by then): the writer dies with it instead of finishing the write."""
    proc = subprocess.Popen([sys.executable, "-c", _TRAINER_KILLED, str(tmp_path)])
    try:
        writer_pid = _wait_for(tmp_path / "mid-write", proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _alive(writer_pid):
            assert time.monotonic() < deadline, "the writer outlived its training process"
            time.sleep(0.01)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert not (tmp_path / "ckpt-00000010.pt").exists()
    assert checkpoint.recorded(tmp_path) == (5, tmp_path / "ckpt-00000005.pt")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_the_writer_leaves_stop_signals_to_its_training_process(tmp_path: Path) -> None:
    """A SIGTERM or Ctrl-C sent to the whole process group must not cut a write short: the
    training process handles the stop and waits for the write."""
    writer = CheckpointWriter()
    try:
        writer.start()
        assert writer._process is not None and writer._process.pid is not None
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            os.kill(writer._process.pid, sig)
        writer.submit(tmp_path, 3, {"format": 1, "w": torch.ones(2)}, keep=2)
        writer.wait()
        assert writer.written == [tmp_path / "ckpt-00000003.pt"]
    finally:
        writer.close()
