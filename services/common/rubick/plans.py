"""Rubick's execution plans and the plans a job can run on a resource amount.

Paper: ../shared/papers/rubick-*.txt, sections 2.1 and 3. A plan is Megatron-style 3D
parallelism (DP x TP x PP) or a ZeRO variant over DP, each optionally with gradient
accumulation (GA) and gradient checkpointing (GC). The global batch never changes
(Rubick keeps convergence intact), so a plan only splits it differently.

Rank layout (the paper is silent; Megatron's default): TP varies fastest, then DP, then PP,
and ranks fill the nodes of a placement in order. A TP group must stay inside a node
(section 4.1: "TP is typically restricted inside each node").
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum


class Zero(StrEnum):
    """How model states are deduplicated: plain DP, ZeRO-DP (stage 2) or ZeRO-Offload."""

    NONE = "none"
    DP = "zero-dp"
    OFFLOAD = "zero-offload"


@dataclass(frozen=True)
class Plan:
    """One execution plan. `ga` = GA steps a; `micro_batches` = PP micro-batches m."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    ga: int = 1
    gc: bool = False
    zero: Zero = Zero.NONE
    micro_batches: int = 1

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "ga", "micro_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"plan.{name} must be >= 1, got {getattr(self, name)}")
        if self.zero is not Zero.NONE and (self.tp > 1 or self.pp > 1):
            raise ValueError("ZeRO plans are data parallel only (tp = pp = 1)")
        if self.pp == 1 and self.micro_batches != 1:
            raise ValueError("micro_batches applies to pipeline parallelism only (pp > 1)")

    @property
    def gpus(self) -> int:
        """Devices the plan occupies: d * t * p."""
        return self.dp * self.tp * self.pp

    @property
    def label(self) -> str:
        """Short human-readable name, e.g. 'zero-dp+ga4', '3d(p2,t4,d8,m8)+gc'."""
        if self.tp > 1 or self.pp > 1:
            m = f",m{self.micro_batches}" if self.pp > 1 else ""
            base = f"3d(p{self.pp},t{self.tp},d{self.dp}{m})"
        elif self.zero is Zero.NONE:
            base = f"dp{self.dp}"
        else:
            base = f"{self.zero.value}{self.dp}"
        return base + (f"+ga{self.ga}" if self.ga > 1 else "") + ("+gc" if self.gc else "")


@dataclass(frozen=True)
class Resources:
    """GPUs of one type per node (a placement, e.g. (8, 4)) and CPU cores per GPU."""

    placement: tuple[int, ...]
    cpus_per_gpu: int = 1

    def __post_init__(self) -> None:
        if not self.placement or any(n < 1 for n in self.placement):
            raise ValueError(f"placement must list >= 1 GPU per node, got {self.placement}")
        if self.cpus_per_gpu < 1:
            raise ValueError(f"cpus_per_gpu must be >= 1, got {self.cpus_per_gpu}")

    @property
    def gpus(self) -> int:
        return sum(self.placement)

    @property
    def cpus(self) -> int:
        return self.gpus * self.cpus_per_gpu


def consolidated(gpus: int, gpus_per_node: int) -> tuple[int, ...]:
    """The fewest-nodes placement of `gpus` GPUs: full nodes, then the remainder."""
    if gpus < 1 or gpus_per_node < 1:
        raise ValueError(f"need gpus >= 1 and gpus_per_node >= 1, got {gpus}, {gpus_per_node}")
    full, rest = divmod(gpus, gpus_per_node)
    return (gpus_per_node,) * full + ((rest,) if rest else ())


def _node_of(placement: Sequence[int]) -> list[int]:
    return [node for node, n in enumerate(placement) for _ in range(n)]


def group_spans_nodes(plan: Plan, placement: Sequence[int], kind: str) -> bool:
    """Whether any of the plan's `kind` ('dp', 'tp', 'pp') groups crosses a node boundary.

    The bottleneck link of a group decides its bandwidth (section 4.1)."""
    node = _node_of(placement)
    if len(node) != plan.gpus:
        raise ValueError(f"placement {tuple(placement)} holds {len(node)} GPUs, plan {plan.gpus}")
    t, d, p = plan.tp, plan.dp, plan.pp

    def rank(ti: int, di: int, pi: int) -> int:
        return ti + t * di + t * d * pi

    if kind == "tp":
        groups = [[rank(i, di, pi) for i in range(t)] for di in range(d) for pi in range(p)]
    elif kind == "dp":
        groups = [[rank(ti, i, pi) for i in range(d)] for ti in range(t) for pi in range(p)]
    elif kind == "pp":
        groups = [[rank(ti, di, i) for i in range(p)] for ti in range(t) for di in range(d)]
    else:
        raise ValueError(f"kind must be 'dp', 'tp' or 'pp', got {kind!r}")
    return any(len({node[r] for r in g}) > 1 for g in groups)


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def enumerate_plans(
    global_batch: int,
    layers: int,
    resources: Resources,
    *,
    max_ga: int = 16,
    allow_3d: bool = True,
) -> Iterator[Plan]:
    """Every plan that uses exactly the resources' GPUs and splits the job evenly.

    Constraints: d*t*p = GPUs; TP inside each node; PP stages get whole layers (p | l);
    each DP rank gets whole GA steps of whole samples (d*a | b), and with PP each micro-batch
    whole samples (d*a*m | b, m >= p so the pipeline fills). Memory is not checked here:
    model.memory_per_gpu decides which of these fit. `allow_3d=False` keeps the DP family
    (the paper disables TP/PP for its small models)."""
    g = resources.gpus
    for t in _divisors(g):
        if t > 1 and (not allow_3d or any(n % t for n in resources.placement)):
            continue
        for p in _divisors(g // t):
            if p > 1 and (not allow_3d or layers % p):
                continue
            d = g // (t * p)
            if global_batch % d:
                continue
            per_rank = global_batch // d
            for a in (k for k in _divisors(per_rank) if k <= max_ga):
                micro = [1] if p == 1 else [m for m in _divisors(per_rank // a) if m >= p]
                for m in micro:
                    for gc in (False, True):
                        zeros = (Zero.NONE, Zero.DP, Zero.OFFLOAD) if t == p == 1 else (Zero.NONE,)
                        for z in zeros:
                            yield Plan(dp=d, tp=t, pp=p, ga=a, gc=gc, zero=z, micro_batches=m)
