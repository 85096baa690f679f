"""A job's process group, generation after generation.

A training process joins its job's group once at start; an in-place membership change
(membership.py) then forms the next generation's group under its own store prefix
(`<group>/g<generation>`, as each placement has its own group name), so that a stray
message of the old generation can never be taken for one of the new. The store is served
by the generation's rank 0; a process that served the old one and stays rank 0 at the
same address keeps serving it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store, TCPStore

from gearshift.worker.runtime.comm import Comm
from gearshift.worker.runtime.interface import set_interface
from gearshift.worker.runtime.membership import Change


def prefix(group: str, generation: int) -> str:
    """The store prefix of a generation (generation 0 keeps the group's name)."""
    return group if generation == 0 else f"{group}/g{generation}"


def tcp_store(master_addr: str, host_it: bool, world: int, timeout_s: float) -> TCPStore:
    """The rendezvous store at HOST:PORT, served here when `host_it`. A process of another
    job that reaches this port waits for its own peers under its own prefix and times out,
    instead of joining this job's group."""
    host, _, port = master_addr.rpartition(":")
    return TCPStore(
        host,
        int(port),
        world,
        is_master=host_it,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,  # a stranger's connection must not count as a peer
    )


@dataclass
class ProcessGroups:
    """This process's membership in its job's groups; `form` replaces the current one."""

    group: str  # the job's name in the rendezvous
    backend: str
    device: torch.device  # this process's device (NCCL binds its communicator to it)
    transport: torch.device  # where the backend takes tensors from
    timeout_s: float  # the collectives' timeout
    _served: TCPStore | None = None
    _served_at: str = ""
    address: str = ""  # where the current generation's store is ("": no group)
    _announced: TCPStore | None = None  # a joiner's connection, kept for its group
    _announced_at: str = ""

    def form(
        self,
        generation: int,
        rank: int,
        world: int,
        master_addr: str,
        *,
        join_timeout_s: float,
        backend: str = "",
    ) -> Comm:
        """Leave the current group (if any) and join generation `generation`'s; waits up to
        `join_timeout_s` for its other processes. `backend`: a new one (empty: the same)."""
        self.close()
        self.address = master_addr if world > 1 else ""
        if backend and backend != self.backend:
            self.backend = backend
            self.transport = self.device if backend == "nccl" else torch.device("cpu")
        if world > 1:
            if self.backend == "gloo":
                set_interface(master_addr)
            store = self._store(master_addr, rank, world, join_timeout_s)
            dist.init_process_group(
                self.backend,
                store=PrefixStore(prefix(self.group, generation), store),
                rank=rank,
                world_size=world,
                timeout=timedelta(seconds=join_timeout_s),
                device_id=self.device if self.backend == "nccl" else None,
            )
            if join_timeout_s != self.timeout_s:
                _set_timeout(timedelta(seconds=self.timeout_s))
        return Comm(rank, world, transport=self.transport)

    def _store(self, master_addr: str, rank: int, world: int, timeout_s: float) -> Store:
        if rank == 0 and self._served is not None and self._served_at == master_addr:
            self._served.set_timeout(timedelta(seconds=timeout_s))
            return self._served
        if rank != 0 and self._announced is not None and self._announced_at == master_addr:
            store, self._announced = self._announced, None
            store.set_timeout(timedelta(seconds=timeout_s))
            return store
        store = tcp_store(master_addr, rank == 0, world, timeout_s)
        self._served, self._served_at = (store, master_addr) if rank == 0 else (None, "")
        return store

    # -- joiners that say they are ready (membership.py, Change.waits_for_joiners) ------

    def waits(self, change: Change, procs: int) -> bool:
        """Whether this generation's processes (`procs` of them) wait for `change`'s joiners:
        old rank 0 must serve the store they announce themselves in, so the change keeps
        its address (a lone process has no store yet and serves one at the new address)."""
        return change.waits_for_joiners and (procs == 1 or change.master_addr == self.address)

    def joiners_ready(self, change: Change) -> bool:
        """Old rank 0: whether every joiner of `change` has announced itself (it serves the
        store from now on, if it did not already). Asked at every step boundary: the store
        it serves is used as it is, its timeout the running generation's."""
        store: Store | None = self._served if self._served_at == change.master_addr else None
        if store is None:
            store = self._store(change.master_addr, 0, change.procs, change.timeout_s)
        return bool(store.check([_ready_key(self.group, change, rank) for rank in change.joiners]))

    def announce(self, change: Change, rank: int) -> None:
        """A joiner: say in old rank 0's store that rank `rank` is ready to join."""
        store = tcp_store(change.master_addr, False, change.procs, change.timeout_s)
        store.set(_ready_key(self.group, change, rank), "1")
        self._announced, self._announced_at = store, change.master_addr  # one connection

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _ready_key(group: str, change: Change, rank: int) -> str:
    return f"{prefix(group, change.generation)}/ready/{rank}"


def _set_timeout(timeout: timedelta) -> None:
    """The collectives' timeout once the group is formed (joining waits a shorter while)."""
    from torch.distributed import distributed_c10d  # noqa: PLC0415

    distributed_c10d._set_pg_timeout(timeout)
