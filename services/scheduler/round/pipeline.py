"""The scheduling round as a pipeline of named stages, over plain data.

In the manner of the Kubernetes scheduling framework, one round is

    snapshot -> allocate -> collocate -> place -> reconcile

- snapshot: what the round knows - every job not ended (bounds, the types it may
  use, its estimated speed per device type, work left, where it runs now and for
  how long) and every device of every live worker (`Snapshot`). The daemon builds
  it from its state and the simulator from its trace; nothing after this stage
  reads a clock, a database or the network.
- allocate: a policy plugin (`Allocator`) decides each job's `Target`: devices by
  type and ESTs per device, and (Rubick) an execution plan and CPU cores per
  process (later: a background job). Gavel's objectives run in rounds (rigid or elastic),
  EasyScale's greedy allocator and YARN-CS are plugins too
  (gearshift.scheduler.plugins.allocators).
- collocate: pairs a background job with a foreground one (`Collocator`: DeepPool's
  multiplexing, gearshift.scheduler.plugins.deeppool.collocation).
- place: maps targets to devices, consolidating and keeping jobs where they are
  (gearshift.scheduler.round.placement.place).
- reconcile: diffs the desired placements against the actual ones
  (gearshift.scheduler.round.reconcile.diff); the daemon then stops, starts and renews
  tasks, the simulator moves its clock.

Allocate, collocate and place are pure functions of the snapshot (plus the
allocator's own memory of past rounds, as Gavel's mechanism keeps), so the
daemon and `gearshift simulate` share them: `plan_round` is the one call both
make.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gearshift.scheduler.round.placement import place
from gearshift.scheduler.types import Allocator, Assignment, Collocator, Device, Snapshot, Target


class NoCollocation:
    """No background jobs: targets pass through."""

    def collocate(self, snapshot: Snapshot, targets: Mapping[str, Target]) -> dict[str, Target]:
        return dict(targets)


def plan_round(
    snapshot: Snapshot,
    allocator: Allocator,
    current: Mapping[str, Sequence[tuple[Device, int]]],
    collocator: Collocator | None = None,
) -> tuple[dict[str, Target], dict[str, Assignment]]:
    """allocate -> collocate -> place: the targets and the desired placement of every job
    that gets devices. `current` is where jobs run now."""
    targets = allocator.allocate(snapshot)
    targets = (collocator or NoCollocation()).collocate(snapshot, targets)
    return targets, place(targets, snapshot.devices, current, snapshot.avoid)
