"""gearshift.common.facts: what every service and the client agree on, and its import rule."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from gearshift.common import facts
from gearshift.v1 import common_pb2

FACTS = Path(facts.__file__)


def test_facts_import_only_the_contracts_and_the_standard_library() -> None:
    """The client-only install imports this module, so it may need nothing more."""
    names: list[str] = []
    for node in ast.walk(ast.parse(FACTS.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append(node.module or "")
    stdlib = {"__future__"} | sys.stdlib_module_names
    assert [n for n in names if n != "gearshift.v1" and n.split(".")[0] not in stdlib] == []


def spec(epochs: int, batch: int, size: int) -> common_pb2.JobSpec:
    dataset = common_pb2.DatasetSpec(size=size)
    return common_pb2.JobSpec(epochs=epochs, global_batch_size=batch, dataset=dataset)


@pytest.mark.parametrize(
    ("job", "steps"),
    [
        (common_pb2.JobSpec(total_steps=7), 7),
        (common_pb2.JobSpec(total_steps=0), 0),  # set, though 0
        (spec(epochs=2, batch=8, size=20), 6),
        (spec(epochs=2, batch=8, size=16), 4),
        (spec(epochs=3, batch=0, size=5), 15),  # batch 0 counts as 1
        (spec(epochs=3, batch=8, size=0), 3),  # at least one step an epoch
    ],
)
def test_total_steps(job: common_pb2.JobSpec, steps: int) -> None:
    assert facts.total_steps(job) == steps


def test_terminal_and_ended_states() -> None:
    assert {
        common_pb2.JOB_STATE_SUCCEEDED,
        common_pb2.JOB_STATE_FAILED,
        common_pb2.JOB_STATE_CANCELLED,
    } == facts.TERMINAL_STATES
    assert set(facts.ENDED_TASK_STATES) == {
        common_pb2.TASK_STATE_CHECKPOINTED,
        common_pb2.TASK_STATE_COMPLETED,
        common_pb2.TASK_STATE_FAILED,
        common_pb2.TASK_STATE_LEFT,  # every process of the task left in an in-place change
    }


def test_runtime_exit_codes() -> None:
    assert (facts.EXIT_COMPLETED, facts.EXIT_BAD_INPUT, facts.EXIT_STOPPED) == (0, 2, 75)
    assert facts.CLEAN_EXITS == (0, 75)


def test_shard_holder_id() -> None:
    assert facts.shard_holder_id("job-1", 3) == "job-1/est-3"


@pytest.mark.parametrize("value", ["cpu", "v100", "a100-80g", "t4_x", "0"])
def test_accelerator_types_accepted(value: str) -> None:
    assert facts.is_accelerator_type(value)


@pytest.mark.parametrize("value", ["", "V100", "-x", "_x", "a b", "a.b", "gpu!"])
def test_accelerator_types_refused(value: str) -> None:
    assert not facts.is_accelerator_type(value)


def test_determinism_names_are_the_enum_names() -> None:
    levels = common_pb2.DeterminismLevel
    assert set(facts.DETERMINISM_NAMES) == set(levels.values())
    for level, name in facts.DETERMINISM_NAMES.items():
        full = levels.Name(level)
        if level == common_pb2.DETERMINISM_LEVEL_UNSPECIFIED:
            assert name == facts.DEFAULT_DETERMINISM
        else:
            assert full == facts.DETERMINISM_PREFIX + name
    assert facts.DETERMINISM_LEVELS == ("D0", "D1", "D2")
    assert facts.DEFAULT_DETERMINISM in facts.DETERMINISM_LEVELS
