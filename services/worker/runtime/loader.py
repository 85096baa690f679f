"""Mini-batches for a process's ESTs, built by a few shared loader processes (or in-process).

Batch k of EST i is made by *logical* loader worker j = k mod W of that EST, with
that worker's RNG state R(i, j), as a PyTorch DataLoader with W workers would.
Whichever physical process builds it takes R(i, j), builds the batch, and hands
back the advanced state; the EST's context adopts the state (and its data
position) only when the batch is consumed. So the number of physical loader
processes — none, one, or fewer than the ESTs' logical workers — never changes
a bit, and prefetched-but-unconsumed batches are not part of any checkpoint.
"""

from __future__ import annotations

import multiprocessing
import queue
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from gearshift.worker.runtime.context import EstContext
from gearshift.worker.runtime.data import DataPosition, DataSource, EstStream
from gearshift.worker.runtime.rng import (
    RngState,
    capture,
    install_numpy_generator,
    numpy_generator,
    restore,
)

Collate = Callable[[list[Any]], Any]


class MapDataset(Protocol):
    def __getitem__(self, index: int) -> Any: ...

    def __len__(self) -> int: ...


def build_batch(
    dataset: MapDataset, collate: Collate, indices: Sequence[int], rng: RngState
) -> tuple[Any, RngState]:
    """The batch of `indices`, built inside loader-worker state `rng`; returns the new state."""
    outer_numpy = numpy_generator()
    restore(rng)
    try:
        batch = collate([dataset[i] for i in indices])
        return batch, capture()
    finally:
        install_numpy_generator(outer_numpy)


@dataclass
class _Plan:
    ident: int
    est: int
    step: int
    worker: int
    indices: list[int]
    position_after: DataPosition


def _loader_main(dataset: MapDataset, collate: Collate, tasks: Any, results: Any) -> None:
    torch.set_num_threads(1)
    # Prefetched batches nobody will consume must not keep this process from exiting.
    results.cancel_join_thread()
    while True:
        task = tasks.get()
        if task is None:
            return
        ident, indices, rng = task
        try:
            batch, after = build_batch(dataset, collate, indices, rng)
            results.put((ident, batch, after, None))
        except BaseException:
            results.put((ident, None, None, traceback.format_exc()))


class BatchLoader:
    """Yields the batches of `contexts`' ESTs in consumption order: step by step, EST by EST.

    `procs` physical loader processes (0: build in the calling process) serve
    all ESTs; up to `procs * prefetch` batches are built ahead.
    """

    def __init__(
        self,
        dataset: MapDataset,
        collate: Collate,
        source: DataSource,
        contexts: Sequence[EstContext],
        *,
        per_est_batch: int,
        start_step: int,
        procs: int = 0,
        prefetch: int = 2,
        preserve_caller_rng: bool = False,
    ) -> None:
        self.dataset = dataset
        self.collate = collate
        self.per_est_batch = per_est_batch
        self.contexts = {ctx.est: ctx for ctx in contexts}
        self.workers = len(contexts[0].loader_rng)
        self.preserve_caller_rng = preserve_caller_rng
        self._streams = {ctx.est: EstStream(source, ctx.est, ctx.position) for ctx in contexts}
        self._order = self._consumption_order(sorted(self.contexts), start_step)
        self._planned: deque[_Plan] = deque()
        self._next_ident = 0
        self._procs: list[multiprocessing.process.BaseProcess] = []
        if procs:
            self._start_pool(procs, prefetch)

    @staticmethod
    def _consumption_order(ests: list[int], start_step: int) -> Iterator[tuple[int, int]]:
        step = start_step
        while True:
            for est in ests:
                yield step, est
            step += 1

    def _plan(self) -> _Plan:
        step, est = next(self._order)
        stream = self._streams[est]
        indices = stream.take(self.per_est_batch)
        plan = _Plan(self._next_ident, est, step, step % self.workers, indices, stream.position)
        self._next_ident += 1
        return plan

    def next(self, est: int) -> Any:
        """The next batch, which must be EST `est`'s (ESTs are served in consumption order)."""
        if self._procs:
            return self._next_pooled(est)
        plan = self._plan()
        self._check_order(plan, est)
        ctx = self.contexts[est]
        caller = capture() if self.preserve_caller_rng else None
        batch, after = build_batch(
            self.dataset, self.collate, plan.indices, ctx.loader_rng[plan.worker]
        )
        if caller is not None:
            restore(caller)
        self._commit(plan, after)
        return batch

    @staticmethod
    def _check_order(plan: _Plan, est: int) -> None:
        if plan.est != est:
            raise RuntimeError(f"asked for EST {est}'s batch but EST {plan.est} is next")

    def _commit(self, plan: _Plan, after: RngState) -> None:
        ctx = self.contexts[plan.est]
        ctx.loader_rng[plan.worker] = after
        ctx.position = plan.position_after

    # -- the shared loader processes -------------------------------------------------

    def _start_pool(self, procs: int, prefetch: int) -> None:
        mp = multiprocessing.get_context("fork")
        self._tasks: Any = mp.Queue()
        self._results: Any = mp.Queue()
        self._window = procs * prefetch
        self._inflight: dict[int, tuple[int, int]] = {}  # plan -> (est, worker)
        self._done: dict[int, tuple[Any, RngState]] = {}
        self._undispatched: deque[_Plan] = deque()
        # The state each logical worker will start its next batch from, None while it is busy.
        self._ahead: dict[tuple[int, int], RngState | None] = {
            (est, j): state
            for est, ctx in self.contexts.items()
            for j, state in enumerate(ctx.loader_rng)
        }
        for _ in range(procs):
            proc = mp.Process(
                target=_loader_main,
                args=(self.dataset, self.collate, self._tasks, self._results),
                daemon=True,
            )
            proc.start()
            self._procs.append(proc)

    def _fill(self) -> None:
        while len(self._planned) < self._window:
            plan = self._plan()
            self._planned.append(plan)
            self._undispatched.append(plan)
        for plan in list(self._undispatched):
            key = (plan.est, plan.worker)
            state = self._ahead[key]
            if state is None:
                continue
            self._ahead[key] = None
            self._inflight[plan.ident] = key
            self._tasks.put((plan.ident, plan.indices, state))
            self._undispatched.remove(plan)

    def _receive(self) -> None:
        while True:
            try:
                ident, batch, after, error = self._results.get(timeout=5.0)
                break
            except queue.Empty:
                dead = [p.pid for p in self._procs if not p.is_alive()]
                if dead:
                    raise RuntimeError(f"loader process(es) {dead} died") from None
        if error is not None:
            raise RuntimeError(f"building a batch failed in a loader process:\n{error}")
        self._ahead[self._inflight.pop(ident)] = after
        self._done[ident] = (batch, after)

    def _next_pooled(self, est: int) -> Any:
        self._fill()
        head = self._planned[0]
        self._check_order(head, est)
        while head.ident not in self._done:
            self._receive()
            self._fill()
        self._planned.popleft()
        batch, after = self._done.pop(head.ident)
        self._commit(head, after)
        return batch

    def close(self) -> None:
        """Stop the loader processes (unconsumed batches are dropped)."""
        for _ in self._procs:
            self._tasks.put(None)
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join()
        self._procs = []
