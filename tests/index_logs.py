"""What the training processes of a dynamic-mode job read, from their index logs.

A worker daemon started with `--index-log-dir DIR` has each training process of a
dynamic-mode job append to a file of its own in DIR (gearshift.worker.datasource): a
`begin` line (start step, ESTs, shards its release put back, its placement), a `read`
line per shard (step, EST, epoch, shard, sample indices) and, in the log of the process
that wrote a checkpoint, a `covered` line per EST of the placement. From those: which
samples each epoch read, which shards were read more than once, and which reads a
process made after the last checkpoint that covered them (the steps a kill rolled back).

`audit` sets them against what the shard manager gave back (its `holder released`
log lines name every shard with the step that read it): the exact accounting of
issue 16 (redeliveries equal what the killed holders had not covered).
"""

from __future__ import annotations

import itertools
import json
import re
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
    """The logs by placement, in the order the placements started; a process killed
    before its start-up release (no `begin` line) read nothing and is left out."""
    groups: dict[str, list[ProcessLog]] = {}
    for log in logs:
        if log.start < 0:
            continue
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


Read = tuple[int, int, int, int]  # (EST, epoch, shard, step)


def _key(record: dict[str, Any]) -> Read:
    return (record["est"], record["epoch"], record["shard"], record["step"])


def rolled_back_reads(logs: list[ProcessLog]) -> Counter[Read]:
    """The reads of steps the next placement ran again: those at or after the step it
    resumed from (its last durable checkpoint), which no checkpoint holds."""
    out: Counter[Read] = Counter()
    for group, after in itertools.pairwise(placements(logs)):
        resumed = after[0].start
        out.update(_key(r) for log in group for r in log.reads if r["step"] >= resumed)
    return out


@dataclass(frozen=True)
class Given:
    """One shard a release gave back: the read (EST, epoch, shard, read step), the step
    the release resumed from (None: the scheduler's release of held shards only) and
    whether its acknowledgement was undone (else it was held, unacknowledged)."""

    read: Read
    resume: int | None
    acknowledged: bool


def given_back(shard_manager_log: str, job_id: str) -> list[Given]:
    """Every shard the shard manager gave back from the job's holders: each release of
    each incarnation (a restart appends to the log) logs `holder released ...
    holder_id=<job>/est-<i> ... resume_step=R ... released=[...] request_id=ID`, each
    item epoch:shard:read step:acknowledged. A retried release (same request id) is
    logged again with the first call's answer: counted once (the first call's line is
    missing when the shard manager was killed between carrying it out and logging it)."""
    pattern = re.compile(
        rf"holder released dataset_id={re.escape(job_id)} holder_id={re.escape(job_id)}"
        r"/est-(\d+) .*?resume_step=(\S+) .*?released=\[([^\]]*)\](?: request_id=(\S*))?"
    )
    out = []
    seen: set[tuple[str, str]] = set()
    for est, resume, items, request_id in pattern.findall(shard_manager_log):
        if request_id:
            if (est, request_id) in seen:
                continue
            seen.add((est, request_id))
        for raw in items.split(","):
            item = raw.strip().strip("'\"")
            if item:
                epoch, shard, step, acked = (int(x) for x in item.split(":"))
                out.append(
                    Given(
                        (int(est), epoch, shard, step),
                        None if resume == "None" else int(resume),
                        bool(acked),
                    )
                )
    return out


@dataclass
class Audit:
    """Reads set against releases. Exact when: nothing rolled back was kept (`lost`),
    nothing a checkpoint held was given back (`held_back`: a read before the step its
    release resumed from), and what was given back beyond the logged rolled-back reads
    is only grants their process died before logging (`unlogged`: at most one per EST
    per kill)."""

    rolled_back: Counter[Read]
    given_back: Counter[Read]
    lost: Counter[Read]
    held_back: Counter[Read]
    unlogged: Counter[Read]

    def figures(self) -> str:
        return (
            f"rolled back {sum(self.rolled_back.values())}, given back "
            f"{sum(self.given_back.values())} (unlogged grants {sum(self.unlogged.values())}), "
            f"lost {sum(self.lost.values())}, covered but given back "
            f"{sum(self.held_back.values())}"
        )


def audit(logs: list[ProcessLog], given: list[Given]) -> Audit:
    """Set the index logs against the shard manager's releases (see Audit)."""
    rolled = rolled_back_reads(logs)
    back = Counter(g.read for g in given)
    return Audit(
        rolled_back=rolled,
        given_back=back,
        lost=rolled - back,
        held_back=Counter(
            g.read for g in given if g.resume is not None and not 0 <= g.resume <= g.read[3]
        ),
        unlogged=back - rolled,
    )
