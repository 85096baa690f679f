"""The in-place change of a rescale: sources by (worker, device), none when nothing stays."""

from __future__ import annotations

from gearshift.scheduler.round.inplace_plan import in_place_change, joiners
from gearshift.v1 import common_pb2

C = common_pb2


def placement(*processes: tuple[str, int, int]) -> C.Placement:
    """(worker, device, ESTs) per rank."""
    out, first = C.Placement(), 0
    for rank, (worker, device, count) in enumerate(processes):
        out.processes.add(
            rank=rank,
            worker_id=worker,
            device_index=device,
            est_ids=list(range(first, first + count)),
        )
        first += count
    return out


def test_a_grow_keeps_the_old_processes_and_names_the_joiners_by_worker() -> None:
    old = placement(("a", 0, 2), ("a", 1, 2))
    new = placement(("a", 0, 2), ("a", 1, 1), ("b", 0, 1))
    change = in_place_change(old, new, 3, "h:1")
    assert change is not None
    assert (list(change.mapping), list(change.sources)) == ([2, 1, 1], [0, 1, -1])
    assert change.generation == 3 and change.master_addr == "h:1"
    assert joiners(new, change) == {"b": [2]}


def test_a_shrink_and_a_move_map_kept_devices_to_their_new_ranks() -> None:
    old = placement(("a", 0, 1), ("a", 1, 1), ("b", 0, 2))
    shrink = in_place_change(old, placement(("b", 0, 2), ("a", 1, 2)), 1, "h:2")
    assert shrink is not None and list(shrink.sources) == [2, 1]
    alone = in_place_change(old, placement(("a", 1, 4)), 1, "h:2")
    assert alone is not None and list(alone.sources) == [1] and alone.master_addr == ""
    move = in_place_change(old, placement(("a", 0, 2), ("c", 0, 2)), 1, "h:3")
    assert move is not None and list(move.sources) == [0, -1]


def test_a_rescale_that_keeps_no_device_is_a_restart() -> None:
    old = placement(("a", 0, 2), ("a", 1, 2))
    assert in_place_change(old, placement(("b", 0, 4)), 1, "h:1") is None
    assert in_place_change(old, placement(("a", 2, 4)), 1, "h:1") is None
