"""A task's log files: read their tail, follow them, and keep each under a size cap.

Each training process writes its stdout and stderr to `rank<R>.log` in the task's
folder (opened for appending). The worker keeps the history there: the last
`LOG_CAP_BYTES` of each file - when a file grows past the cap, its older half is
dropped (the kept lines are rewritten at the start; a line written during that
rewrite of a few milliseconds may be lost, which a log can afford). A follower that
finds its file shorter than where it was reads it again from the start.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

LOG_CAP_BYTES = 8 * 1024 * 1024
FOLLOW_POLL_SECONDS = 0.2  # how often a follower looks for new bytes
_TAIL_READ_BYTES = 1024 * 1024  # history a tail request reads at most, per file


def cap_log(path: Path, cap: int = LOG_CAP_BYTES) -> bool:
    """Drop the older half of a log over `cap` bytes (at a line boundary); True if it did."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    if size <= cap:
        return False
    with path.open("r+b") as f:
        f.seek(size - cap // 2)
        kept = f.read()
        newline = kept.find(b"\n")
        kept = kept[newline + 1 :] if newline >= 0 else kept
        f.seek(0)
        f.truncate()
        f.write(kept)
    return True


def tail(path: Path, lines: int) -> tuple[list[str], int]:
    """The last `lines` complete lines of a file and the offset after them."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - _TAIL_READ_BYTES)
            f.seek(start)
            data = f.read(size - start)
    except FileNotFoundError:
        return [], 0
    end = data.rfind(b"\n") + 1  # a last line still being written waits for its newline
    text = data[:end].decode(errors="replace").splitlines()
    if start > 0 and text:
        text = text[1:]  # the first line read may be cut
    return text[-lines:] if lines > 0 else [], start + end


def follow(
    paths: Mapping[int, Path],
    lines: int,
    *,
    keep_following: bool,
    done: Callable[[], bool],
    active: Callable[[], bool],
    poll: float = FOLLOW_POLL_SECONDS,
) -> Iterator[tuple[int, str]]:
    """(rank, line): each file's last `lines` lines, then, with keep_following, new lines
    as they are written, until `done()` (the task ended: its files are read to the end
    once more) or until the reader goes away (`active()` false)."""
    offsets: dict[int, int] = {}
    for rank, path in sorted(paths.items()):
        history, offsets[rank] = tail(path, lines)
        for line in history:
            yield rank, line
    if not keep_following:
        return
    while active():
        finished = done()  # read before the files, so the last lines are not missed
        got = False
        for rank, path in sorted(paths.items()):
            new, offsets[rank] = _read_from(path, offsets[rank], whole=finished)
            for line in new:
                got = True
                yield rank, line
        if finished:
            return
        if not got:
            time.sleep(poll)  # polling a file for growth: nothing to wait on instead


def _read_from(path: Path, offset: int, *, whole: bool = False) -> tuple[list[str], int]:
    """Complete lines from `offset` (and a last unfinished one too when `whole`)."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size < offset:  # capped meanwhile: read what is kept
                offset = 0
            f.seek(offset)
            data = f.read(size - offset)
    except FileNotFoundError:
        return [], offset
    end = len(data) if whole else data.rfind(b"\n") + 1
    return data[:end].decode(errors="replace").splitlines(), offset + end
