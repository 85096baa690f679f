"""From a StartTaskRequest to what each of the task's training processes runs.

The contract is one message, not flags: the daemon writes the task's TrainingTask
(protos/gearshift/v1/training.proto) to `task.binpb` in the task's folder (mode 0600)
and starts every local rank as

    python -m gearshift.worker.run --task TASK_DIR/task.binpb --rank R

The message carries the request's JobSpec (defaults filled in), ExecutionPlan and
Placement as they came, unmapped, and the facts of this run that the request or the
daemon decides: ids, generation, rendezvous address and group, endpoints, checkpoint
folder and resume, the daemon's checkpoint interval for a spec that says 0, the job's
code folder, loader processes, collocation and pause file, device and backend, the
task folder's files (progress, stats, per-rank timing) and, per local rank, its GPU.
The runtime reads every setting from it (training_task.resolve, the one reader, also
behind the reference runner's flags), so a new JobSpec field touches its proto and its
user only. The job token is never in it nor in argv: it travels in the environment
(GEARSHIFT_TOKEN).

The seed is the job's one seed: model initialisation, every EST's random
states and the data order all derive from `dataset.seed`, so a local run of the spec
(`python -m gearshift.worker.run --spec`) reproduces the job. Every process gets the
plan's intra-op threads (one unless the spec's plan_dimensions.threads allows more,
which needs D2, whatever the device label says): under D1 one thread makes a job's
digest identical for any placement on machines of one CPU type; D2 runs every kernel
with its own fixed count and pins the kernels' ISA across CPU types too.

A background task (DeepPool's multiplexing) runs at the lowest CPU priority and
waits before a global step while its pause file exists (the daemon's collocation
loop writes it); foreground and shared tasks run as any other.

Validation names the request field (`placement.processes[2].est_ids`, ...).

A parameter-server job (spec.parameter_server) runs one process a task instead: the PS launcher,
`python -m gearshift.worker.ps.run --task`, with the counts and cores of the request's
ps_plan, the spec's click-data and model knobs, the job's checkpoint folder (always
resumed when it holds a checkpoint), total_steps global batches, the shard manager's
dynamic shards (dataset_id), and the task folder's progress.json (ps/task.py). A job
spread over several workers (parameter_server.slots) runs on each its share of the
processes (ps/spread.py), meeting through a TCP store at the placement's rendezvous
address, which the launcher of rank 0 serves.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gearshift.common import execplan
from gearshift.common.auth import TOKEN_VARIABLE
from gearshift.common.config import host_port
from gearshift.common.facts import total_steps
from gearshift.common.jobspec import is_ps_job, validate_job_spec, with_defaults
from gearshift.common.profiles import profile_key
from gearshift.common.sharding import num_shards
from gearshift.common.validation import check_generation, check_name, require
from gearshift.v1 import common_pb2, training_pb2, worker_pb2
from gearshift.worker.gpus import VISIBLE_VARIABLE, task_gpus
from gearshift.worker.inplace import MEMBERSHIP_FILE, check_join, to_change
from gearshift.worker.ps.spread import format_roles, spread_roles
from gearshift.worker.runtime.backend import choose_backend
from gearshift.worker.runtime.membership import Change
from gearshift.worker.runtime.settings import RunSettings
from gearshift.worker.spawner import RUN_MODULE
from gearshift.worker.training_task import data_mode

STEP_LOG = "steps.jsonl"
PAUSE_FILE = "pause"  # in the task's folder: a background task waits while it exists
DEFAULT_CHECKPOINT_EVERY = 20  # global steps, when the spec says 0
MAX_LOADER_PROCS = 64  # shared loader processes of one training process


def timing_file(rank: int) -> str:
    """The file in the task's folder where rank `rank` keeps its compute time per step."""
    return f"timing-rank{rank}.json"


_TOKEN = re.compile(r"[!-~]{0,512}")  # a bearer token: printable, no spaces


@dataclass(frozen=True)
class CommandSettings:
    """What the daemon adds to every training process (daemon flags)."""

    python: str
    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY
    log_every: int = 5
    report_interval: float = 1.0
    process_group_timeout: float = 120.0
    accelerator: str = "cpu"  # "cpu" or "cuda"
    zygote: bool = True  # fork training processes from a process that imported torch once
    step_delay: float = 0.0  # tests only: every process sleeps this long a step (--step-delay)
    index_log_dir: Path | None = None  # dynamic mode: every process logs the shards it reads


@dataclass(frozen=True)
class TaskPlan:
    """A validated task: what to run for each local rank."""

    task_id: str
    job_id: str
    dataset_id: str
    spec: common_pb2.JobSpec
    ranks: tuple[int, ...]  # local ranks
    mapping: tuple[int, ...]  # ESTs per rank, whole placement
    device_of: dict[int, int]  # local rank -> device index on this worker
    devices: tuple[tuple[str, int], ...]  # (worker id, device index) of every rank, in order
    total_steps: int
    checkpoint_dir: Path
    rendezvous: str
    resume: bool
    endpoints: worker_pb2.ServiceEndpoints
    accelerator_type: str
    job_token: str = ""  # the processes' bearer token, scoped to the job ("": the daemon's)
    profile_first: bool = False  # rank 0 profiles the job's layers before training
    profile_rubick: bool = False  # rank 0 runs Rubick's profiling run before training
    plan: common_pb2.ExecutionPlan = field(default_factory=common_pb2.ExecutionPlan)
    collocation: common_pb2.Collocation = field(default_factory=common_pb2.Collocation)
    loader_procs: int = 0  # shared loader processes per training process (the resource plan)
    ps_plan: common_pb2.ParameterServerPlan | None = None  # a parameter-server job's plan
    generation: int = 0  # the placement's generation (fences its shard holders; 0: unfenced)
    placement: common_pb2.Placement = field(default_factory=common_pb2.Placement)
    # The in-place change its processes join (StartTaskRequest.join_generation; None: they
    # start or resume the job).
    join: Change | None = None

    @property
    def background(self) -> bool:
        return self.collocation.role == common_pb2.COLLOCATION_ROLE_BACKGROUND

    @property
    def world_size(self) -> int:
        return len(self.mapping)

    @property
    def data_mode(self) -> str:
        return data_mode(self.spec, self.endpoints)

    @property
    def backend(self) -> str:
        """The backend of every process of the job on GPUs (see gpus.py)."""
        return choose_backend("cuda", self.devices)

    def environment(
        self, rank: int, settings: CommandSettings, env: Mapping[str, str]
    ) -> dict[str, str]:
        """The environment of local rank `rank`: `env`, plus the GPUs it sees on CUDA."""
        out = dict(env)
        if self.job_token:
            out[TOKEN_VARIABLE] = self.job_token
        if settings.accelerator == "cuda":
            out[VISIBLE_VARIABLE] = task_gpus(self.device_of)[rank].visible
        return out

    def training_task(
        self, settings: CommandSettings, task_dir: Path, code_dir: Path | None = None
    ) -> training_pb2.TrainingTask:
        """The message every local process reads (`code_dir`: the job's own code, unpacked):
        the request's spec, plan and placement as they came, and the daemon's facts."""
        e, cuda = self.endpoints, settings.accelerator == "cuda"
        task = training_pb2.TrainingTask(
            spec=self.spec,
            plan=self.plan,
            placement=self.placement,
            job_id=self.job_id,
            task_id=self.task_id,
            dataset_id=self.dataset_id,
            generation=self.generation,
            process_group_timeout_seconds=settings.process_group_timeout,
            checkpoint_dir=str(self.checkpoint_dir),
            resume=self.resume,
            default_checkpoint_every=settings.checkpoint_every,
            keep_checkpoints=RunSettings.keep_checkpoints,
            endpoints=e,
            accelerator_type=self.accelerator_type,
            report_interval_seconds=settings.report_interval,
            code_dir=str(code_dir or ""),
            loader_procs=self.loader_procs,
            collocation=self.collocation,
            pause_file=str(task_dir / PAUSE_FILE) if self.background else "",
            device="cuda" if cuda else "cpu",
            backend=self.backend if cuda else "auto",
            log_every=settings.log_every,
            loss_log=str(self.checkpoint_dir / STEP_LOG),
            stats_dir=str(task_dir / "stats"),
            progress_file=str(task_dir / "progress.json"),
            profile_rubick=self.profile_rubick,
            step_delay_seconds=settings.step_delay,
            loader_workers=RunSettings.loader_workers,
            d2_threads=RunSettings.d2_threads,
            tree_shape=RunSettings.tree_shape,
            membership_file=str(task_dir / MEMBERSHIP_FILE),
            join_generation=self.join.generation if self.join is not None else 0,
        )
        # The placement's name in the rendezvous: the task id up to its worker
        # (JOB.gGENERATION), the same on every worker of this placement and on no other; a
        # single process needs it too, for the group an in-place grow forms with joiners.
        task.rendezvous_group = self.task_id.rpartition(".")[0] or self.job_id
        if self.world_size > 1:
            task.rendezvous_address = self.rendezvous
        if self.profile_first and e.brain:
            task.profile_key = profile_key(self.spec, task.device)
        if settings.index_log_dir is not None and self.data_mode == "dynamic":
            task.index_log_dir = str(settings.index_log_dir)
        gpus = task_gpus(self.device_of) if cuda else {}
        for rank in self.ranks:
            process = task.processes[rank]
            process.timing_file = str(task_dir / timing_file(rank))
            if rank in gpus:
                process.local_device = gpus[rank].local_device
        return task

    @property
    def spawned_ranks(self) -> tuple[int, ...]:
        """The local ranks that get a process: a PS job's launcher is one for them all."""
        return self.ranks[:1] if self.ps_plan is not None else self.ranks

    def command(self, rank: int, settings: CommandSettings, task_file: Path) -> list[str]:
        """The argv of local rank `rank`, which reads everything else from `task_file`."""
        if self.ps_plan is not None:
            return self.ps_command(settings, task_file.parent)
        return [settings.python, *RUN_MODULE, "--task", str(task_file), "--rank", str(rank)]

    def ps_command(self, settings: CommandSettings, task_dir: Path) -> list[str]:
        """The PS launcher's argv (a parameter-server job's one process)."""
        assert self.ps_plan is not None
        plan, ps = self.ps_plan, self.spec.parameter_server
        cmd = [settings.python, "-m", "gearshift.worker.ps.run", "--task"]
        cmd += ["--ps", str(plan.ps), "--workers", str(plan.workers)]
        each = list(plan.ps_cores_each) or [plan.ps_cores] * plan.ps
        cmd += ["--ps-cores-each", ",".join(f"{c:g}" for c in each)]
        cmd += ["--worker-cores", f"{plan.worker_cores:g}"]
        cmd += ["--total-steps", str(self.total_steps)]
        cmd += ["--checkpoint-dir", str(self.checkpoint_dir)]
        if self.resume:
            cmd.append("--resume")
        cmd += ["--seed", str(ps.seed), "--fields", str(ps.fields), "--vocab", str(ps.vocab)]
        cmd += ["--batch", str(ps.batch), "--train-blocks", str(ps.train_blocks)]
        cmd += ["--dim", str(ps.dim), "--lr", repr(ps.lr), "--eval-blocks", str(ps.eval_blocks)]
        cmd += ["--read-ms", repr(ps.read_ms)]
        cmd += ["--shard-manager", self.endpoints.shard_manager]
        cmd += ["--dataset-id", self.dataset_id, "--job-id", self.job_id]
        # Enough epochs of one-batch shards for every global batch of the job.
        cmd += ["--epochs", str(-(-self.total_steps // ps.train_blocks) + 1)]
        cmd += ["--progress-file", str(task_dir / "progress.json")]
        cmd += ["--stats-file", str(task_dir / "stats" / f"rank{self.ranks[0]}.json")]
        if len(self.ranks) < self.world_size:  # spread over workers: meet through TCP
            roles = spread_roles(plan.ps, plan.workers, self.world_size, self.ranks)
            cmd += ["--store", self.rendezvous, "--roles", format_roles(roles)]
            if 0 in self.ranks:
                cmd.append("--serve-store")
        # No phase deadline: the task runs until its batches are done or it is stopped.
        cmd += ["--timeout", "inf"]
        if self.spec.checkpoint_every_steps > 0:  # global batches between checkpoints
            cmd += ["--checkpoint-every", str(self.spec.checkpoint_every_steps)]
        return cmd


def check_ps_plan(plan: common_pb2.ParameterServerPlan, spec: common_pb2.JobSpec) -> None:
    """A ParameterServerPlan within the spec's bounds; ValidationError naming the field."""
    ps = spec.parameter_server
    require(
        1 <= plan.ps <= ps.max_ps,
        "ps_plan.ps",
        f"must be 1-{ps.max_ps} (spec.parameter_server.max_ps), got {plan.ps}",
    )
    require(
        1 <= plan.workers <= ps.max_workers,
        "ps_plan.workers",
        f"must be 1-{ps.max_workers} (spec.parameter_server.max_workers), got {plan.workers}",
    )
    for name in ("ps_cores", "worker_cores"):
        value = getattr(plan, name)
        require(math.isfinite(value) and value > 0, f"ps_plan.{name}", f"must be > 0, got {value}")
    require(
        len(plan.ps_cores_each) in (0, plan.ps),
        "ps_plan.ps_cores_each",
        f"{len(plan.ps_cores_each)} values for {plan.ps} PS (empty: ps_cores each)",
    )
    for i, value in enumerate(plan.ps_cores_each):
        require(
            math.isfinite(value) and value > 0,
            f"ps_plan.ps_cores_each[{i}]",
            f"must be > 0, got {value}",
        )


def _mapping(processes: Sequence[common_pb2.ProcessAssignment], num_ests: int) -> tuple[int, ...]:
    """ESTs per rank; the runtime needs consecutive EST ids in rank order."""
    require(len(processes) > 0, "placement.processes", "is required (at least one process)")
    require(
        len(processes) <= num_ests,
        "placement.processes",
        f"{len(processes)} processes for {num_ests} ESTs: every process needs an EST",
    )
    by_rank = sorted(range(len(processes)), key=lambda i: processes[i].rank)
    counts: list[int] = []
    first = 0
    for rank, index in enumerate(by_rank):
        process = processes[index]
        field = f"placement.processes[{index}]"
        require(
            process.rank == rank,
            f"{field}.rank",
            f"ranks must be 0..{len(processes) - 1}, each once (got {process.rank})",
        )
        ests = list(process.est_ids)
        expected = list(range(first, first + len(ests)))
        require(len(ests) > 0, f"{field}.est_ids", "every process needs at least one EST")
        require(
            ests == expected and expected[-1] < num_ests,
            f"{field}.est_ids",
            f"must be {expected if expected[-1] < num_ests else 'within 0..' + str(num_ests - 1)}"
            f": ESTs are numbered consecutively in rank order (got {ests})",
        )
        counts.append(len(ests))
        first += len(ests)
    require(
        first == num_ests,
        "placement.processes",
        f"the processes hold {first} ESTs, not the job's {num_ests} (spec.num_ests)",
    )
    return tuple(counts)


def _check_collocation(collocation: common_pb2.Collocation, job_id: str) -> None:
    role, bound = collocation.role, collocation.max_foreground_slowdown
    require(
        role in common_pb2.CollocationRole.values(),
        "collocation.role",
        f"{role} is not a CollocationRole",
    )
    if role == common_pb2.COLLOCATION_ROLE_UNSPECIFIED:
        return
    partner = collocation.partner_job_id
    if role == common_pb2.COLLOCATION_ROLE_BACKGROUND or partner:
        check_name(partner, "collocation.partner_job_id")
        require(partner != job_id, "collocation.partner_job_id", "names the task's own job")
    require(
        math.isfinite(bound) and bound >= 0,
        "collocation.max_foreground_slowdown",
        f"must be a number >= 0 (0: the worker's default), got {bound}",
    )


def plan_task(
    request: worker_pb2.StartTaskRequest, worker_id: str, device_types: Sequence[str]
) -> TaskPlan:
    """Validate a StartTaskRequest for this worker; ValidationError names the bad field."""
    check_name(request.task_id, "task_id")
    check_name(request.job_id, "job_id")
    require(request.HasField("spec"), "spec", "is required")
    validate_job_spec(request.spec, "spec")
    spec = with_defaults(request.spec)
    require(
        spec.dataset.mode != common_pb2.DATA_MODE_DYNAMIC or bool(request.endpoints.shard_manager),
        "endpoints.shard_manager",
        "is required for a dynamic-mode dataset (spec.dataset.mode)",
    )
    if spec.dataset.mode != common_pb2.DATA_MODE_DYNAMIC:
        shards = num_shards(spec.dataset.size, spec.dataset.shard_size)
        require(
            shards >= spec.num_ests,
            "spec.dataset.shard_size",
            f"{spec.dataset.size} samples in shards of {spec.dataset.shard_size} make {shards} "
            f"shards, fewer than the {spec.num_ests} ESTs",
        )
    ps_plan = None
    if is_ps_job(spec):
        require(
            request.HasField("ps_plan"),
            "ps_plan",
            "is required for a parameter-server job (spec.parameter_server)",
        )
        check_ps_plan(request.ps_plan, spec)
        ps_plan = request.ps_plan
    else:
        require(
            not request.HasField("ps_plan"),
            "ps_plan",
            "is only for a parameter-server job (spec.parameter_server is unset)",
        )
    mapping = _mapping(request.placement.processes, spec.num_ests)
    execplan.check_allowed(spec, request.plan, "plan")
    by_rank = {p.rank: (i, p) for i, p in enumerate(request.placement.processes)}
    require(len(request.local_ranks) > 0, "local_ranks", "is required (at least one rank)")
    device_of: dict[int, int] = {}
    for i, rank in enumerate(request.local_ranks):
        field = f"local_ranks[{i}]"
        require(rank in by_rank, field, f"rank {rank} is not in the placement")
        require(rank not in device_of, field, f"rank {rank} is listed twice")
        index, process = by_rank[rank]
        require(
            not process.worker_id or process.worker_id == worker_id,
            field,
            f"rank {rank} is placed on worker {process.worker_id!r}, not here ({worker_id!r})",
        )
        require(
            0 <= process.device_index < len(device_types),
            f"placement.processes[{index}].device_index",
            f"{process.device_index} is not a device of this worker (0..{len(device_types) - 1})",
        )
        device_of[rank] = process.device_index
    require(
        len(set(device_of.values())) == len(device_of),
        "placement.processes",
        "two local ranks share one device",
    )
    if len(mapping) > 1:
        require(bool(request.rendezvous_address), "rendezvous_address", "is required (P > 1)")
        try:
            host_port(request.rendezvous_address)
        except ValueError as exc:
            require(False, "rendezvous_address", str(exc))
    require(bool(request.checkpoint_dir), "checkpoint_dir", "is required")
    require(
        _TOKEN.fullmatch(request.job_token) is not None,
        "job_token",
        "at most 512 printable ASCII characters without spaces",
    )
    require(
        0 <= request.loader_procs_per_process <= MAX_LOADER_PROCS,
        "loader_procs_per_process",
        f"must be 0-{MAX_LOADER_PROCS} (got {request.loader_procs_per_process})",
    )
    check_generation(request.generation)
    join = _join(request, mapping, tuple(sorted(device_of)))
    dataset_id = request.dataset_id or request.job_id
    check_name(dataset_id, "dataset_id")
    _check_collocation(request.collocation, request.job_id)
    for name in ("brain", "shard_manager"):
        address = getattr(request.endpoints, name)
        if address:
            try:
                host_port(address)
            except ValueError as exc:
                require(False, f"endpoints.{name}", str(exc))
    # The Brain's samples name the slowest type; EasyScale gives slower devices fewer ESTs.
    processes = sorted(request.placement.processes, key=lambda p: (len(p.est_ids), p.rank))
    return TaskPlan(
        task_id=request.task_id,
        job_id=request.job_id,
        dataset_id=dataset_id,
        spec=spec,
        ranks=tuple(sorted(device_of)),
        mapping=mapping,
        device_of=device_of,
        devices=tuple(
            (p.worker_id, p.device_index)
            for p in sorted(request.placement.processes, key=lambda p: p.rank)
        ),
        total_steps=total_steps(spec),
        checkpoint_dir=Path(request.checkpoint_dir).absolute(),
        rendezvous=request.rendezvous_address,
        resume=request.resume,
        endpoints=request.endpoints,
        accelerator_type=processes[0].accelerator_type or device_types[0],
        job_token=request.job_token,
        profile_first=request.profile_first,
        profile_rubick=request.profile_rubick,
        collocation=request.collocation,
        plan=request.plan,
        loader_procs=request.loader_procs_per_process,
        ps_plan=ps_plan,
        generation=request.generation,
        placement=request.placement,
        join=join,
    )


def _join(
    request: worker_pb2.StartTaskRequest, mapping: tuple[int, ...], ranks: tuple[int, ...]
) -> Change | None:
    """The in-place change a StartTask's processes join (None: not one that joins)."""
    if request.join_generation == 0:
        require(not request.HasField("membership"), "membership", "needs join_generation")
        return None
    require(request.join_generation > 0, "join_generation", "must be >= 0")
    require(request.HasField("membership"), "membership", "is required with join_generation")
    require(not request.resume, "resume", "a joining process takes the running job's state")
    require(not is_ps_job(request.spec), "join_generation", "not for a parameter-server job")
    change = to_change(request.membership, "membership")
    require(
        change.generation == request.join_generation,
        "membership.generation",
        f"is {change.generation}, not join_generation {request.join_generation}",
    )
    check_join(change, mapping, ranks, "membership")
    if len(mapping) > 1:
        require(
            change.master_addr == request.rendezvous_address,
            "rendezvous_address",
            f"must be the change's master_addr {change.master_addr!r}",
        )
    return change
