"""A layer graph as a chain of layers and branch-join blocks (DeepPool's Figure 7).

The planner's DP runs along a chain; a block (a branching layer's successors up to
the layer where they join) is reduced to one edge. Blocks nest: a branch is itself a
chain of layers and blocks. Graphs that are not series-parallel in this sense (a join
that closes two branchings at once, a branch that leaves its block) are refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from .profiles import LayerGraph

Item = Union[int, "Block"]


@dataclass(frozen=True)
class Block:
    """Branches that start at the previous item's exit layer and meet at `join`.

    A branch is a tuple of items (its first item is a layer); an empty branch is an edge
    straight from the branching layer to the join (a residual connection).
    """

    branches: tuple[tuple[Item, ...], ...]
    join: int


@dataclass(frozen=True)
class Chain:
    """The whole graph: its source layer, then items each fed by the previous one's exit."""

    source: int
    items: tuple[Item, ...]


def exit_layer(item: Item) -> int:
    return item if isinstance(item, int) else item.join


def _post_dominators(succs: list[list[int]]) -> list[int | None]:
    """Immediate post-dominator of each layer (None for the sink), layers topologically sorted."""
    n = len(succs)
    pdom: list[frozenset[int]] = [frozenset()] * n
    ipdom: list[int | None] = [None] * n
    for v in range(n - 1, -1, -1):
        if succs[v]:
            common = frozenset.intersection(*(pdom[s] for s in succs[v]))
            ipdom[v] = min(common) if common else None
            pdom[v] = common | {v}
        else:
            pdom[v] = frozenset({v})
    return ipdom


def decompose(graph: LayerGraph) -> Chain:
    """The graph's chain of layers and blocks; ValueError when it is not series-parallel."""
    preds, succs = graph.predecessors(), graph.successors()
    sources = [v for v, p in enumerate(preds) if not p]
    sinks = [v for v, s in enumerate(succs) if not s]
    if len(sources) != 1 or len(sinks) != 1:
        raise ValueError(f"edges: need one source and one sink, got {sources} and {sinks}")
    ipdom = _post_dominators(succs)

    def walk(start: int, stop: int | None) -> list[Item]:
        items: list[Item] = []
        current = start
        while current != stop:
            nxt = succs[current]
            if not nxt:
                if stop is not None:
                    raise ValueError(f"edges: layer {current} leaves its block before {stop}")
                break
            if len(nxt) == 1:
                layer = nxt[0]
                if layer == stop:
                    break
                if len(preds[layer]) != 1:
                    raise ValueError(f"edges: layer {layer} joins branches opened elsewhere")
                items.append(layer)
                current = layer
                continue
            join = ipdom[current]
            if join is None or join == stop or len(preds[join]) != len(nxt):
                raise ValueError(f"edges: the branches of layer {current} do not join alone")
            branches: list[tuple[Item, ...]] = []
            for first in nxt:
                if first == join:
                    branches.append(())
                elif len(preds[first]) != 1:
                    raise ValueError(f"edges: layer {first} joins branches opened elsewhere")
                else:
                    branches.append((first, *walk(first, join)))
            items.append(Block(tuple(branches), join))
            current = join
        return items

    return Chain(sources[0], tuple(walk(sources[0], None)))
