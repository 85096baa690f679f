"""Bitwise elasticity with real processes and real gloo: any placement, any rescale, same bytes.

Every run goes through the launcher (`python -m gearshift.worker.run`). A run is
compared with its reference by the bytes of everything in its final
checkpoint — parameters, buffers, optimizer state, LR scheduler, every EST's
RNG states, data position and loader-worker states — by every EST's loss at
every step, and by the printed digest.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from gearshift.common.ports import free_port
from gearshift.worker.runtime import checkpoint, membership
from gearshift.worker.runtime.digest import differences
from tests.helpers import wait_until

REPO = Path(__file__).resolve().parents[2]
CNN = "gearshift.examples.digits_cnn"
LM = "gearshift.examples.tiny_lm"
MLP = "gearshift.examples.mlp"
RESNET = "gearshift.examples.resnet"
TIMEOUT_S = 600
LAUNCH_TIMEOUT_S = 300  # a launch here takes under a minute on a loaded 2-core host


@dataclass
class Run:
    directory: Path
    stdout: str

    @property
    def ckpt_dir(self) -> Path:
        return self.directory / "ckpt"

    def final(self) -> dict[str, Any]:
        path = checkpoint.latest(self.ckpt_dir)
        assert path is not None, f"no checkpoint in {self.ckpt_dir}"
        return checkpoint.load(path)

    def trained(self) -> dict[str, Any]:
        """The last checkpoint but the plan it records (how the run was placed)."""
        state = self.final()
        assert "ests_per_process" in state.pop("plan")
        return state

    def losses(self) -> list[list[str]]:
        """Every EST's float32 loss bytes, step by step (a re-run step counts once)."""
        by_step: dict[int, list[str]] = {}
        for line in (self.directory / "losses.jsonl").read_text().splitlines():
            record = json.loads(line)
            by_step[record["step"]] = record["loss_bits"]
        assert sorted(by_step) == list(range(1, len(by_step) + 1))
        return [by_step[step] for step in sorted(by_step)]

    def digest(self) -> str:
        found = re.findall(r"^digest sha256:([0-9a-f]{64})$", self.stdout, re.MULTILINE)
        assert found, self.stdout
        return str(found[-1])

    def bytes_per_step_ratios(self) -> list[float]:
        """Per rank of the last launch: bytes sent per step / gradient bytes."""
        ratios = []
        for path in sorted((self.directory / "stats").glob("rank*.json")):
            stats = json.loads(path.read_text())
            ratios.append(stats["bytes_sent"] / stats["steps_run"] / stats["grad_bytes"])
        return ratios


def command(directory: Path, job: str, ests: int, procs: int, steps: int, *extra: str) -> list[str]:
    cmd = [sys.executable, "-m", "gearshift.worker.run", "--job", job, "--ests", str(ests)]
    cmd += ["--procs", str(procs), "--steps", str(steps), "--log-every", "50"]
    cmd += [
        "--checkpoint-dir",
        str(directory / "ckpt"),
        "--loss-log",
        str(directory / "losses.jsonl"),
    ]
    cmd += ["--stats-dir", str(directory / "stats"), *extra]
    return cmd


def launch(
    directory: Path, job: str, ests: int, procs: int, steps: int, *extra: str, expect: int = 0
) -> Run:
    directory.mkdir(parents=True, exist_ok=True)
    for old in (directory / "stats").glob("rank*.json"):
        old.unlink()
    stdout, stderr, code = run_or_dump(command(directory, job, ests, procs, steps, *extra))
    assert code == expect, f"exit {code}\n{stdout}\n{stderr}"
    return Run(directory, stdout)


def run_or_dump(cmd: list[str]) -> tuple[str, str, int]:
    """Run a launch; one that hangs past LAUNCH_TIMEOUT_S fails the test with every one of
    its processes' Python stacks (faulthandler, on SIGABRT to its session), not a bare
    timeout: a 2-process D2 launch hung once in CI and could not be reproduced since."""
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGABRT)
        try:
            stdout, stderr = proc.communicate(timeout=30)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"{' '.join(cmd)} hung for {LAUNCH_TIMEOUT_S} s; its stacks:\n{stderr}")
    return stdout, stderr, proc.returncode


def assert_same(reference: Run, other: Run) -> None:
    assert differences(reference.trained(), other.trained()) == []
    assert other.losses() == reference.losses()
    assert other.digest() == reference.digest()


def first_difference(reference: Run, other: Run) -> int | None:
    """1-based step of the first loss that differs, if any."""
    for step, (a, b) in enumerate(zip(reference.losses(), other.losses(), strict=True), 1):
        if a != b:
            return step
    return None


@pytest.mark.slow
def test_cnn_n4_is_bitwise_equal_on_every_placement_and_through_rescales(tmp_path: Path) -> None:
    """1 x 4 (the reference), 2 x 2 with 2 + 1 + 1 mapped onto 3 processes, and a run staged
    4 x 1 -> 2 x 2 -> 3 processes through two resumes: one set of bits. (Every process
    started costs seconds of imports, so the placements share runs.)"""
    steps = 200
    reference = launch(tmp_path / "ref", CNN, 4, 1, steps)
    assert reference.final()["step"] == steps

    uneven = launch(tmp_path / "c", CNN, 4, 3, steps, "--mapping", "2,1,1", "--loader-procs", "2")
    assert_same(reference, uneven)
    assert max(uneven.bytes_per_step_ratios()) <= 2.5

    staged = tmp_path / "d"
    four = launch(staged, CNN, 4, 4, 70, "--checkpoint-every", "35")
    assert max(four.bytes_per_step_ratios()) <= 2.5
    # Fewer loader processes than the ESTs' logical loader workers (2 per EST).
    two = launch(staged, CNN, 4, 2, 140, "--resume", "--loader-procs", "1")
    assert max(two.bytes_per_step_ratios()) <= 2.5
    final = launch(staged, CNN, 4, 3, steps, "--resume", "--mapping", "2,1,1")
    assert_same(reference, final)


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cnn_on_one_gpu_one_process_equals_two_processes_sharing_it(tmp_path: Path) -> None:
    """The GPU check: (a) 1 process x 4 ESTs vs (b) 2 x 2, both on one GPU, under D1."""
    steps = 300
    one = launch(tmp_path / "a", CNN, 4, 1, steps, "--device", "cuda")
    two = launch(tmp_path / "b", CNN, 4, 2, steps, "--device", "cuda")
    assert one.final()["step"] == steps
    assert_same(one, two)


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """Without per-EST RNG contexts, or with another summation order, 1x4 differs from the
    reference 1x4 (which the N = 4 test shows equal to 4x1)."""
    steps = 40
    reference = launch(tmp_path / "ref", CNN, 4, 1, steps)
    shared_rng = launch(tmp_path / "rng", CNN, 4, 1, steps, "--no-est-rng-contexts")
    fold = launch(tmp_path / "fold", CNN, 4, 1, steps, "--tree", "fold")
    assert differences(reference.trained(), shared_rng.trained()) != []
    assert differences(reference.trained(), fold.trained()) != []
    # Dropout masks differ at once; the other order changes only the sum, so step 1's
    # losses (computed before any sum) still agree.
    assert first_difference(reference, shared_rng) == 1
    fold_first = first_difference(reference, fold)
    assert fold_first is not None
    assert fold_first > 1


@pytest.mark.slow
def test_cnn_eight_ests_on_three_processes(tmp_path: Path) -> None:
    steps = 60
    reference = launch(tmp_path / "ref", CNN, 8, 1, steps)  # 1 x 8 = 8 x 1 (the N = 4 test)
    mapped = launch(tmp_path / "mapped", CNN, 8, 3, steps, "--mapping", "3,3,2")
    assert_same(reference, mapped)
    assert max(mapped.bytes_per_step_ratios()) <= 2.5


@pytest.mark.slow
def test_cnn_three_ests_started_one_process_at_a_time(tmp_path: Path) -> None:
    """What a worker daemon does: start each process itself with --rank and --master-addr."""
    steps = 100
    reference = launch(tmp_path / "ref", CNN, 3, 1, steps)
    directory = tmp_path / "by-rank"
    address = f"127.0.0.1:{free_port()}"
    entry = [*command(directory, CNN, 3, 2, steps), "--mapping", "1,2", "--world-size", "2"]
    procs = [
        subprocess.Popen(
            [*entry, "--rank", str(rank), "--master-addr", address],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (1, 0)
    ]
    outputs = [proc.communicate(timeout=TIMEOUT_S) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    rank1_out, rank0_out = outputs[0][0], outputs[1][0]
    assert rank1_out == ""  # only rank 0 reports
    assert_same(reference, Run(directory, rank0_out))
    assert max(Run(directory, rank0_out).bytes_per_step_ratios()) <= 2.5


@pytest.mark.slow
def test_language_model_with_adam(tmp_path: Path) -> None:
    steps = 60
    reference = launch(tmp_path / "ref", LM, 4, 1, steps)
    assert reference.final()["optimizer"]["state"][0]["exp_avg_sq"].abs().sum() > 0  # Adam
    assert_same(reference, launch(tmp_path / "uneven", LM, 4, 3, steps, "--mapping", "2,1,1"))
    staged = tmp_path / "staged"
    launch(staged, LM, 4, 4, 30)
    assert_same(reference, launch(staged, LM, 4, 2, steps, "--resume"))


def test_resnet_is_bitwise_equal_on_one_and_two_processes(tmp_path: Path) -> None:
    """The example the GPU benchmark sizes up: BatchNorm in every block, shifts and flips."""
    steps = 6
    one = launch(tmp_path / "one", RESNET, 2, 1, steps)
    assert_same(one, launch(tmp_path / "two", RESNET, 2, 2, steps))


def test_d2_pins_the_thread_count_whatever_processes_are_given(tmp_path: Path) -> None:
    # A wide layer normalised by one reduction over 32x4096 activations: its bits depend
    # on how many threads split the reduction.
    job = ["--config", '{"hidden": 4096, "layers": 1, "global_norm": true}', "--batch-size", "64"]
    steps = 20
    d2 = [*job, "--determinism", "D2", "--d2-threads", "2"]
    single = launch(tmp_path / "d2-one", MLP, 2, 1, steps, *d2, "--threads", "1")
    spread = launch(tmp_path / "d2-two", MLP, 2, 2, steps, *d2, "--threads", "1,3")
    assert_same(single, spread)
    # The same job under D1, given different thread counts, differs: D2 is what fixes it.
    d1_single = launch(tmp_path / "d1-one", MLP, 2, 1, steps, *job, "--threads", "1")
    d1_spread = launch(tmp_path / "d1-two", MLP, 2, 2, steps, *job, "--threads", "1,2")
    assert differences(d1_single.trained(), d1_spread.trained()) != []


def test_stop_signal_checkpoints_and_a_restart_on_other_processes_continues(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "stopped"
    run_dir.mkdir()
    losses = run_dir / "losses.jsonl"
    proc = subprocess.Popen(
        command(run_dir, CNN, 4, 2, 1_000_000, "--loader-procs", "2"),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(
            lambda: losses.exists() and len(losses.read_text().splitlines()) >= 3,
            timeout=300,
            message="training did not start",
        )
        proc.send_signal(signal.SIGUSR1)
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 75, f"{stdout}\n{stderr}"
    assert "outcome stopped" in stdout
    stopped_at = Run(run_dir, stdout).final()["step"]
    assert 3 <= stopped_at < 1_000_000

    steps = stopped_at + 10
    resumed = launch(run_dir, CNN, 4, 3, steps, "--resume", "--mapping", "2,1,1")
    reference = launch(tmp_path / "ref", CNN, 4, 1, steps)
    assert_same(reference, resumed)


# -- in-place membership changes (membership.py): no restart, the same bits --------------


def start_rank(
    directory: Path,
    job: str,
    steps: int,
    name: str,
    mapping: str,
    *extra: str,
    rank: int,
    at: str,
    join: int = 0,
) -> subprocess.Popen[str]:
    """One process of the job (`join`: joining that generation), started by hand as a worker
    daemon would, its output in files."""
    cmd = [*command(directory, job, 4, len(mapping.split(",")), steps), "--mapping", mapping]
    cmd += ["--rank", str(rank), "--master-addr", at, "--membership-file"]
    cmd += [str(directory / "membership.json"), "--join-generation", str(join), *extra]
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=(directory / f"{name}.out").open("w"),
        stderr=(directory / f"{name}.err").open("w"),
        text=True,
    )


def finish(directory: Path, procs: dict[str, subprocess.Popen[str]]) -> dict[str, int]:
    codes = {}
    for name, proc in procs.items():
        try:
            codes[name] = proc.wait(timeout=TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for name, code in codes.items():
        assert code in (0, 75), (name, code, (directory / f"{name}.err").read_text())
    return codes


def output(directory: Path, name: str) -> str:
    return (directory / f"{name}.out").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("job", [CNN, LM])
def test_in_place_grow_mixed_move_and_shrink_end_with_the_fixed_runs_bits(
    tmp_path: Path, job: str
) -> None:
    """One run through four in-place changes, none a restart: 2 processes (A, B) grow to 3
    (C joins; A keeps serving the store), a mixed change to 2 (A and C leave, D joins as
    rank 0 with a new store, B sends it the state), a move (B leaves, E joins; D sends),
    and a shrink to 1 (D leaves; E trains on alone, no process group). Every EST's loss at
    every step, the final checkpoint and the digest equal the fixed 1 x 4 run's; the
    digits CNN (SGD, BatchNorm, dropout, augmentation) and the tiny LM with Adam."""
    steps = 50
    reference = launch(tmp_path / "ref", job, 4, 1, steps)
    if job == LM:
        assert reference.final()["optimizer"]["state"][0]["exp_avg_sq"].abs().sum() > 0
    run = tmp_path / "inplace"
    run.mkdir()
    first, mixed, moved = (f"127.0.0.1:{free_port()}" for _ in range(3))
    membership.write(
        run / "membership.json",
        [
            membership.Change(1, (2, 1, 1), (0, 1, None), first, at_step=10),
            membership.Change(2, (1, 3), (None, 1), mixed, at_step=20),
            membership.Change(3, (1, 3), (0, None), moved, at_step=30),
            membership.Change(4, (4,), (1,), "", at_step=40),
        ],
    )
    procs = {
        "A": start_rank(run, job, steps, "A", "2,2", rank=0, at=first),
        "B": start_rank(run, job, steps, "B", "2,2", rank=1, at=first),
        "C": start_rank(run, job, steps, "C", "2,1,1", rank=2, at=first, join=1),
        "D": start_rank(run, job, steps, "D", "1,3", rank=0, at=mixed, join=2),
        "E": start_rank(run, job, steps, "E", "1,3", rank=1, at=moved, join=3),
    }
    assert finish(run, procs) == dict.fromkeys(procs, 0)
    for name, left_at in (("A", 20), ("C", 20), ("B", 30), ("D", 40)):
        assert f"outcome left at step {left_at}" in output(run, name)
    assert "outcome completed at step 50" in output(run, "E")
    assert_same(reference, Run(run, output(run, "E")))


@pytest.mark.slow
def test_a_joiner_that_becomes_rank_0_reports_when_the_job_paused(tmp_path: Path) -> None:
    """A mixed change that drops rank 0: the joiner that takes its place learns, with the
    state, when the job paused for the change, and reports it in its progress (from the
    old rank 0's last step on, the scheduler charges the change's cost)."""
    steps = 15
    reference = launch(tmp_path / "ref", CNN, 4, 1, steps)
    run = tmp_path / "mixed"
    run.mkdir()
    first, second = (f"127.0.0.1:{free_port()}" for _ in range(2))
    change = membership.Change(1, (2, 2), (None, 1), second, at_step=5)
    membership.write(run / "membership.json", [change])
    procs = {
        name: start_rank(run, CNN, steps, name, "2,2", rank=rank, at=first)
        for rank, name in enumerate("AB")
    }
    progress = run / "C.progress.json"
    procs["C"] = start_rank(
        run, CNN, steps, "C", "2,2", "--progress-file", str(progress), rank=0, at=second, join=1
    )
    assert finish(run, procs) == dict.fromkeys(procs, 0)
    assert "outcome left at step 5" in output(run, "A")
    assert_same(reference, Run(run, output(run, "C")))
    said = json.loads(progress.read_text())
    times = [json.loads(line)["time"] for line in (run / "losses.jsonl").read_text().splitlines()]
    # A's step 5 ended, then B's (the sender's) and the change; C's first step is step 6.
    assert times[4] - 1.0 < said["paused_from"] <= said["first_step_at"] <= times[5], said


def last_step(directory: Path) -> int:
    path = directory / "losses.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return int(json.loads(lines[-1])["step"]) if lines else 0


@pytest.mark.slow
def test_the_job_trains_on_while_a_joiner_starts(tmp_path: Path) -> None:
    """A change at step 0 waits for its joiner: the two running processes keep training
    while it is not there (it is started only once they passed step 15), old rank 0 asks
    for the change once the joiner said it is ready, and the run keeps the fixed run's bits.
    Applied at the first boundary instead, the change would have held the job at step 1."""
    # 10 s at least: the joiner (a fresh interpreter, torch imported) comes in time
    steps, delay = 200, ("--step-delay", "0.05")
    reference = launch(tmp_path / "ref", CNN, 4, 1, steps)
    run = tmp_path / "waits"
    run.mkdir()
    address = f"127.0.0.1:{free_port()}"
    membership.write(
        run / "membership.json", [membership.Change(1, (2, 1, 1), (0, 1, None), address)]
    )
    procs = {
        name: start_rank(run, CNN, steps, name, "2,2", *delay, rank=rank, at=address)
        for rank, name in enumerate("AB")
    }
    wait_until(lambda: last_step(run) >= 15, 120, "the job to pass step 15")
    procs["C"] = start_rank(run, CNN, steps, "C", "2,1,1", *delay, rank=2, at=address, join=1)
    assert finish(run, procs) == dict.fromkeys(procs, 0)
    changed = re.search(r"^step (\d+): generation 1, 3 processes$", output(run, "A"), re.MULTILINE)
    assert changed is not None, output(run, "A")
    assert int(changed.group(1)) >= 15
    assert_same(reference, Run(run, output(run, "A")))


@pytest.mark.slow
def test_a_joiner_that_comes_after_the_job_ended_leaves(tmp_path: Path) -> None:
    """The job trained on while its joiner started, and ended first: the joiner finds the
    final checkpoint and leaves (exit 0, outcome left) instead of failing on a store that
    is gone; the job's two processes completed with the fixed run's bits."""
    steps = 20
    reference = launch(tmp_path / "ref", CNN, 4, 1, steps)
    run = tmp_path / "late"
    run.mkdir()
    address = f"127.0.0.1:{free_port()}"
    late = membership.Change(1, (2, 1, 1), (0, 1, None), address, timeout_s=120)
    membership.write(run / "membership.json", [late])
    procs = {
        name: start_rank(run, CNN, steps, name, "2,2", rank=rank, at=address)
        for rank, name in enumerate("AB")
    }
    assert finish(run, procs) == {"A": 0, "B": 0}
    assert_same(reference, Run(run, output(run, "A")))
    joiner = {"C": start_rank(run, CNN, steps, "C", "2,1,1", rank=2, at=address, join=1)}
    assert finish(run, joiner) == {"C": 0}
    said = output(run, "C")
    assert f"the job ended at step {steps} before generation 1 formed" in said, said
    assert f"outcome left at step {steps}" in said


@pytest.mark.slow
def test_a_failed_in_place_change_falls_back_to_the_checkpoint_and_a_restart(
    tmp_path: Path,
) -> None:
    """The process that should join never comes (an injected failure): the two running
    processes give the change up after its timeout and stop (75) at the change's step,
    whose checkpoint the restart path resumes on the new placement: the same bits."""
    steps = 20
    reference = launch(tmp_path / "ref", CNN, 4, 1, steps)
    run = tmp_path / "fallback"
    run.mkdir()
    address = f"127.0.0.1:{free_port()}"
    change = membership.Change(1, (2, 1, 1), (0, 1, None), address, at_step=10, timeout_s=3)
    membership.write(run / "membership.json", [change])
    procs = {
        name: start_rank(run, CNN, steps, name, "2,2", rank=rank, at=address)
        for rank, name in enumerate("AB")
    }
    assert finish(run, procs) == {"A": 75, "B": 75}
    assert "failed" in output(run, "A")
    assert Run(run, output(run, "A")).final()["step"] == 10
    resumed = launch(run, CNN, 4, 3, steps, "--resume", "--mapping", "2,1,1")
    assert_same(reference, resumed)
