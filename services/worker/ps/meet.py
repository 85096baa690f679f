"""How a PS phase's processes meet when they run on several hosts: a TCP store.

On one host they meet through a file store in the checkpoint folder (launch.py). Across
hosts, every process must reach the store over the network, so one launcher (the
coordinator) serves a TCP store at HOST:PORT and every process, its own included, is a
client of it. The store lives in the coordinator launcher, not in rank 0 as torch's
`tcp://` would put it: rank 0 may leave rpc.shutdown() while a peer still syncs its call
counts through the store (a "Connection reset by peer" seen with tcp://), and the
coordinator outlives every process of the phase (it waits for all their results).

`Meeting.roles` says which of the phase's processes a launcher runs (None: all of them).
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlparse

from torch._C._distributed_c10d import PrefixStore, Store, TCPStore
from torch.distributed.rendezvous import register_rendezvous_handler

SCHEME = "gearshift-tcp"
ROLES = ("ps", "worker")


@dataclass(frozen=True)
class Meeting:
    """A phase spread over launchers: the store's HOST:PORT, whether this launcher serves
    it (and publishes the phase's checkpoint), and the processes this launcher runs."""

    store: str
    serve: bool
    roles: frozenset[tuple[str, int]] | None = None

    def __post_init__(self) -> None:
        host, _, port = self.store.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"the PS store must be HOST:PORT, got {self.store!r}")

    @property
    def host(self) -> str:
        return self.store.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.store.rpartition(":")[2])

    def runs(self, role: str, index: int) -> bool:
        return self.roles is None or (role, index) in self.roles


def parse_roles(text: str) -> frozenset[tuple[str, int]]:
    """'ps:0,worker:1' -> {("ps", 0), ("worker", 1)}; '' -> none (a launcher of a slot
    that the job's processes do not reach)."""
    out: set[tuple[str, int]] = set()
    for item in filter(None, text.split(",")):
        role, _, index = item.strip().partition(":")
        if role not in ROLES or not index.isdigit():
            raise ValueError(f"--roles item {item!r} is not ps:N or worker:N")
        out.add((role, int(index)))
    return frozenset(out)


def check_roles(roles: Iterable[tuple[str, int]], num_ps: int, num_workers: int) -> None:
    counts = {"ps": num_ps, "worker": num_workers}
    bad = sorted(f"{r}:{i}" for r, i in roles if not 0 <= i < counts[r])
    if bad:
        raise ValueError(f"--roles {', '.join(bad)} not in a phase of {num_ps}x{num_workers}")


STORE_TIMEOUT_MAX_S = 7 * 24 * 3600.0  # a scheduler's task has no phase deadline (inf)


def serve_store(meeting: Meeting, timeout_s: float) -> TCPStore:
    """The coordinator's store, listening on every address at the meeting's port; its
    waits bounded by the phase's `timeout_s` (a week when that is infinite: the store
    takes whole milliseconds)."""
    return TCPStore(
        meeting.host,
        meeting.port,
        None,
        True,
        timeout=timedelta(seconds=min(timeout_s, STORE_TIMEOUT_MAX_S)),
        wait_for_workers=False,
    )


def init_method(meeting: Meeting, generation: int) -> str:
    """What rpc.init_rpc is given: this module's scheme, keys under the generation (a store
    serves every phase of a run)."""
    return f"{SCHEME}://{meeting.store}?generation={generation}"


def _handler(
    url: str, timeout: timedelta = timedelta(minutes=5), **_: Any
) -> Generator[tuple[Store, int, int], None, None]:
    parsed = urlparse(url)
    query = {k: v[0] for k, v in parse_qs(parsed.query).items()}
    if parsed.hostname is None or parsed.port is None:
        raise ValueError(f"{SCHEME}:// needs HOST:PORT, got {url!r}")
    store = TCPStore(parsed.hostname, parsed.port, None, False, timeout=timeout)
    yield (
        PrefixStore(f"g{query['generation']}", store),
        int(query["rank"]),
        int(query["world_size"]),
    )
    raise RuntimeError(f"{SCHEME}:// cannot re-rendezvous: a phase has a fixed world")


register_rendezvous_handler(SCHEME, _handler)  # type: ignore[no-untyped-call]
