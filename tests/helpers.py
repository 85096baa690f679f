"""Helpers shared by the tests: bounded waits, daemon calls."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[1]


def repo_on_pythonpath() -> str:
    """PYTHONPATH with the repository first (for the job modules under tests/ that training
    processes import), then what it held."""
    return os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))


def wait_until(
    predicate: Callable[[], T], timeout: float, message: str, interval: float = 0.05
) -> T:
    """Poll predicate until it returns something truthy; fail with `message` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s: {message}")
        time.sleep(interval)


def live_pids(pid_files: Iterable[Path], commands: Iterable[bytes] = ()) -> list[int]:
    """Pids written in these files whose processes still run (a zombie has exited). With
    `commands`, only processes whose command line has one of these words and that work in
    the pid file's folder (a training process runs in its task's): a pid file may outlive
    its process, and its pid be another test's process by now, which must not be killed."""
    wanted = set(commands)
    found = []
    for path in pid_files:
        try:
            pid = int(path.read_text())
            if wanted:
                argv = set(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"))
                here = Path(os.readlink(f"/proc/{pid}/cwd")) == path.parent.resolve()
                if not (wanted & argv and here):
                    continue
        except (OSError, ValueError):  # gone, or its file is being written
            continue
        if running(pid):
            found.append(pid)
    return found


def running(pid: int) -> bool:
    """Whether the process still runs (a zombie has exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def scheduler_config(folder: Path, **sections: Any) -> list[str]:
    """`--config FILE` for a scheduler daemon: the file's sections as keyword arguments, in
    the file's own keys (`round={"seconds": 1}`, `profile={"allocate": {"name":
    "easyscale"}}`), written as `scheduler.yaml` in `folder` (a new name if one is there)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "scheduler.yaml"
    index = 1
    while path.exists():
        index += 1
        path = folder / f"scheduler-{index}.yaml"
    path.write_text(yaml.safe_dump(dict(sections), sort_keys=False))
    return ["--config", str(path)]


# The scheduler these tests were written against, before it had a configuration file:
# EasyScale's greedy allocator re-planned at every event, no collocation, nothing bounded,
# the decision in the scheduler's own process, every heartbeat taken by the scheduler itself.
# A test of another plugin names it (`single_seed("las")`); the default profile (the union)
# has tests of its own.
def single_seed(policy: str = "easyscale") -> dict[str, Any]:
    """The scheduler file's sections for `policy` alone (a Gavel objective rigid and
    recomputed every round after a change, as Gavel runs it)."""
    from gearshift.scheduler.plugins.registry import ObjectiveArgs, Point, plugin

    allocate: dict[str, Any] = {"name": policy}
    found = plugin(Point.ALLOCATE, policy)
    if found is not None and issubclass(found.args, ObjectiveArgs):
        allocate["args"] = {"elastic": False, "minRecomputeSeconds": 0}
    return {
        "round": {
            "maxStarts": 0,
            "maxMoves": 0,
            "preemptExemptSeconds": 0,
            "eventRounds": "always",
            "decisionProcess": False,
        },
        "heartbeats": {"relays": 0},
        "profile": {"allocate": allocate, "collocate": {"name": "none"}},
    }
