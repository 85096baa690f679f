"""--recompute-in-background (ElasticRounds.in_background): a recomputation after the first
is solved beside the rounds, which go on with the allocation in force, and is taken at the
first round after it is done (Gavel's allocation thread)."""

from __future__ import annotations

import logging
import threading

import pytest

from gearshift.scheduler.plugins.gavel.elastic_rounds import ElasticRounds
from gearshift.scheduler.plugins.gavel.policies import make_policy
from gearshift.scheduler.plugins.gavel.policies.base import Policy, PolicyInput
from gearshift.scheduler.plugins.gavel.policies.configs import ElasticAllocation
from gearshift.scheduler.types import Snapshot
from tests.unit.test_elastic_policies import devices, job

WAIT_S = 30.0  # bound on a background solve in these tests (each takes milliseconds)


class Gated:
    """LAS whose solves wait for `gate` once it is cleared (the test holds a solve back),
    counting them; `fail` makes the next one raise."""

    def __init__(self) -> None:
        self.policy: Policy = make_policy("las")
        self.gate = threading.Event()
        self.gate.set()
        self.calls: list[list[str]] = []  # each solve's jobs
        self.fail = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.policy, name)

    def allocate_elastic(self, inp: PolicyInput) -> ElasticAllocation:
        self.calls.append(list(inp.job_ids))
        if not self.gate.wait(WAIT_S):
            raise TimeoutError("the test never opened the gate")
        if self.fail:
            self.fail = False
            raise RuntimeError("the solver broke")
        return self.policy.allocate_elastic(inp)


def rounds_with(policy: Gated) -> ElasticRounds:
    return ElasticRounds(policy, round_seconds=60, min_recompute_seconds=10, in_background=True)  # type: ignore[arg-type]


def busy(rounds: ElasticRounds) -> bool:
    """A solve is under way beside the rounds."""
    return rounds._solving is not None


def solved(rounds: ElasticRounds) -> None:
    """Wait (bounded) for the solve under way to finish."""
    assert rounds._solving is not None, "no solve under way"
    assert rounds._solving.done.wait(WAIT_S), f"the background solve took over {WAIT_S}s"


def test_a_recomputation_runs_beside_the_rounds_and_is_taken_once_done(
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = Gated()
    rounds = rounds_with(policy)
    speeds = {"v100": 1.0}
    a, b, c = (job(name, 2, speeds) for name in "abc")
    cluster = devices(v100=6)

    rounds.allocate(Snapshot(0.0, cluster, (a, b)))  # the first x: solved in the round
    assert rounds.solves == 1 and not busy(rounds)
    assert set(rounds.shares) == {"a", "b"}

    policy.gate.clear()  # the next solve waits until the test lets it go
    targets = rounds.allocate(Snapshot(5.0, cluster, (a, b, c)))  # c arrived: not yet due
    assert len(policy.calls) == 1 and "c" in targets  # started by the fill, without a share
    targets = rounds.allocate(Snapshot(12.0, cluster, (a, b, c)))  # due: solved beside
    assert policy.calls[-1] == ["a", "b", "c"] and busy(rounds)
    assert rounds.solves == 1 and set(rounds.shares) == {"a", "b"}  # the x in force
    assert set(targets) == {"a", "b", "c"}  # the round went on without waiting for it
    rounds.allocate(Snapshot(30.0, cluster, (a, c)))  # b ended while it is solved
    assert len(policy.calls) == 2  # one solve at a time, however due another one is

    policy.gate.set()
    solved(rounds)
    with caplog.at_level(logging.INFO, logger="gearshift.scheduler"):
        rounds.allocate(Snapshot(31.0, cluster, (a, c)))
    (taken,) = [
        r for r in caplog.records if r.getMessage() == "allocation recomputed beside the rounds"
    ]
    assert taken.__dict__["jobs"] == 3 and taken.__dict__["seconds"] >= 0
    assert rounds.solves == 2 and set(rounds.shares) == {"a", "c"}  # b's share left out
    assert rounds.last_reset == 12.0  # in force from when its input was taken
    assert policy.calls[-1] == ["a", "c"]  # b left and 19 s passed: the next is under way
    solved(rounds)
    rounds.allocate(Snapshot(32.0, cluster, (a, c)))
    assert rounds.solves == 3 and not busy(rounds) and not rounds.stale


def test_a_background_solve_that_fails_is_logged_and_tried_again_when_due(
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = Gated()
    rounds = rounds_with(policy)
    speeds = {"v100": 1.0}
    a, b = job("a", 2, speeds), job("b", 2, speeds)
    cluster = devices(v100=4)
    rounds.allocate(Snapshot(0.0, cluster, (a,)))
    policy.fail = True
    rounds.allocate(Snapshot(11.0, cluster, (a, b)))
    solved(rounds)
    with caplog.at_level(logging.ERROR, logger="gearshift.scheduler"):
        targets = rounds.allocate(Snapshot(12.0, cluster, (a, b)))
    assert "recomputing the allocation failed" in caplog.text and "the solver broke" in caplog.text
    assert set(targets) == {"a", "b"} and set(rounds.shares) == {"a"}  # the old x stays
    assert rounds.solves == 1 and len(policy.calls) == 3  # due still: tried again at once
    solved(rounds)
    rounds.allocate(Snapshot(13.0, cluster, (a, b)))
    assert set(rounds.shares) == {"a", "b"} and rounds.solves == 2


def test_without_it_every_recomputation_is_solved_in_its_round() -> None:
    """The simulator's way (and the default): no thread, the round has the new x."""
    policy = Gated()
    rounds = ElasticRounds(policy, round_seconds=60, min_recompute_seconds=10)  # type: ignore[arg-type]
    speeds = {"v100": 1.0}
    cluster = devices(v100=4)
    rounds.allocate(Snapshot(0.0, cluster, (job("a", 2, speeds),)))
    rounds.allocate(Snapshot(11.0, cluster, (job("a", 2, speeds), job("b", 2, speeds))))
    assert not busy(rounds) and rounds.solves == 2 and set(rounds.shares) == {"a", "b"}
