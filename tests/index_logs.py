"""What the training processes of a dynamic-mode job read, from their index logs.

A worker daemon started with `--index-log-dir DIR` has each training process of a
dynamic-mode job append to a file of its own in DIR (gearshift.worker.datasource): a
`begin` line (start step, ESTs, shards its release put back, its placement), a `read`
line per shard (step, EST, epoch, shard, sample indices) and, in the log of the process
that wrote a checkpoint, a `covered` line per EST of the placement. From those: which
samples each epoch read, which shards were read more than once, and which reads a
process made after the last checkpoint that covered them (the steps a kill rolled back).
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Ref = tuple[int, int]  # (epoch, shard)


@dataclass
class ProcessLog:
    """One training process (one incarnation of one rank)."""

    path: Path
    start: int = -1
    ests: tuple[int, ...] = ()
    placement: str = ""
    started_ns: int = 0  # from the file's name: <job>.rank<R>.<pid>.<ns>.jsonl
    reads: list[dict[str, Any]] = field(default_factory=list)
    covered: dict[int, int] = field(default_factory=dict)  # EST -> step of its last cover

    def uncovered(self, covered: dict[int, int]) -> list[Ref]:
        """Shards read for steps that no cover (EST -> step, its placement's) holds."""
        return [
            (r["epoch"], r["shard"])
            for r in self.reads
            if r["step"] >= covered.get(r["est"], self.start)
        ]


def load(directory: Path, job_id: str) -> list[ProcessLog]:
    """The job's process logs, in the order the processes started; a line cut by SIGKILL
    mid-write is skipped."""
    logs = []
    paths = directory.glob(f"{job_id}.rank*.jsonl")
    for path in sorted(paths, key=lambda p: int(p.name.split(".")[-2])):
        log = ProcessLog(path, started_ns=int(path.name.split(".")[-2]))
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record["kind"] == "begin":
                log.start, log.ests = record["step"], tuple(record["ests"])
                log.placement = record["placement"]
            elif record["kind"] == "read":
                log.reads.append(record)
            elif record["kind"] == "covered":
                log.covered[record["est"]] = record["step"]
        logs.append(log)
    return logs


def reads(logs: list[ProcessLog]) -> Counter[Ref]:
    """How many times each (epoch, shard) was read."""
    return Counter((r["epoch"], r["shard"]) for log in logs for r in log.reads)


def read_twice(logs: list[ProcessLog]) -> Counter[Ref]:
    """Reads beyond the first of each (epoch, shard)."""
    seen = reads(logs)
    return seen - Counter(set(seen))


def covers(logs: list[ProcessLog]) -> dict[str, dict[int, int]]:
    """placement -> EST -> the step of the last checkpoint that covered its reads."""
    out: dict[str, dict[int, int]] = {}
    for log in logs:
        mine = out.setdefault(log.placement, {})
        for est, step in log.covered.items():
            mine[est] = max(mine.get(est, step), step)
    return out


def uncovered(logs: list[ProcessLog]) -> Counter[Ref]:
    """Every process's reads after its placement's last covering checkpoint (a finished
    job's last placement covered everything: only killed ones have any)."""
    by_placement = covers(logs)
    return Counter(ref for log in logs for ref in log.uncovered(by_placement[log.placement]))


def placements(logs: list[ProcessLog]) -> list[list[ProcessLog]]:
    """The logs by placement, in the order the placements started."""
    groups: dict[str, list[ProcessLog]] = {}
    for log in logs:
        groups.setdefault(log.placement, []).append(log)
    return sorted(groups.values(), key=lambda g: min(log.started_ns for log in g))


def rolled_back(logs: list[ProcessLog]) -> int:
    """Reads of steps that the next placement ran again (it resumed from a checkpoint
    before them): what a kill costs in steps, counted in reads."""
    ordered = placements(logs)
    count = 0
    for group, after in itertools.pairwise(ordered):
        resumed = after[0].start
        count += sum(1 for log in group for r in log.reads if r["step"] >= resumed)
    return count


def samples_by_epoch(logs: list[ProcessLog]) -> dict[int, Counter[int]]:
    """epoch -> how many times each sample index was read in it."""
    out: dict[int, Counter[int]] = {}
    for log in logs:
        for r in log.reads:
            out.setdefault(r["epoch"], Counter()).update(r["indices"])
    return out


def unread(logs: list[ProcessLog], size: int) -> dict[int, int]:
    """epoch -> samples of 0..size-1 never read in it, for every epoch but the last one
    started (which the job's end cuts short); empty when every sample was read."""
    by_epoch = samples_by_epoch(logs)
    out = {}
    for epoch in sorted(by_epoch)[:-1]:
        missing = size - len(set(by_epoch[epoch]) & set(range(size)))
        if missing:
            out[epoch] = missing
    return out
