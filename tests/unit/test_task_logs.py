"""The worker's log files: tail, follow (new lines, the end of the task, a capped file)."""

from __future__ import annotations

import threading
from pathlib import Path

from gearshift.worker import task_logs


def test_tail_gives_the_last_complete_lines(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_text("".join(f"line {i}\n" for i in range(10)) + "partial")
    lines, offset = task_logs.tail(log, 3)
    assert lines == ["line 7", "line 8", "line 9"]
    assert offset == len(log.read_bytes()) - len("partial")
    assert task_logs.tail(tmp_path / "none.log", 3) == ([], 0)


def test_cap_keeps_the_newest_half_at_a_line_boundary(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_text("".join(f"{i:05d}\n" for i in range(1000)))  # 6000 bytes
    assert not task_logs.cap_log(log, cap=10_000)
    assert task_logs.cap_log(log, cap=2000)
    kept = log.read_text().splitlines()
    assert kept[-1] == "00999" and len(kept) < 1000 // 2 and all(len(k) == 5 for k in kept)


def test_follow_sends_history_then_new_lines_until_the_task_ends(tmp_path: Path) -> None:
    paths = {0: tmp_path / "rank0.log", 1: tmp_path / "rank1.log"}
    paths[0].write_text("old 0, a long line that a cap will drop\n")
    paths[1].write_text("old 1\n")
    done = threading.Event()
    reader = task_logs.follow(
        paths, 10, keep_following=True, done=done.is_set, active=lambda: True, poll=0.01
    )
    assert [next(reader), next(reader)] == [
        (0, "old 0, a long line that a cap will drop"),
        (1, "old 1"),
    ]
    with paths[1].open("a") as f:
        f.write("new 1\n")
    assert next(reader) == (1, "new 1")
    paths[0].write_text("capped\n")  # shorter than before: read from the start
    assert next(reader) == (0, "capped")
    with paths[0].open("a") as f:
        f.write("last words without a newline")
    done.set()
    assert list(reader) == [(0, "last words without a newline")]


def test_without_follow_only_the_history(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_text("a\nb\n")
    reader = task_logs.follow(
        {0: log}, 1, keep_following=False, done=lambda: False, active=lambda: True
    )
    assert list(reader) == [(0, "b")]
