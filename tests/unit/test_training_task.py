"""A spec travels to the training process as one message, not as flags.

The daemon's command carries no spec field: just the TrainingTask file and the rank. The
settings a process resolves from that message are exactly those it derived from the flags
the daemon passed before (task_settings_golden.json: each representative request's old
argv and the settings the old runtime parsed from it), and the reference runner's flags,
the old argv included, resolve to the same settings through the same message.
"""

from __future__ import annotations

import dataclasses
import json
import stat
from pathlib import Path
from typing import Any

import pytest

from gearshift.common.errors import ValidationError
from gearshift.v1 import training_pb2
from gearshift.worker.command import plan_task
from gearshift.worker.run import main, read_command_line
from gearshift.worker.training_task import TASK_FILE, read_task, resolve, write_task
from tests.unit.task_requests import CASES, TASK_DIR, Case

GOLDEN: dict[str, dict[str, Any]] = json.loads(
    (Path(__file__).parent / "task_settings_golden.json").read_text()
)


def _task(case: Case) -> training_pb2.TrainingTask:
    plan = plan_task(case.request, case.worker_id, list(case.device_types))
    return plan.training_task(case.settings, TASK_DIR, case.code_dir)


def _plain(value: Any) -> Any:
    """Settings as the golden file holds them: paths as text, tuples as lists, enums' values."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return getattr(value, "value", value)


def _settings(task: training_pb2.TrainingTask, rank: int) -> dict[str, Any]:
    return dict(_plain(dataclasses.asdict(resolve(task, rank))))


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_command_carries_no_spec_field(name: str) -> None:
    case = CASES[name]()
    plan = plan_task(case.request, case.worker_id, list(case.device_types))
    task_file = TASK_DIR / TASK_FILE
    argv = plan.command(case.rank, case.settings, task_file)
    rank = str(case.rank)
    assert argv == ["py", "-m", "gearshift.worker.run", "--task", str(task_file), "--rank", rank]
    token = case.request.job_token
    task = _task(case)
    assert not token or token.encode() not in task.SerializeToString()


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_message_gives_the_settings_the_flags_gave(name: str) -> None:
    """Daemon -> file -> process: the same settings as the old daemon's flags."""
    case = CASES[name]()
    task = training_pb2.TrainingTask.FromString(_task(case).SerializeToString())
    assert _settings(task, case.rank) == GOLDEN[name]["settings"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_old_flags_still_resolve_to_the_same_settings(name: str, tmp_path: Path) -> None:
    """The reference runner's flags (here, the old daemon's argv) build the same message."""
    root = str(tmp_path)
    for folder in ("w/tasks/t", "w/code/abc"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "w/tasks/t/config.json").write_text('{"hidden": 8}')
    argv = [a.replace("/w/", f"{root}/w/") for a in GOLDEN[name]["argv"][3:]]
    expected = json.loads(json.dumps(GOLDEN[name]["settings"]).replace('"/w/', f'"{root}/w/'))
    task, rank = read_command_line(argv)
    assert rank is not None
    assert _settings(task, rank) == expected


def test_the_task_file_is_its_owners_only(tmp_path: Path) -> None:
    task = _task(CASES["elastic"]())
    path = tmp_path / TASK_FILE
    write_task(task, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_task(path) == task
    path.write_bytes(b"\xff\xff")
    with pytest.raises(ValidationError, match=r"--task: .* is not a TrainingTask"):
        read_task(path)


def test_a_task_file_takes_only_its_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / TASK_FILE
    write_task(_task(CASES["dynamic"]()), path)
    assert read_command_line(["--task", str(path), "--rank", "0"])[1] == 0
    assert main(["--task", str(path), "--rank", "0", "--steps", "3"]) == 2
    assert "--task: takes --rank only, not --steps" in capsys.readouterr().err
    assert main(["--task", str(path)]) == 2
    assert "--rank: is required with --task" in capsys.readouterr().err
    assert main(["--task", str(path), "--rank", "1"]) == 2
    assert "--rank: must be between 0 and 0" in capsys.readouterr().err
