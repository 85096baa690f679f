"""Rubick's scheduling policy (paper Algorithm 1, section 5.2) as an allocate plugin, and the
break-down variants of section 7.3.

- `rubick`: plans and resources both reconfigurable; `rubick_e`: plans only (resources
  fixed at the request); `rubick_r`: resources only (the original TP/PP/ZeRO/GC kept, DP
  scaled, as Sia); `rubick_n`: neither - only the policy's ordering and preemption.
- Sensitivity curves: the best iterations/s per GPU count (consolidated placement) over the
  plans the variant allows (gearshift.common.rubick.perf), made monotone as Fig. 6 ("the
  maximum throughput achievable within the given range"), normalised by the job's
  throughput with its original plan on its request, so that slopes of different models
  compare (the paper does not say how it compares samples/s of different models).
  A job's slope at g GPUs is the steepest gain per GPU to any larger amount (the curve is
  flat between the GPU counts no plan can use); a victim's is the gentlest loss per GPU to
  any smaller amount.
- Schedule: queued guaranteed jobs whose tenant quota (counted in minRes GPUs) still covers
  them go first, in arrival order; then best-effort and running jobs by decreasing slope
  (jobs queued longer than `starvation_seconds` first, as the paper lets starving jobs in).
  ScheduleJob visits the nodes (the job's own first, then the freest): it takes free GPUs
  while its slope exceeds `min_gain`, then reclaims one GPU at a time from the job on that
  node with the lowest slope above its minRes while its own slope is higher or it is below
  its own minRes. A job that ends with no runnable amount gives back what it took. Then
  every job keeps the least GPUs that reach its curve's value and runs the best plan for
  the GPUs per node it holds. minRes: the fewest GPUs whose best plan matches the original
  performance for guaranteed jobs; 0 for best-effort ones.
- The guarantee is checked on the real placement, not the curve's consolidated one: a
  guaranteed job is "below its minRes" while the best plan on the GPUs per node it holds
  (at its CPUs per GPU) is slower than its original plan on its request placed on the
  fewest nodes; it gives a GPU up (to a taker, or when trimmed) only if it stays at that
  speed on what it keeps, and a new one that cannot reach it gives back what it took and
  waits. The nodes chosen reach the place stage (`Target.workers`), so the job runs on
  the GPUs per node the check saw.
- CPUs: each GPU gets the cores per GPU of the request; then (`share_cpus`) ZeRO-Offload
  jobs (the only plans whose speed reads cores) take one more core per GPU at a time,
  steepest slope first: free cores on the node first, then cores reclaimed from the job
  there with the gentlest slope down above its CPU minRes (a guaranteed job keeps the
  fewest cores at which it runs at its requested speed; others keep one per GPU) while
  that slope is below the taker's - Algorithm 1's loop over CPUs.
- Reconfiguration: a running job is changed (resized, re-planned, preempted) only while
  (T - N*delta)/T > `threshold` (0.97): T its running time so far, N its reconfigurations,
  delta its restart cost; otherwise it keeps what it has (a guaranteed job below its minRes
  may still reclaim from it).
- GPU types: a job stays on nodes of one type among those it allows (`JobSnapshot.types`);
  curves use the A800 environment for all.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gearshift.common.rubick.perf import Mode, PerfSource
from gearshift.common.rubick.plans import Plan, Zero, consolidated
from gearshift.common.rubick.request import Request
from gearshift.scheduler.types import JobSnapshot, Snapshot, Target

# variant -> (plans it may choose, whether resources may differ from the request)
VARIANTS: dict[str, tuple[Mode, bool]] = {
    "rubick": (Mode.ANY, True),
    "rubick_e": (Mode.ANY, False),
    "rubick_r": (Mode.DP, True),
    "rubick_n": (Mode.EXACT, False),
}
TOL = 1e-9


@dataclass(frozen=True)
class Curve:
    """A normalised monotone curve over 0..max GPUs: value, the least amount reaching it,
    and the slopes up (taker) and down (victim) at each amount."""

    value: tuple[float, ...]
    least: tuple[int, ...]
    up: tuple[float, ...]
    down: tuple[float, ...]


@functools.lru_cache(maxsize=4096)
def make_curve(raw: tuple[float, ...]) -> Curve:
    """The monotone envelope of `raw` (value per GPU count, index 0 = no GPU) and its slopes."""
    value: list[float] = []
    least: list[int] = []
    for g, x in enumerate(raw):
        if not value or x > value[-1] + TOL:
            value.append(x)
            least.append(g)
        else:
            value.append(value[-1])
            least.append(least[-1])
    n = len(value)
    up = [
        max(((value[h] - value[g]) / (h - g) for h in range(g + 1, n)), default=0.0)
        for g in range(n)
    ]
    down = [min(((value[g] - value[h]) / (g - h) for h in range(g)), default=0.0) for g in range(n)]
    return Curve(tuple(value), tuple(least), tuple(up), tuple(down))


@dataclass
class _Job:
    snap: JobSnapshot
    req: Request
    curve: Curve
    base_rate: float
    min_gpus: int
    alloc: dict[str, int] = field(default_factory=dict)
    frozen: bool = False
    running: bool = False

    @property
    def gpus(self) -> int:
        return sum(self.alloc.values())

    @property
    def top(self) -> int:
        return len(self.curve.value) - 1


@dataclass(frozen=True)
class RubickAdmission:
    """A guaranteed job the quota covered in a decision: its request and what it got, with
    the best-effort jobs that gave GPUs up for it (shrunk: still running on fewer;
    preempted: left with none)."""

    job_id: str
    tenant: str
    accelerator_type: str  # of the nodes it got
    requested_gpus: int
    gpus: int
    requested_plan: str
    plan: str
    requested_rate: float  # iterations/s of its original plan on its request (the model's)
    predicted_rate: float  # iterations/s the model predicts on what it got
    shrunk: tuple[str, ...] = ()
    preempted: tuple[str, ...] = ()


def admissions(
    jobs: Mapping[str, _Job],
    admitted: Sequence[str],
    *,
    node_type: Mapping[str, str],
    chosen: Mapping[str, tuple[Plan, int]],
    before: Mapping[str, Mapping[str, int]],
    taken: Mapping[str, Sequence[str]],
    speed: Callable[[_Job, Mapping[str, int]], float],
) -> dict[str, RubickAdmission]:
    """The decision's admissions of guaranteed jobs (`admitted`: ids, in order; those left
    without GPUs are not admitted), from each job's allocation and chosen plan, the
    allocations `before` the decision and the jobs each took GPUs from (`taken`); only
    best-effort victims are listed."""
    out: dict[str, RubickAdmission] = {}
    for job_id in admitted:
        job = jobs[job_id]
        if not job.alloc or job_id not in chosen:  # it waits: not admitted this time
            continue
        victims = sorted(
            {v for v in taken.get(job_id, ()) if not jobs[v].req.guaranteed and before.get(v)}
        )
        out[job_id] = RubickAdmission(
            job_id=job_id,
            tenant=job.snap.entity,
            accelerator_type=node_type[next(iter(job.alloc))],
            requested_gpus=job.req.gpus,
            gpus=job.gpus,
            requested_plan=job.req.plan.label,
            plan=chosen[job_id][0].label,
            requested_rate=job.base_rate,
            predicted_rate=speed(job, job.alloc) * job.base_rate,
            shrunk=tuple(v for v in victims if jobs[v].alloc),
            preempted=tuple(v for v in victims if not jobs[v].alloc),
        )
    return out


@dataclass
class RubickPolicy:
    """Algorithm 1 over a snapshot; see the module docstring. `admitted`: the last
    decision's admissions of guaranteed jobs (what `gearshift tenants` shows)."""

    perf: PerfSource
    variant: str = "rubick"
    quotas: Mapping[str, int] = field(default_factory=dict)
    gpus_per_node: int = 8
    cpus_per_node: int = 96
    threshold: float = 0.97
    min_gain: float = 0.02
    starvation_seconds: float = 4 * 3600.0
    replans_on_events: bool = True
    # False: no job takes GPUs from another, as in the artifact's policy, whose reclaim
    # loop never runs (`if "llama" or "3B" in targeted_job ...: continue` is always true).
    reclaim: bool = True
    decisions: int = 0
    decision_seconds: list[float] = field(default_factory=list)
    admitted: dict[str, RubickAdmission] = field(default_factory=dict)
    _alloc: dict[str, dict[str, int]] = field(default_factory=dict)
    _plan: dict[str, tuple[Plan, int]] = field(default_factory=dict)
    _reconfigs: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown Rubick variant {self.variant!r}; one of {sorted(VARIANTS)}")

    @property
    def name(self) -> str:
        return self.variant

    def reconfigurations(self, job_id: str) -> int:
        return self._reconfigs.get(job_id, 0)

    # -- curves -------------------------------------------------------------------------

    def _job(self, snap: JobSnapshot, req: Request, max_gpus: int) -> _Job:
        mode, elastic = VARIANTS[self.variant]
        top = max_gpus if elastic else req.gpus
        raw = self.perf.curve(
            req.application,
            req.plan,
            req.gpus,
            cpus_per_gpu=req.cpus_per_gpu,
            mode=mode,
            max_gpus=top,
            gpus_per_node=self.gpus_per_node,
        )
        if not elastic:
            raw = tuple(x if g == req.gpus else 0.0 for g, x in enumerate(raw))
        shape = consolidated(req.gpus, self.gpus_per_node)
        ms = self.perf.iter_ms(req.application, req.plan, shape, req.cpus_per_gpu)
        at_request = raw[req.gpus] if req.gpus < len(raw) else 0.0  # may exceed the cluster
        base = 1e3 / ms if ms else (at_request or max(raw) or 1.0)
        curve = make_curve(tuple(x / base for x in raw))
        min_gpus = 0
        if req.guaranteed:
            reach = [g for g, v in enumerate(curve.value) if v >= 1.0 - 1e-6]
            min_gpus = reach[0] if reach else req.gpus
        return _Job(snap, req, curve, base, min_gpus)

    def _may_reconfigure(self, snap: JobSnapshot) -> bool:
        t = snap.attained_seconds
        n = self._reconfigs.get(snap.job_id, 0)
        if n == 0 or snap.restart_seconds <= 0:
            return True
        return t > 0 and (t - n * snap.restart_seconds) / t > self.threshold

    # -- Algorithm 1 --------------------------------------------------------------------

    def allocate(self, snapshot: Snapshot) -> dict[str, Target]:
        started = time.perf_counter()
        node_gpus: dict[str, int] = {}
        node_type: dict[str, str] = {}
        for d in snapshot.devices:
            node_gpus[d.worker_id] = node_gpus.get(d.worker_id, 0) + 1
            node_type[d.worker_id] = d.worker_type
        free = dict(node_gpus)
        holders: dict[str, set[str]] = {n: set() for n in node_gpus}
        total = sum(node_gpus.values())
        jobs: dict[str, _Job] = {}
        for snap in snapshot.jobs:
            if snap.request is None:
                continue
            job = self._job(snap, snap.request, total)
            old = self._alloc.get(snap.job_id)
            if snap.current and old and all(n in free for n in old):
                job.alloc = dict(old)
                job.running = True
                job.frozen = not self._may_reconfigure(snap)
                for n, k in old.items():
                    free[n] -= k
                    holders[n].add(snap.job_id)
            jobs[snap.job_id] = job
        mode = VARIANTS[self.variant][0]

        def runs(job: _Job) -> bool:
            shape = tuple(sorted(job.alloc.values(), reverse=True))
            c = min(job.req.cpus_per_gpu, self.cpus_per_node // self.gpus_per_node)
            r = job.req
            return (
                self.perf.best(r.application, r.plan, r.gpus, shape, cpus_per_gpu=c, mode=mode)
                is not None
            )

        speeds: dict[tuple[int, tuple[int, ...]], float] = {}

        def speed(job: _Job, alloc: Mapping[str, int]) -> float:
            shape = tuple(sorted((k for k in alloc.values() if k > 0), reverse=True))
            if not shape:
                return 0.0
            hit = speeds.get((id(job), shape))
            if hit is not None:
                return hit
            c = min(job.req.cpus_per_gpu, self.cpus_per_node // self.gpus_per_node)
            r = job.req
            best = self.perf.best(r.application, r.plan, r.gpus, shape, cpus_per_gpu=c, mode=mode)
            out = speeds[(id(job), shape)] = best.rate / job.base_rate if best else 0.0
            return out

        ctx = _Ctx(jobs, free, holders, node_type, self.min_gain, runs, speed)

        before = {j: dict(job.alloc) for j, job in jobs.items() if job.alloc}
        usage: dict[str, int] = {}
        covered: list[str] = []  # guaranteed jobs within quota: running ones, then new ones
        for job in jobs.values():
            if job.running and job.req.guaranteed:
                usage[job.snap.entity] = usage.get(job.snap.entity, 0) + job.min_gpus
                if self.quotas.get(job.snap.entity, 0) > 0:
                    covered.append(job.snap.job_id)
        privileged: list[_Job] = []
        for job in jobs.values():  # arrival order
            if job.running or not job.req.guaranteed:
                continue
            quota = self.quotas.get(job.snap.entity, 0)
            if usage.get(job.snap.entity, 0) + job.min_gpus <= quota:
                usage[job.snap.entity] = usage.get(job.snap.entity, 0) + job.min_gpus
                privileged.append(job)
        chosen = {id(j) for j in privileged}
        covered += [j.snap.job_id for j in privileged]
        for job in privileged:
            ctx.schedule(job, reclaim=self.reclaim)
        rest = [j for j in jobs.values() if id(j) not in chosen and not j.frozen]
        rest.sort(key=lambda j: self._order(j, snapshot.now))
        for job in rest:
            ctx.schedule(job, reclaim=self.reclaim)
        for job in jobs.values():
            ctx.trim(job)
        for job in sorted(rest, key=lambda j: self._order(j, snapshot.now)):
            if not job.alloc:  # work-conserving: what trimming freed
                ctx.schedule(job, reclaim=False)
                ctx.trim(job)
        out, plans = self._targets(jobs, node_type)
        self.admitted = admissions(
            jobs,
            covered,
            node_type=node_type,
            chosen=plans,
            before=before,
            taken=ctx.taken,
            speed=speed,
        )
        self.decisions += 1
        self.decision_seconds.append(time.perf_counter() - started)
        return out

    def _order(self, job: _Job, now: float) -> tuple[bool, float, float]:
        starving = not job.running and now - job.snap.arrival_time > self.starvation_seconds
        return (not starving, -job.curve.up[job.gpus], job.snap.arrival_time)

    def _cpu_share(self, job: _Job, plan: Plan, cpus: int) -> CpuShare:
        """The job as share_cpus sees it: its speed per cores per GPU on what it holds
        (normalised as its curve), its CPU minRes (a guaranteed job keeps the fewest cores
        per GPU at which it still runs at its requested speed; others keep one)."""
        shape = tuple(sorted(job.alloc.values(), reverse=True))
        app = job.req.application

        @functools.cache
        def rate(c: int) -> float:
            ms = self.perf.iter_ms(app, plan, shape, c) if c > 0 else 0.0
            return 1e3 / ms / job.base_rate if ms else 0.0

        least = 1
        if job.req.guaranteed:
            least = next((c for c in range(1, cpus) if rate(c) >= 1.0 - 1e-6), cpus)
        return CpuShare(
            job.snap.job_id,
            dict(job.alloc),
            cpus,
            min(least, cpus),
            rate,
            taker=plan.zero is Zero.OFFLOAD and not job.frozen,
            victim=not job.frozen,
        )

    def _targets(
        self, jobs: Mapping[str, _Job], node_type: Mapping[str, str]
    ) -> tuple[dict[str, Target], dict[str, tuple[Plan, int]]]:
        """Each placed job's target, and its chosen plan and cores per GPU."""
        mode, elastic = VARIANTS[self.variant]
        cpu_free = {n: self.cpus_per_node for n in node_type}
        chosen: dict[str, tuple[Plan, int]] = {}
        for job_id, job in jobs.items():
            if not job.alloc:
                continue
            if job.frozen and job_id in self._plan and self._alloc.get(job_id) == job.alloc:
                chosen[job_id] = self._plan[job_id]  # untouched: keeps its plan too
            else:
                shape = tuple(sorted(job.alloc.values(), reverse=True))
                c = min(job.req.cpus_per_gpu, self.cpus_per_node // self.gpus_per_node)
                best = self.perf.best(
                    job.req.application,
                    job.req.plan,
                    job.req.gpus,
                    shape,
                    cpus_per_gpu=c,
                    mode=mode,
                )
                assert best is not None  # trim kept only runnable placements
                chosen[job_id] = (best.plan, c)
            for n, k in job.alloc.items():
                cpu_free[n] -= k * chosen[job_id][1]
        if elastic:  # cores to ZeRO-Offload jobs: free ones, then reclaimed (Algorithm 1)
            shares = [self._cpu_share(jobs[j], plan, c) for j, (plan, c) in chosen.items()]
            for job_id, c in share_cpus(shares, cpu_free).items():
                chosen[job_id] = (chosen[job_id][0], c)
        out: dict[str, Target] = {}
        for job_id, job in jobs.items():
            before = (self._alloc.get(job_id), self._plan.get(job_id))
            if job.alloc:
                self._alloc[job_id] = dict(job.alloc)
                self._plan[job_id] = chosen[job_id]
            else:
                self._alloc.pop(job_id, None)
                self._plan.pop(job_id, None)
            after = (self._alloc.get(job_id), self._plan.get(job_id))
            if job.running and before != after:
                self._reconfigs[job_id] = self._reconfigs.get(job_id, 0) + 1
            if not job.alloc:
                continue
            kind = node_type[next(iter(job.alloc))]
            plan, c = chosen[job_id]
            g = job.gpus
            out[job_id] = Target(
                job_id,
                ((kind, g),),
                {kind: (1,) * g},
                plan=plan,
                cpus_per_device=c,
                workers=tuple(sorted(job.alloc.items())),
            )
        for job_id in [j for j in self._alloc if j not in jobs]:  # ended jobs
            self._alloc.pop(job_id, None)
            self._plan.pop(job_id, None)
        return out, chosen


@dataclass
class _Ctx:
    """One decision's mutable state: allocations per node and free GPUs."""

    jobs: dict[str, _Job]
    free: dict[str, int]
    holders: dict[str, set[str]]
    node_type: Mapping[str, str]
    min_gain: float
    runs: Callable[[_Job], bool]  # whether some plan runs on the job's GPUs per node
    # the job's best speed on these GPUs per node over its speed as requested (0: none runs)
    speed: Callable[[_Job, Mapping[str, int]], float]
    taken: dict[str, list[str]] = field(default_factory=dict)  # taker -> its victims (ids)

    def below(self, job: _Job, alloc: Mapping[str, int] | None = None) -> bool:
        """A guaranteed job slower than its request on `alloc` (default: what it holds)."""
        if not job.req.guaranteed:
            return False
        held = job.alloc if alloc is None else alloc
        return not held or self.speed(job, held) < 1.0 - 1e-6

    def can_give(self, job: _Job, node: str) -> bool:
        """Whether `job` may lose one GPU on `node`: a guaranteed job only if it stays at
        its requested speed on the rest."""
        if job.gpus <= job.min_gpus:
            return False
        if not job.req.guaranteed:
            return True
        if job.curve.value[job.gpus - 1] < 1.0 - 1e-6:  # not even on the fewest nodes
            return False
        rest = dict(job.alloc)
        rest[node] -= 1
        return not self.below(job, {n: k for n, k in rest.items() if k > 0})

    def wants(self, job: _Job) -> bool:
        g = job.gpus
        if g >= job.top:
            return False
        return g < job.min_gpus or self.below(job) or job.curve.up[g] > self.min_gain

    def _move(self, job: _Job, node: str, k: int) -> None:
        job.alloc[node] = job.alloc.get(node, 0) + k
        if job.alloc[node] <= 0:
            del job.alloc[node]
            self.holders[node].discard(job.snap.job_id)
        else:
            self.holders[node].add(job.snap.job_id)

    def _victim(self, job: _Job, node: str) -> _Job | None:
        best: _Job | None = None
        below = job.gpus < job.min_gpus or self.below(job)
        best_key = (0.0, "")
        for other_id in self.holders[node]:
            other = self.jobs[other_id]
            if other is job or (other.frozen and not below):
                continue
            key = (other.curve.down[other.gpus], other_id)  # ties: by id, not set order
            if (best is None or key < best_key) and self.can_give(other, node):
                best, best_key = other, key
        return best

    def schedule(self, job: _Job, *, reclaim: bool) -> None:
        """ScheduleJob: free GPUs, then reclaimed ones, node by node."""
        if job.frozen:
            return
        kind = self.node_type[next(iter(job.alloc))] if job.alloc else None
        need = max(job.req.gpus, job.min_gpus) - job.gpus
        allowed = job.snap.types  # the job's accelerator types (empty: any)
        nodes = sorted(  # its own nodes, then the tightest that holds the request, the freest
            (
                n
                for n in self.free
                if (kind is None or self.node_type[n] == kind)
                and (not allowed or self.node_type[n] in allowed)
            ),
            key=lambda n: (
                -job.alloc.get(n, 0),
                not 0 < need <= self.free[n],
                self.free[n] if 0 < need <= self.free[n] else -self.free[n],
                n,
            ),
        )
        undo: list[tuple[_Job, str]] = []
        start = dict(job.alloc)
        for n in nodes:
            if kind is not None and self.node_type[n] != kind:
                continue
            while self.free[n] > 0 and self.wants(job):
                self.free[n] -= 1
                self._move(job, n, 1)
                kind = self.node_type[n]
            while reclaim and self.wants(job):
                victim = self._victim(job, n)
                if victim is None:
                    break
                g = job.gpus
                needs = g < job.min_gpus or self.below(job)
                if not (needs or job.curve.up[g] > victim.curve.down[victim.gpus]):
                    break
                self._move(victim, n, -1)
                self._move(job, n, 1)
                undo.append((victim, n))
                kind = self.node_type[n]
        g = job.gpus
        if job.curve.value[g] <= TOL or g < job.min_gpus or self.below(job):  # give it back
            for victim, n in reversed(undo):
                self._move(job, n, -1)
                self._move(victim, n, 1)
            undo = []
            for n in list(job.alloc):
                back = job.alloc[n] - start.get(n, 0)
                if back > 0:
                    self.free[n] += back
                    self._move(job, n, -back)
        if undo:
            self.taken.setdefault(job.snap.job_id, []).extend(v.snap.job_id for v, _ in undo)

    def trim(self, job: _Job) -> None:
        """Keep the least GPUs that reach the curve's value, on a placement a plan runs on
        (a guaranteed job at its requested speed stays there)."""
        while job.alloc:
            g = job.gpus
            keep = job.curve.least[g]
            if keep == g and self.runs(job):
                return
            smallest = min(job.alloc, key=lambda n: (job.alloc[n], n))
            if job.req.guaranteed and not self.below(job) and not self.can_give(job, smallest):
                return
            self.free[smallest] += 1
            self._move(job, smallest, -1)


@dataclass(frozen=True)
class CpuShare:
    """A placed job in the CPU loop: GPUs per node, cores per GPU now, its CPU minRes,
    and its speed (normalised) at c cores per GPU."""

    job_id: str
    alloc: Mapping[str, int]
    cpus: int
    min_cpus: int
    rate: Callable[[int], float]
    taker: bool = False  # its speed reads cores (ZeRO-Offload plans) and it may change
    victim: bool = True  # it may give cores up (not held by the 0.97 rule)


def share_cpus(
    jobs: Sequence[CpuShare], free: dict[str, int], *, min_gain: float = 1e-3
) -> dict[str, int]:
    """Algorithm 1's loop over CPU cores: the taker with the steepest slope (speed gained per
    core) takes one more core per GPU - on each of its nodes free cores first, then cores
    reclaimed from the job there with the gentlest slope down that is above its CPU minRes,
    while that slope is below the taker's - until no taker gains more than `min_gain`
    (relative) or can be given the cores. Cores per GPU stay uniform over a job's nodes,
    so a victim gives one core per GPU on every node it holds. Returns the jobs whose
    cores per GPU changed; `free` (cores per node) is updated."""
    cpus = {j.job_id: j.cpus for j in jobs}

    def gpus(job: CpuShare) -> int:
        return max(sum(job.alloc.values()), 1)

    def up(job: CpuShare) -> float:
        c = cpus[job.job_id]
        now, more = job.rate(c), job.rate(c + 1)
        return (more - now) / gpus(job) if more > now * (1 + min_gain) else 0.0

    def down(job: CpuShare, have: Mapping[str, int]) -> float:
        c = have[job.job_id]
        return (job.rate(c) - job.rate(c - 1)) / gpus(job)

    def grow(taker: CpuShare) -> bool:
        """One more core per GPU for `taker`, or nothing changes."""
        slope = up(taker)
        if slope <= 0:
            return False
        have, left = dict(cpus), dict(free)
        for node, k in sorted(taker.alloc.items()):
            while left[node] < k:
                victims = [
                    v
                    for v in jobs
                    if v is not taker
                    and v.victim
                    and v.alloc.get(node, 0) > 0
                    and have[v.job_id] > v.min_cpus
                ]
                if not victims:
                    return False
                victim = min(victims, key=lambda v: (down(v, have), v.job_id))
                if down(victim, have) >= slope:
                    return False
                have[victim.job_id] -= 1
                for m, km in victim.alloc.items():
                    left[m] += km
            left[node] -= k
        have[taker.job_id] += 1
        cpus.update(have)
        free.update(left)
        return True

    takers = [j for j in jobs if j.taker]
    bound = sum(free.values()) + sum(j.cpus * gpus(j) for j in jobs)  # cores: a finite loop
    for _ in range(bound):
        if not any(grow(t) for t in sorted(takers, key=lambda j: (-up(j), j.job_id))):
            break
    return {j.job_id: cpus[j.job_id] for j in jobs if cpus[j.job_id] != j.cpus}


def make_rubick(
    perf: PerfSource,
    variant: str = "rubick",
    *,
    quotas: Mapping[str, int] | None = None,
    reclaim: bool = True,
) -> RubickPolicy:
    """The `rubick`, `rubick_e`, `rubick_r` or `rubick_n` allocator (`reclaim=False`: the
    artifact's behaviour, see `RubickPolicy.reclaim`)."""
    return RubickPolicy(perf, variant, quotas=dict(quotas or {}), reclaim=reclaim)


def rubick_names() -> Sequence[str]:
    return sorted(VARIANTS)
