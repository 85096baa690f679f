"""Membership files: what a change says, which changes a process may apply, and bad input
named and ignored."""

from __future__ import annotations

from pathlib import Path

import pytest

from gearshift.common.errors import ValidationError
from gearshift.worker.runtime import membership
from gearshift.worker.runtime.membership import Change, MembershipFile


def test_a_change_names_who_stays_leaves_joins_and_sends() -> None:
    change = Change(3, (1, 2, 1), (None, 2, 0), "127.0.0.1:1")
    change.check(num_ests=4, old_procs=3)
    assert change.procs == 3
    assert change.new_rank(2) == 1
    assert change.new_rank(0) == 2
    assert change.new_rank(1) is None  # it leaves
    assert change.joiners == (0,)
    assert change.sender == 1  # the first process that stays


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
