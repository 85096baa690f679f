"""DeepPool's burst-parallel planner (Algorithm 1 with graph reduction), vectorized.

Amplification is the paper's (section 4.2): Amp(i, g) = T[i][g] x g / comp(i, 1), where
T[i][g] is the time spent on layer i at g devices *including* communication: the
transfer in from its predecessor plus comp(i, g) plus sync(i, g). Every layer must keep
Amp <= amp_limit. Algorithm 1 checks the predecessor's Amp with the T that minimized its
S, and softens the check (max(bestAmp, AmpLimit)) so that some predecessor always
qualifies. Here the check is made on each (predecessor count h, count g) pair, which
makes the DP exact (it equals brute force over all assignments) and needs no softening:
one device after one device has Amp = 1, so a plan always exists for amp_limit >= 1.
Layers with a zero single-device time (concatenations) carry no limit, and a layer fed
by several branches (a join) counts only its own comp + sync in its Amp: the transfers
into it belong to the branches.

The DP state is a layer's device count; the values are min-plus products of small
[K, K] matrices (K = number of counts: 11 for 1,024 devices), so one layer costs a few
NumPy calls whatever K is. A branch-join block (structure.Block) becomes one [K, K]
matrix from the branching layer's count to the join's: each branch is searched as a
chain from every count of the branching layer, and the branches' times add up, since
they run one after another on the same devices. With parallel_branches, a non-critical
branch (the longest is critical) may instead run on devices the branching layer does not
use, an equal share of the G - g others each (counts <= (G - g) / (branches - 1)), paying
a full move of its input and output, when that lowers the block's time; its layers keep
the amplification limit with those moves counted. (The branches left on the main devices
may still scale past g inside the block: the share does not shrink what they use.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .costs import Costs, Network, build_costs
from .profiles import FloatArray, LayerGraph
from .structure import Block, Chain, Item, decompose, exit_layer

IntArray = npt.NDArray[np.intp]
BoolArray = npt.NDArray[np.bool_]


# Amp at the limit but for float rounding (a latency of 1e-16 on top) is within it: plans
# do not change with the last bit of a sum.
AMP_TOLERANCE = 1e-12


@dataclass(frozen=True)
class Plan:
    """Per-layer device counts and what they predict for one iteration.

    device_seconds: sum over layers of T x g (the paper's GPU-sec); amplification:
    device_seconds over the single-device iteration time. parallel: the first layers of
    the branches that run on extra devices beside their block's critical branch.
    """

    counts: tuple[int, ...]
    iteration_time: float
    device_seconds: float
    amplification: float
    parallel: tuple[int, ...] = ()

    @property
    def peak_devices(self) -> int:
        return max(self.counts)


# Backtrace records: a chain step holds, per entry state and count, the argmin count of
# the previous item; a block also holds its branches' records.
@dataclass(frozen=True)
class _BranchTrace:
    steps: list[_Step]
    into_join: IntArray  # [g, h] -> count of the branch's last layer


@dataclass(frozen=True)
class _BlockTrace:
    seq: list[_BranchTrace | None]
    par: list[_BranchTrace | None]
    parallel: BoolArray  # [branch, g, h]


_Step = tuple[int | Block, IntArray, _BlockTrace | None]


def _minplus(R: FloatArray, C: FloatArray) -> tuple[FloatArray, IntArray]:
    """out[s, g] = min_h R[s, h] + C[h, g], with the argmin h."""
    total = R[:, :, None] + C[None, :, :]
    arg = total.argmin(axis=1)
    return np.take_along_axis(total, arg[:, None, :], axis=1)[:, 0, :], arg


class _Search:
    """One planner run: the cost arrays cut to the allowed counts, and the DP over them."""

    def __init__(self, graph: LayerGraph, costs: Costs, amp_limit: float, k: int, par: bool):
        self.graph, self.parallel = graph, par
        self.d = costs.counts[:k]
        self.own = costs.own[:, :k]
        self.comm = costs.comm[:, :k, :k]
        self.move = costs.move[:, :k, :k]
        self.limit = amp_limit
        self.base = graph.comp[:, 0]
        preds = graph.predecessors()
        self.pred = [p[0] if len(p) == 1 else -1 for p in preds]
        # Joins and the source: their own comp + sync only.
        ok = self._feasible(self.own, np.arange(graph.num_layers))
        self.own_ok = np.where(ok, self.own, np.inf)

    def share(self, branches: int) -> BoolArray:
        """[g, k]: count k fits in a parallel branch's share of the devices beside g."""
        spare = (self.d[-1] - self.d) / max(branches - 1, 1)
        result: BoolArray = self.d[None, :] <= spare[:, None]
        return result

    def _feasible(self, T: FloatArray, layers: npt.NDArray[np.intp]) -> BoolArray:
        """Amp(T) <= limit, T[..., g] the time of layers[...] at count g."""
        base = self.base[layers]
        shape = base.shape + (1,) * (T.ndim - base.ndim)
        with np.errstate(invalid="ignore"):
            ok = T * self.d <= self.limit * (1 + AMP_TOLERANCE) * base.reshape(shape)
        result: BoolArray = ok | (base.reshape(shape) == 0)
        return result

    def edge(self, v: int, full: bool = False) -> FloatArray:
        """[h, g]: T of layer v at g after its predecessor at h, inf beyond the limit."""
        u = self.pred[v]
        T = (self.move if full else self.comm)[u] + self.own[v][None, :]
        return np.where(self._feasible(T, np.array(v)), T, np.inf)

    def chain(
        self, items: Sequence[Item], R: FloatArray, entry: int, cap: BoolArray | None = None
    ) -> tuple[FloatArray, list[_Step]]:
        steps: list[_Step] = []
        for item in items:
            if isinstance(item, int):
                R, arg = _minplus(R, self.edge(item))
                steps.append((item, arg, None))
            else:
                matrix, trace = self.block(item, entry)
                R, arg = _minplus(R, matrix)
                steps.append((item, arg, trace))
            if cap is not None:
                R = np.where(cap, R, np.inf)
            entry = exit_layer(item)
        return R, steps

    def branch(
        self, items: tuple[Item, ...], head: int, cap: BoolArray | None
    ) -> tuple[FloatArray, _BranchTrace | None]:
        """[g, h]: the branch's time from the head at g to the join at h (join excluded).

        cap: None for a branch on the block's devices, else the counts it may use beside
        the head's (a parallel branch, with full moves in and out).
        """
        full = cap is not None
        if not items:
            return (np.full_like(self.comm[head], np.inf) if full else self.comm[head]), None
        first = items[0]
        assert isinstance(first, int)
        R = self.edge(first, full)
        if cap is not None:
            R = np.where(cap, R, np.inf)
        R, steps = self.chain(items[1:], R, first, cap)
        out = self.move if full else self.comm
        into, arg = _minplus(R, out[exit_layer(items[-1])])
        return into, _BranchTrace(steps, arg)

    def block(self, block: Block, head: int) -> tuple[FloatArray, _BlockTrace]:
        seq_runs = [self.branch(b, head, None) for b in block.branches]
        M = np.stack([m for m, _ in seq_runs])
        time = M.sum(axis=0)
        chosen = np.zeros(M.shape, dtype=np.bool_)
        par_traces: list[_BranchTrace | None] = [None] * len(block.branches)
        if self.parallel and len(block.branches) > 1:
            cap = self.share(len(block.branches))
            par_runs = [self.branch(b, head, cap) for b in block.branches]
            par_traces = [t for _, t in par_runs]
            P = np.stack([m for m, _ in par_runs])
            order = np.argsort(-M, axis=0, kind="stable")
            seq, par = time, np.zeros_like(time)
            with np.errstate(invalid="ignore"):
                for rank in range(1, len(block.branches)):
                    b = order[rank][None]
                    Mb = np.take_along_axis(M, b, axis=0)[0]
                    Pb = np.take_along_axis(P, b, axis=0)[0]
                    new_seq, new_par = seq - Mb, np.maximum(par, Pb)
                    accept = np.maximum(new_seq, new_par) < np.maximum(seq, par)
                    seq = np.where(accept, new_seq, seq)
                    par = np.where(accept, new_par, par)
                    np.put_along_axis(chosen, b, accept[None], axis=0)
            time = np.maximum(seq, par)
        matrix = time + self.own_ok[block.join][None, :]
        trace = _BlockTrace([t for _, t in seq_runs], par_traces, chosen)
        return matrix, trace

    def backtrack(self, steps: list[_Step], s: int, k: int, out: _Backtrace) -> int:
        """Set the counts of the steps' layers (last at count index k); the entry's index."""
        for item, arg, trace in reversed(steps):
            out.counts[exit_layer(item)] = int(self.d[k])
            g = int(arg[s, k])
            if isinstance(item, Block):
                assert trace is not None
                for b, branch in enumerate(item.branches):
                    if not branch:
                        continue
                    par = bool(trace.parallel[b, g, k])
                    run = (trace.par if par else trace.seq)[b]
                    assert run is not None
                    first = self.backtrack(run.steps, g, int(run.into_join[g, k]), out)
                    first_layer = branch[0]
                    assert isinstance(first_layer, int)
                    out.counts[first_layer] = int(self.d[first])
                    if par:
                        out.parallel.append(first_layer)
            k = g
        return k


@dataclass
class _Backtrace:
    counts: list[int]
    parallel: list[int]


def plan(
    graph: LayerGraph,
    *,
    amp_limit: float,
    max_devices: int | None = None,
    network: Network | None = None,
    parallel_branches: bool = False,
    costs: Costs | None = None,
) -> Plan:
    """The plan of least iteration time whose layers all keep Amp <= amp_limit.

    max_devices: the most devices any layer may use (default: the graph's largest count).
    costs: `build_costs(graph, network)` when planning the same graph repeatedly.
    Ties go to fewer devices.
    """
    if not amp_limit >= 1:
        raise ValueError(f"amp_limit: must be >= 1 (1 = no inefficiency), got {amp_limit}")
    net = network or Network()
    costs = costs or build_costs(graph, net)
    limit = graph.device_counts[-1] if max_devices is None else max_devices
    if limit < 1:
        raise ValueError(f"max_devices: must be >= 1, got {limit}")
    k = sum(1 for d in graph.device_counts if d <= limit)
    search = _Search(graph, costs, amp_limit, k, parallel_branches)
    chain = decompose(graph)
    R, steps = search.chain(chain.items, search.own_ok[chain.source][None, :], chain.source)
    last = int(R[0].argmin())
    out = _Backtrace([0] * graph.num_layers, [])
    out.counts[chain.source] = int(search.d[search.backtrack(steps, 0, last, out)])
    result = evaluate(graph, out.counts, parallel=out.parallel, costs=costs, chain=chain)
    return Plan(
        counts=tuple(out.counts),
        iteration_time=float(R[0, last]),
        device_seconds=result.device_seconds,
        amplification=result.amplification,
        parallel=tuple(sorted(out.parallel)),
    )


@dataclass(frozen=True)
class Evaluation:
    """What a plan costs: iteration time, GPU-sec, and each layer's Amp."""

    iteration_time: float
    device_seconds: float
    amplification: float
    layer_amplification: tuple[float, ...]


def evaluate(
    graph: LayerGraph,
    counts: Sequence[int],
    *,
    network: Network | None = None,
    parallel: Sequence[int] = (),
    costs: Costs | None = None,
    chain: Chain | None = None,
) -> Evaluation:
    """Iteration time, device-seconds and per-layer Amp of given per-layer counts.

    parallel: first layers of branches run on extra devices (Plan.parallel).
    """
    costs = costs or build_costs(graph, network or Network())
    chain = chain or decompose(graph)
    index = {d: i for i, d in enumerate(graph.device_counts)}
    if len(counts) != graph.num_layers or any(c not in index for c in counts):
        raise ValueError(f"counts: want one of {graph.device_counts} per layer")
    k = [index[c] for c in counts]
    T = [float(costs.own[v, k[v]]) for v in range(graph.num_layers)]
    joins_own = list(T)
    on_extra = set(parallel)

    def run(items: Sequence[Item], entry: int) -> float:
        total = 0.0
        for item in items:
            if isinstance(item, int):
                T[item] += float(costs.comm[entry, k[entry], k[item]])
                total += T[item]
            else:
                total += run_block(item, entry)
            entry = exit_layer(item)
        return total

    def run_block(block: Block, head: int) -> float:
        seq, par = 0.0, 0.0
        for branch in block.branches:
            if not branch:
                skip = float(costs.comm[head, k[head], k[block.join]])
                T[block.join] += skip
                seq += skip
                continue
            first, last = branch[0], exit_layer(branch[-1])
            assert isinstance(first, int)
            full = first in on_extra
            pair = costs.move if full else costs.comm
            T[first] += float(pair[head, k[head], k[first]])
            out = float(pair[last, k[last], k[block.join]])
            time = T[first] + run(branch[1:], first) + out
            T[block.join] += out
            if full:
                par = max(par, time)
            else:
                seq += time
        return max(seq, par) + joins_own[block.join]

    time = joins_own[chain.source] + run(chain.items, chain.source)
    preds = graph.predecessors()
    amps = []
    for v in range(graph.num_layers):
        t = T[v] if len(preds[v]) == 1 else joins_own[v]
        base = float(graph.comp[v, 0])
        amps.append(t * counts[v] / base if base > 0 else 0.0)
    device_seconds = sum(t * c for t, c in zip(T, counts, strict=True))
    single = graph.single_device_time()
    return Evaluation(time, device_seconds, device_seconds / single, tuple(amps))


def elastic_device_count(
    graph: LayerGraph,
    *,
    amp_limit: float,
    max_devices: int | None = None,
    network: Network | None = None,
    rel_tol: float = 0.0,
) -> int:
    """The devices an elastic job should ask for (issue 20, point 6).

    The fewest devices (a power of two) whose best plan within amp_limit is as fast as
    the best plan with max_devices, or within rel_tol of it: more would not help.
    """
    costs = build_costs(graph, network or Network())
    best = plan(graph, amp_limit=amp_limit, max_devices=max_devices, costs=costs)
    target = best.iteration_time * (1 + rel_tol)
    for cap in graph.device_counts:
        if cap >= best.peak_devices:
            break
        if plan(graph, amp_limit=amp_limit, max_devices=cap, costs=costs).iteration_time <= target:
            return cap
    return best.peak_devices
