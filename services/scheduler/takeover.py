"""The daemon's side of the election: lead at once when the lock is free, else serve as a
standby until it frees, then take over from the store.

A leader raises the epoch and recovers before the server starts (as a lone scheduler
does), then records its advertised address, starts its rounds and opens the gate
(api/standby.py). A standby serves reads from the start; a thread waits for the lock,
then does the same, from the store, while reads go on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gearshift.scheduler.api.relays import HeartbeatRelays
from gearshift.scheduler.api.standby import Standing
from gearshift.scheduler.service import Scheduler
from gearshift.scheduler.state.leader import (
    Leadership,
    epoch_is,
    leader_address,
    next_epoch,
    record_leader,
)
from gearshift.scheduler.state.store import Store

log = logging.getLogger("gearshift.scheduler")


class Takeover:
    """One scheduler's way to leading (`leadership` None: SQLite, which has no election)."""

    def __init__(
        self,
        scheduler: Scheduler,
        store: Store,
        relays: HeartbeatRelays,
        leadership: Leadership | None,
        on_lost: Callable[[str], None],
    ) -> None:
        self.scheduler = scheduler
        self.store = store
        self.relays = relays
        self.leadership = leadership
        self.on_lost = on_lost
        self.standing = Standing(lambda: leader_address(store))
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_lead: Callable[[], None] = lambda: None

    def lead_now(self) -> bool:
        """Before serving: take the lock if it is free (always, on SQLite) and recover;
        False for a standby, which has recovered nothing."""
        if self.leadership is not None:
            if not self.leadership.try_acquire():
                self.scheduler.standby = True
                return False
            log.info("elected leader", extra={"waited_s": 0.0})
            self.scheduler.state.epoch = next_epoch(self.store)
            log.info("leading", extra={"epoch": self.scheduler.state.epoch})
        self.scheduler.recover()
        return True

    def start(self, address: str, advertise: str, led: bool, on_lead: Callable[[], None]) -> None:
        """Once serving at `address`: lead (`led`: lead_now took the lock), or wait for the
        lock in a thread as a standby; `on_lead` once it serves writes."""
        self._on_lead = on_lead
        if led:
            self._serve(address, advertise)
            return
        self._thread = threading.Thread(
            target=self._wait, args=(address, advertise), name="standby", daemon=True
        )
        self._thread.start()

    def _wait(self, address: str, advertise: str) -> None:
        assert self.leadership is not None
        try:
            waited = self.leadership.acquire()
        except RuntimeError:
            return  # closed while waiting: the daemon stops
        if self._stopping.is_set():
            return
        log.info("elected leader", extra={"waited_s": round(waited, 3)})
        try:
            self.scheduler.state.epoch = next_epoch(self.store)
            log.info("leading", extra={"epoch": self.scheduler.state.epoch})
            self.scheduler.recover()
            self._serve(address, advertise)
        except Exception as exc:  # holding the lock without leading would stall the cluster
            log.exception("takeover failed")
            self.on_lost(f"takeover failed: {exc}")

    def _serve(self, address: str, advertise: str) -> None:
        scheduler, leadership = self.scheduler, self.leadership
        if leadership is not None:
            record_leader(self.store, advertise)  # the standbys send writes here from now
        scheduler.start()
        if leadership is not None:
            epoch = scheduler.state.epoch
            leadership.watch(lambda: epoch_is(self.store, epoch), self.on_lost)
        self.standing.lead()
        self._on_lead()
        log.info("serving writes", extra={"advertised": advertise})
        self.relays.start(address)  # a process each, seconds to start: writes do not wait

    def stop(self) -> None:
        """First of the stop hooks: a standby stops waiting (a leader keeps its lock until
        the rest has stopped)."""
        self._stopping.set()
        if self.leadership is not None and not self.standing.leading:
            self.leadership.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
