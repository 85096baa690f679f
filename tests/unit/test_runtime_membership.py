"""Membership files: what a change says, which changes a process may apply, and bad input
named and ignored; in one process's Trainer, a change applied, ignored, or a stop."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from gearshift.common.errors import ValidationError
from gearshift.worker.runtime import checkpoint, membership
from gearshift.worker.runtime.job import load_job
from gearshift.worker.runtime.membership import Change, MembershipFile
from gearshift.worker.runtime.process import seed_globals
from gearshift.worker.runtime.regroup import ProcessGroups
from gearshift.worker.runtime.rehearsal import rehearse
from gearshift.worker.runtime.rng import restore, snapshot
from gearshift.worker.runtime.settings import RunSettings
from gearshift.worker.runtime.stop import Outcome
from gearshift.worker.runtime.trainer import RunResult, Trainer


def test_a_change_names_who_stays_leaves_joins_and_sends() -> None:
    change = Change(3, (1, 2, 1), (None, 2, 0), "127.0.0.1:1")
    change.check(num_ests=4, old_procs=3)
    assert change.procs == 3
    assert change.new_rank(2) == 1
    assert change.new_rank(0) == 2
    assert change.new_rank(1) is None  # it leaves
    assert change.joiners == (0,)
    assert change.sender == 1  # the first process that stays


def test_only_a_change_at_step_0_that_keeps_rank_0_and_adds_processes_waits_for_joiners() -> None:
    grow = Change(1, (2, 1, 1), (0, 1, None), "h:1")
    assert grow.waits_for_joiners
    assert not Change(1, (2, 1, 1), (0, 1, None), "h:1", at_step=5).waits_for_joiners
    assert not Change(1, (2, 2), (0, 1), "h:1").waits_for_joiners  # nobody joins
    assert not Change(1, (2, 2), (None, 1), "h:2").waits_for_joiners  # rank 0 joins: its store
    cpu = torch.device("cpu")
    groups = ProcessGroups("job", "gloo", cpu, cpu, 60.0)
    assert groups.waits(grow, procs=1)  # a lone process serves the store at the new address
    assert not groups.waits(grow, procs=2)  # the old group's store is elsewhere
    groups.address = "h:1"
    assert groups.waits(grow, procs=2)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (Change(1, (2, 1), (0, None), "h:1"), "does not split the 4 ESTs"),
        (Change(1, (2, 2), (0,), "h:1"), "1 sources for 2 processes"),
        (Change(1, (2, 2), (None, None), "h:1"), "keeps no process"),
        (Change(1, (2, 2), (0, 0), "h:1"), "distinct old ranks"),
        (Change(1, (2, 2), (0, 5), "h:1"), "distinct old ranks"),
        (Change(1, (2, 2), (0, 1), ""), "master_addr is required"),
        (Change(1, (4,), (0,), "", timeout_s=0), "timeout_s must be > 0"),
        (Change(1, (4,), (0,), "", backend="mpi"), "not gloo or nccl"),
    ],
)
def test_a_change_the_processes_cannot_apply_is_refused_by_name(change: Change, words: str) -> None:
    with pytest.raises(ValidationError, match=words) as caught:
        change.check(num_ests=4, old_procs=2)
    assert caught.value.field == "--membership-file"


def test_the_file_round_trips_and_offers_the_next_generation_from_its_step(tmp_path: Path) -> None:
    path = tmp_path / "membership.json"
    first = Change(1, (2, 2), (0, None), "h:1", at_step=10)
    second = Change(2, (4,), (1,), "", at_step=0, timeout_s=5.0, backend="gloo")
    reader = MembershipFile(path, generation=0)
    assert reader.next_change(50) is None  # no file yet
    membership.write(path, [second, first])
    assert membership.parse(path.read_text()) == [second, first]
    assert reader.next_change(9) is None
    assert reader.next_change(10) == first
    reader.generation = 1
    assert reader.next_change(11) == second
    assert reader.find(1, rank=1, mapping=(2, 2)) == first


def test_one_change_alone_is_a_file_too() -> None:
    text = '{"generation": 1, "mapping": [4], "sources": [0]}'
    assert membership.parse(text) == [Change(1, (4,), (0,))]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{", "is not valid JSON"),
        ("[3]", "must be a JSON object"),
        ('{"generation": 1, "mapping": [4]}', "lacks 'sources'"),
        ('{"generation": "x", "mapping": [4], "sources": [0]}', "bad value"),
    ],
)
def test_a_bad_file_is_named(text: str, words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        membership.parse(text)


def test_a_joiner_must_be_a_joining_rank_of_its_generation(tmp_path: Path) -> None:
    path = tmp_path / "membership.json"
    membership.write(path, [Change(1, (2, 1, 1), (0, 1, None), "h:1")])
    reader = MembershipFile(path, generation=0)
    with pytest.raises(ValidationError, match="no change to generation 2"):
        reader.find(2, rank=2, mapping=(2, 1, 1))
    with pytest.raises(ValidationError, match=r"maps ESTs \[2, 1, 1\], not \[2, 2\]"):
        reader.find(1, rank=1, mapping=(2, 2))
    with pytest.raises(ValidationError, match="rank 0 is not a process that joins"):
        reader.find(1, rank=0, mapping=(2, 1, 1))


# -- in a Trainer (one process, no process group): applied, ignored, or a restart --------

CONFIG = {"features": 8, "hidden": 16, "classes": 4, "samples": 256}
SETTINGS = RunSettings(num_ests=2, global_batch_size=16, total_steps=8, shard_size=16)


@pytest.fixture
def keep_global_state() -> Iterator[None]:
    state, threads = snapshot(), torch.get_num_threads()
    yield
    restore(state)
    torch.set_num_threads(threads)


def train(directory: Path, changes: list[Change] | None, *, groups: bool = True) -> RunResult:
    seed_globals(SETTINGS.seed)
    reader = None
    if changes is not None:
        membership.write(directory.parent / f"{directory.name}.json", changes)
        reader = MembershipFile(directory.parent / f"{directory.name}.json", generation=0)
    cpu = torch.device("cpu")
    return Trainer(
        load_job("gearshift.examples.mlp", CONFIG),
        SETTINGS,
        [[0, 1]],
        0,
        directory,
        job_ref={"module": "gearshift.examples.mlp"},
        membership=reader,
        groups=ProcessGroups("job", "gloo", cpu, cpu, 60.0) if groups else None,
    ).run()


@pytest.mark.usefixtures("keep_global_state")
def test_a_change_is_applied_in_place_ignored_when_bad_or_a_stop_without_groups(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fixed = train(tmp_path / "fixed", None)
    # The one process re-forms its (empty) group as generation 1 at step 3 and trains on.
    applied = train(tmp_path / "applied", [Change(1, (2,), (0,), at_step=3)])
    assert (applied.outcome, applied.step, len(applied.changes)) == (Outcome.COMPLETED, 8, 1)
    assert applied.digest == fixed.digest
    assert "step 3: generation 1, 1 processes" in capsys.readouterr().out
    # A change that does not split the ESTs is named once, then the job trains on.
    bad = train(tmp_path / "bad", [Change(1, (1,), (0,), at_step=3)])
    assert (bad.outcome, bad.changes, bad.digest) == (Outcome.COMPLETED, [], fixed.digest)
    assert capsys.readouterr().out.count("does not split the 2 ESTs") == 1
    # Without a process-group manager the change is the restart path's: a stop at its step.
    stopped = train(tmp_path / "stopped", [Change(1, (2,), (0,), at_step=3)], groups=False)
    assert (stopped.outcome, stopped.step) == (Outcome.STOPPED, 3)
    assert checkpoint.latest(tmp_path / "stopped") == tmp_path / "stopped" / "ckpt-00000003.pt"


def test_a_rehearsal_leaves_the_generators_the_gradients_and_the_parameters_as_they_were(
    keep_global_state: None,
) -> None:
    """What a joiner rehearses is thrown away: the digits CNN's augmentation and dropout draw
    from the global generators, yet each continues where it was."""
    seed_globals(7)
    job = load_job("gearshift.examples.digits_cnn", {})
    params = {name: p.detach().clone() for name, p in job.model.named_parameters()}
    before = snapshot()
    rehearse(job, torch.device("cpu"), samples=4)
    drawn = torch.rand(3), random.random(), np.random.random()
    restore(before)
    assert torch.equal(drawn[0], torch.rand(3))
    assert drawn[1:] == (random.random(), np.random.random())
    assert all(p.grad is None for p in job.model.parameters())
    assert all(torch.equal(p, params[name]) for name, p in job.model.named_parameters())
