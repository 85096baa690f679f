"""A job's step log, read back: one record per global step, as rank 0 wrote it.

The runtime's rank 0 appends a JSON line per global step to `steps.jsonl` in the job's
checkpoint folder: the step, each EST's float32 loss as hex bytes, and the time. A
restart from a checkpoint runs some steps again and appends them again (the last
record of a step wins). A line cut by a crash is skipped, whatever follows it. A read
after a step returns what was written after that step's last record: a restart's reruns
replace what they rerun, as they are written.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable
from pathlib import Path

from gearshift.v1 import common_pb2

TAIL_BYTES = 64 * 1024  # the first block a refresh reads from the log's end


def parse_line(line: str) -> common_pb2.StepLoss | None:
    """One line's record (the mean of its ESTs' losses), or None for a line that is not one."""
    try:
        record = json.loads(line)
        bits = record["loss_bits"]
        losses = [struct.unpack(">f", bytes.fromhex(b))[0] for b in bits]
        step, when = int(record["step"]), float(record.get("time", 0.0))
    except (ValueError, KeyError, TypeError, struct.error):
        return None
    if step <= 0 or not losses:
        return None
    return common_pb2.StepLoss(step=step, time=when, loss=sum(losses) / len(losses))


def steps_after(lines: Iterable[str], after_step: int) -> list[common_pb2.StepLoss]:
    """The records of steps after `after_step` in step order, the last written of each."""
    latest: dict[int, common_pb2.StepLoss] = {}
    for line in lines:
        record = parse_line(line)
        if record is not None and record.step > after_step:
            latest[record.step] = record
    return [latest[step] for step in sorted(latest)]


def read_steps(path: Path, after_step: int, block: int = TAIL_BYTES) -> list[common_pb2.StepLoss]:
    """The step log at `path` after `after_step` (nothing when there is no log yet): the
    records written after the last record of a step <= `after_step`, read from the end in
    growing blocks (a refresh of a long log reads its tail, not all of it). A last line
    without its newline is still being written and waits for the next read."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return []
    with f:
        size = f.seek(0, os.SEEK_END)
        window = block if after_step > 0 else size
        while True:
            start = max(0, size - window)
            f.seek(start)
            data = f.read(size - start)
            lines = data[: data.rfind(b"\n") + 1].decode(errors="replace").splitlines()
            if start > 0 and lines:
                lines = lines[1:]  # the first line read may be cut
            for i in range(len(lines) - 1, -1, -1):
                record = parse_line(lines[i])
                if record is not None and record.step <= after_step:
                    return steps_after(lines[i + 1 :], after_step)
            if start == 0:
                return steps_after(lines, after_step)
            window *= 4
