"""In-place membership changes: which processes a running job keeps, drops and adds.

A rescale that keeps at least one of a job's processes need not restart them: at a
global-step boundary the processes move to the next *generation* of the job, a new
process group under its own store prefix. A `Change` says what that generation is:

- `mapping`: ESTs per new rank (contiguous ranges, as everywhere);
- `sources`: for each new rank, the old rank that becomes it, or None for a process that
  joins (started for this generation, with `--join-generation`);
- `master_addr`: where the new generation's rank 0 serves the rendezvous store (the old
  rank 0 keeps serving its own store when it stays rank 0 at the same address);
- `at_step`: the earliest step boundary to apply it at (0: as soon as it can, see below);
- `timeout_s`: how long the change may wait for its processes before it is given up;
- `backend`: the new group's backend when it changes (on GPUs: NCCL needs a GPU per
  process), empty to keep the old one.

Old ranks that are in no `sources` leave: they hand their ESTs' contexts over and exit.
A change at step 0 that adds processes while old rank 0 stays rank 0 waits for its joiners
(`waits_for_joiners`): the job trains on while they start, rehearse their first step
(rehearsal.py) and say so in the store old rank 0 serves; old rank 0 then asks for the
change at the next boundary, so the survivors pause only to regroup. A change at a given
step is applied at that step, its joiners ready or not.
Changes are written, as a JSON list (or one object), to a file every process of the job
reads (`--membership-file`); the per-step control exchange makes all of them apply a
change at the same step. Plain data and checks, free of torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gearshift.common.errors import ValidationError

FLAG = "--membership-file"


@dataclass(frozen=True)
class Change:
    generation: int
    mapping: tuple[int, ...]
    sources: tuple[int | None, ...]  # per new rank: the old rank it was, None: joins
    master_addr: str = ""
    at_step: int = 0
    timeout_s: float = 60.0
    backend: str = ""

    @property
    def procs(self) -> int:
        return len(self.mapping)

    def new_rank(self, old_rank: int) -> int | None:
        """The rank old rank `old_rank` has in this generation (None: it leaves)."""
        for rank, source in enumerate(self.sources):
            if source == old_rank:
                return rank
        return None

    @property
    def joiners(self) -> tuple[int, ...]:
        return tuple(rank for rank, source in enumerate(self.sources) if source is None)

    @property
    def waits_for_joiners(self) -> bool:
        """Whether the survivors train on until the joiners are ready (module docstring)."""
        return self.at_step == 0 and bool(self.joiners) and self.sources[0] == 0

    @property
    def sender(self) -> int:
        """The new rank that sends the training state to the joiners: the first survivor."""
        return next(rank for rank, source in enumerate(self.sources) if source is not None)

    def check(self, num_ests: int, old_procs: int) -> None:
        """A change this job's processes can apply; ValidationError names what is wrong."""
        where = f"{FLAG}: generation {self.generation}"
        if sum(self.mapping) != num_ests or any(count < 1 for count in self.mapping):
            raise ValidationError(
                FLAG, f"{where}: mapping {list(self.mapping)} does not split the {num_ests} ESTs"
            )
        if len(self.sources) != len(self.mapping):
            raise ValidationError(
                FLAG,
                f"{where}: {len(self.sources)} sources for {len(self.mapping)} processes",
            )
        kept = [source for source in self.sources if source is not None]
        if not kept:
            raise ValidationError(FLAG, f"{where}: keeps no process; restart the job instead")
        if len(set(kept)) != len(kept) or not all(0 <= s < old_procs for s in kept):
            raise ValidationError(
                FLAG, f"{where}: sources {list(self.sources)} must be distinct old ranks"
            )
        if len(self.mapping) > 1 and not self.master_addr:
            raise ValidationError(FLAG, f"{where}: master_addr is required for 2+ processes")
        if self.timeout_s <= 0:
            raise ValidationError(FLAG, f"{where}: timeout_s must be > 0")
        if self.backend not in ("", "gloo", "nccl"):
            raise ValidationError(FLAG, f"{where}: backend {self.backend!r} is not gloo or nccl")


def from_plain(data: Any) -> Change:
    if not isinstance(data, dict):
        raise ValidationError(FLAG, f"a change must be a JSON object, not {type(data).__name__}")
    try:
        return Change(
            generation=int(data["generation"]),
            mapping=tuple(int(count) for count in data["mapping"]),
            sources=tuple(None if s is None else int(s) for s in data["sources"]),
            master_addr=str(data.get("master_addr", "")),
            at_step=int(data.get("at_step", 0)),
            timeout_s=float(data.get("timeout_s", 60.0)),
            backend=str(data.get("backend", "")),
        )
    except KeyError as exc:
        raise ValidationError(FLAG, f"a change lacks {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ValidationError(FLAG, f"a change has a bad value: {exc}") from None


def to_plain(change: Change) -> dict[str, Any]:
    return {
        "generation": change.generation,
        "mapping": list(change.mapping),
        "sources": list(change.sources),
        "master_addr": change.master_addr,
        "at_step": change.at_step,
        "timeout_s": change.timeout_s,
        "backend": change.backend,
    }


def parse(text: str) -> list[Change]:
    """The changes in a membership file's text: a JSON list of changes, or one change."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValidationError(FLAG, f"is not valid JSON: {exc}") from None
    return [from_plain(item) for item in (data if isinstance(data, list) else [data])]


def write(path: Path, changes: Sequence[Change]) -> None:
    """Replace the file atomically, so a process never reads half of it."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps([to_plain(change) for change in changes]))
    tmp.replace(path)


class MembershipFile:
    """The next change a process may apply, read from its file when the file changes."""

    def __init__(self, path: Path, generation: int) -> None:
        self.path = path
        self.generation = generation  # the generation this process is in
        self._seen: tuple[int, int] | None = None
        self._changes: list[Change] = []

    def _read(self) -> list[Change]:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return []
        key = (stat.st_mtime_ns, stat.st_size)
        if key != self._seen:
            self._seen = key
            self._changes = []  # a bad file is reported once, then ignored until rewritten
            self._changes = parse(self.path.read_text())
        return self._changes

    def next_change(self, step: int) -> Change | None:
        """The change to generation + 1 if it may be applied at the boundary after `step`;
        ValidationError when the file cannot be read as changes (once per version)."""
        for change in self._read():
            if change.generation == self.generation + 1 and step >= change.at_step:
                return change
        return None

    def reject(self, change: Change) -> None:
        """Forget a change this process cannot apply (until the file is written again)."""
        self._changes = [c for c in self._changes if c != change]

    def find(self, generation: int, rank: int, mapping: Sequence[int]) -> Change:
        """The change a process that joins at `generation` as `rank` of `mapping` is part of."""
        flag = "--join-generation"
        change = next((c for c in self._read() if c.generation == generation), None)
        if change is None:
            raise ValidationError(flag, f"{self.path} has no change to generation {generation}")
        if tuple(mapping) != change.mapping:
            raise ValidationError(
                flag,
                f"generation {generation} maps ESTs {list(change.mapping)}, not {list(mapping)}",
            )
        if not 0 <= rank < change.procs or change.sources[rank] is not None:
            raise ValidationError(
                flag, f"rank {rank} is not a process that joins generation {generation}"
            )
        return change
