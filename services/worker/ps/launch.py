"""One phase of a PS job: start PS and worker processes, train, checkpoint, stop.

A phase is one generation of processes with a fixed PS and worker count. The PSs
start from the last checkpoint (re-partitioning its rows when the PS count
changed), the workers train until the phase's global batches are claimed, then
`rpc.shutdown()` drains every outstanding call and each PS writes its shard; the
launcher publishes the generation in the manifest only when every process exited
cleanly. Scaling = ending a phase and starting the next with other counts.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import math
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch.distributed import rpc

from gearshift.worker.ps import checkpoint as ckpt
from gearshift.worker.ps import server
from gearshift.worker.ps.data import ClickConfig, ClickData
from gearshift.worker.ps.feed import CounterFeed, Feed, ShardFeed, ShardSource, call_out_of_process
from gearshift.worker.ps.meet import Meeting, check_roles, init_method, serve_store
from gearshift.worker.ps.model import DenseNet, ModelConfig, init_rows
from gearshift.worker.ps.sharding import repartition
from gearshift.worker.ps.task import PS0_PROGRESS, STOP_FILE, UseMeter, read_json, write_json_atomic
from gearshift.worker.ps.trainer import ps_name, train, worker_name
from gearshift.worker.runtime.interface import GLOO_IFNAME, TENSORPIPE_IFNAME, set_interface


@dataclass(frozen=True)
class Phase:
    ps: int
    workers: int
    steps: int  # global batches (over all workers) this phase trains

    def __post_init__(self) -> None:
        if self.ps < 1:
            raise ValueError(f"a phase needs at least 1 PS, got {self.ps}")
        if self.workers < 1:
            raise ValueError(f"a phase needs at least 1 worker, got {self.workers}")
        if self.steps < 0:
            raise ValueError(f"phase steps must be >= 0, got {self.steps}")


@dataclass(frozen=True)
class PhaseResult:
    generation: int
    ps: int
    workers: int
    first_batch: int
    end_batch: int
    samples: int
    samples_per_s: float  # from the first step's start to the last step's end
    start_s: float  # launch -> first step (processes, re-partition, RPC set-up)
    stop_s: float  # last step -> every process exited (drain, PS shards written)
    updates_acked: int  # this phase
    updates_applied: int  # this phase
    ps_busy_s: list[float]  # per PS: time inside lookup/push (hot PS shows here)
    batches_missing: int  # global batches of the phase no worker trained (expected 0)
    batches_repeated: int  # global batches trained more than once (expected 0)
    shards_covered: int = 0  # shard-manager acks made final by this phase's checkpoint
    auc: float | None = None
    stopped: bool = False  # ended early by a stop request (the stop file)
    metrics: dict[str, Any] | None = None  # measured use (task.UseMeter.metrics)


@dataclass(frozen=True)
class _Proc:
    root: str
    generation: int
    prev: ckpt.Manifest | None
    num_ps: int
    num_workers: int
    data: ClickConfig
    model: ModelConfig
    end_batch: int
    role: str  # "ps" or "worker"
    index: int
    shards: ShardSource | None = None
    cores: tuple[int, ...] = ()  # pinned to these (empty: the launcher's affinity)
    read_ms: float = 0.0  # a worker's stand-in fetch time per batch (see trainer.train)
    stop_at: float | None = None  # PS 0: wall clock (time.time) to stop handing out batches
    meeting: Meeting | None = None  # across hosts: the TCP store (None: the file store)


def _init_rpc(p: _Proc, name: str, rank: int) -> None:
    # A file store, not tcp://: with tcp the store lives in rank 0, and rank 0 may leave
    # rpc.shutdown() while another rank still syncs its call counts through the store
    # (seen: "Connection reset by peer" in a peer's shutdown, the phase lost). Across
    # hosts, the coordinator launcher's TCP store (meet.py), for the same reason.
    if p.meeting is not None:
        method = init_method(p.meeting, p.generation)
        for variable in (TENSORPIPE_IFNAME, GLOO_IFNAME):  # rpc makes a gloo group too
            set_interface(p.meeting.store, variable)  # peers must reach our address
    else:
        method = f"file://{Path(p.root) / ckpt.gen_folder(p.generation) / 'rpc.store'}"
    opts = rpc.TensorPipeRpcBackendOptions(
        init_method=method,
        num_worker_threads=8,
        rpc_timeout=120,
        _transports=["uv"],
        _channels=["basic"],
    )
    world = p.num_ps + p.num_workers
    rpc.init_rpc(name, rank=rank, world_size=world, rpc_backend_options=opts)  # type: ignore[no-untyped-call]


def _load_shard(p: _Proc) -> server.Shard:
    total = p.data.rows
    if p.prev is None:
        rows = init_rows(total, p.index, p.num_ps, p.model, p.data.seed)
        return server.Shard(rows, torch.zeros_like(rows), p.model.lr)
    old_rows, old_accum = ckpt.load_shards(Path(p.root), p.prev)
    return server.Shard(
        repartition(old_rows, total, p.index, p.num_ps),
        repartition(old_accum, total, p.index, p.num_ps),
        p.model.lr,
    )


def _load_dense(p: _Proc) -> server.DenseServer:
    net = DenseNet(p.model, p.data.fields, p.data.dense, p.data.seed)
    if p.prev is None:
        return server.DenseServer(net, p.model, 0, p.end_batch)
    blob = torch.load(ckpt.dense_path(Path(p.root), p.prev.generation), weights_only=True)
    net.load_state_dict(blob["net"])
    dense = server.DenseServer(net, p.model, p.prev.next_batch, p.end_batch)
    dense.opt.load_state_dict(blob["opt"])
    return dense


def _write_result(p: _Proc, fields: dict[str, Any]) -> None:
    path = Path(p.root) / ckpt.gen_folder(p.generation) / f"{p.role}-{p.index}.json"
    path.write_text(json.dumps(fields))


def _watch_counter(p: _Proc, dense: server.DenseServer, done: threading.Event) -> None:
    """PS 0: publish the batch counter (the launcher's progress) and honour the stop file."""
    root = Path(p.root)
    out = root / ckpt.gen_folder(p.generation) / PS0_PROGRESS
    while not done.is_set():
        if (root / STOP_FILE).exists() or (p.stop_at is not None and time.time() >= p.stop_at):
            dense.stop()
        next_batch, end_batch = dense.counter()
        write_json_atomic(out, {"next_batch": next_batch, "end_batch": end_batch})
        done.wait(0.1)


def rows_digest(rows: torch.Tensor) -> str:
    """SHA-256 of a shard's rows (local order): what a PS started with, in its result, so a
    test compares it with the previous checkpoint re-partitioned by global row id."""
    return hashlib.sha256(rows.contiguous().numpy().tobytes()).hexdigest()


def _ps_main(p: _Proc) -> None:
    shard = _load_shard(p)
    started_with = rows_digest(shard.rows)
    dense = _load_dense(p) if p.index == 0 else None
    server.serve(shard, dense)
    done = threading.Event()
    if dense is not None:
        threading.Thread(target=_watch_counter, args=(p, dense, done), daemon=True).start()
    _init_rpc(p, ps_name(p.index), p.index)
    rpc.shutdown()  # returns once every worker is done and every call is answered
    done.set()
    saved = time.time()
    root = Path(p.root)
    ckpt.save_atomic(
        {"rows": shard.rows, "accum": shard.accum}, ckpt.shard_path(root, p.generation, p.index)
    )
    result: dict[str, Any] = {
        "updates": shard.stats.updates,
        "busy_s": shard.stats.busy_s,
        "start_rows_sha256": started_with,
    }
    if dense is not None:
        ckpt.save_atomic(
            {"net": dense.net.state_dict(), "opt": dense.opt.state_dict()},
            ckpt.dense_path(root, p.generation),
        )
        result.update(next_batch=dense.next_batch, dense_updates=dense.updates)
    result["save_s"] = time.time() - saved
    _write_result(p, result)


def _worker_main(p: _Proc) -> None:
    _init_rpc(p, worker_name(p.index), p.num_ps + p.index)
    data = ClickData(p.data)
    feed: Feed = CounterFeed(data)
    holder = ""
    if p.shards is not None:
        holder = p.shards.holder(p.generation, p.index)
        feed = ShardFeed(data, p.shards, holder)
    stats = train(data, p.model, p.num_ps, feed, read_ms=p.read_ms)
    acked = feed.finish()
    rpc.shutdown()
    _write_result(p, {**asdict(stats), "holder": holder, "shards": acked})


def _die_with_parent() -> None:
    """SIGKILL this process when the launcher dies (a stop without checkpoint kills only
    the launcher): PR_SET_PDEATHSIG. Linux only; elsewhere a no-op."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def _child(p: _Proc) -> None:
    _die_with_parent()
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # the launcher's stop signal is not ours
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if p.cores:
        os.sched_setaffinity(0, p.cores)
    torch.set_num_threads(1)
    # rpc.shutdown's own all-gather trips a deprecation warning inside torch; not ours to fix.
    warnings.filterwarnings("ignore", message="You are using a Backend")
    if p.role == "ps":
        _ps_main(p)
    else:
        _worker_main(p)


def _kill(procs: list[Any]) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(10)


TICK_S = 0.5


def _wait_all(procs: list[Any], deadline: float, tick: Callable[[], None] | None = None) -> None:
    """Until every process has exited, one has failed (the rest would hang), or the deadline;
    `tick` every TICK_S meanwhile."""
    live = list(procs)
    while live:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        if tick is not None:
            tick()
        mp.connection.wait([p.sentinel for p in live], timeout=min(left, TICK_S))
        live = [p for p in live if p.exitcode is None]
        if any(p.exitcode not in (None, 0) for p in procs):
            return


def _wait_for(ready: Callable[[], bool], deadline: float, what: str) -> None:
    """Until `ready()`, polling every TICK_S / 5; RuntimeError naming `what` at the deadline."""
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"PS launcher: timed out waiting for {what} on the other hosts")
        time.sleep(TICK_S / 5)


def _published(root: Path, generation: int) -> ckpt.Manifest:
    manifest = ckpt.read_manifest(root)
    if manifest is None or manifest.generation != generation:
        raise RuntimeError(f"PS phase {generation}: the coordinator published another checkpoint")
    return manifest


def _warm_up() -> None:
    """Pay once, in the launcher, for what torch imports lazily on first use (the first
    optimizer pulls in torch._dynamo, seconds), so forked PS processes start at once."""
    param = torch.nn.Parameter(torch.zeros(1))
    torch.optim.Adagrad([param])


def run_phase(
    root: Path,
    phase: Phase,
    data: ClickConfig,
    model: ModelConfig,
    *,
    timeout_s: float = 300.0,
    shards: ShardSource | None = None,
    cores: Sequence[Sequence[int]] | None = None,
    on_tick: Callable[[UseMeter, dict[str, Any]], None] | None = None,
    read_ms: float = 0.0,
    stop_after_s: float | None = None,
    meeting: Meeting | None = None,
) -> PhaseResult:
    """Train one phase from the checkpoint in `root` (if any) and checkpoint it there.

    With `shards`, workers read dynamic shards from the shard manager; their
    provisional acks are covered once the phase's checkpoint is published, and a
    phase that fails releases its workers' holders (their shards are read again).
    `read_ms`: each worker waits this long per batch, a stand-in for reading the batch
    from remote storage (what bounds DLRover's workers; see trainer.train).
    `stop_after_s`: PS 0 hands out no batch later than this many seconds after launch
    (the phase then drains and checkpoints like a stop request): a wall-time budget.
    `meeting`: the phase spans launchers on several hosts sharing `root` (meet.py); this
    one runs the processes its roles name. The one that serves the store cleans the
    generation's folder, waits for every process's result and publishes the checkpoint;
    the others wait for that checkpoint, and all return the same PhaseResult.
    """
    if not (math.isfinite(read_ms) and read_ms >= 0):
        raise ValueError(f"read_ms must be a finite number >= 0, got {read_ms}")
    if stop_after_s is not None and not stop_after_s > 0:
        raise ValueError(f"stop_after_s must be > 0, got {stop_after_s}")
    root.mkdir(parents=True, exist_ok=True)
    prev = ckpt.read_manifest(root)
    if prev is not None and (prev.click_config() != data or prev.model_config() != model):
        raise ValueError(
            f"checkpoint in {root} was made with data {prev.data} and model {prev.model}; "
            f"got data {asdict(data)} and model {asdict(model)}"
        )
    generation = prev.generation + 1 if prev is not None else 0
    first_batch = prev.next_batch if prev is not None else 0
    gen_dir = root / ckpt.gen_folder(generation)
    gen_dir.mkdir(parents=True, exist_ok=True)
    publisher = meeting is None or meeting.serve
    if publisher:
        for stale in gen_dir.iterdir():  # a phase that died before its manifest
            stale.unlink()
    if meeting is not None and meeting.roles is not None:
        check_roles(meeting.roles, phase.ps, phase.workers)
    _warm_up()
    if shards is not None:
        call_out_of_process(shards, "create", train_blocks=data.train_blocks, seed=data.seed)
    if cores is not None and len(cores) != phase.ps + phase.workers:
        raise ValueError(f"{len(cores)} core sets for {phase.ps + phase.workers} processes")
    specs = [
        _Proc(str(root), generation, prev, phase.ps, phase.workers, data, model,
              first_batch + phase.steps, role, i, shards)
        for role, count in (("ps", phase.ps), ("worker", phase.workers))
        for i in range(count)
    ]  # fmt: skip
    if cores is not None:
        specs = [replace(s, cores=tuple(c)) for s, c in zip(specs, cores, strict=True)]
    result_names = [f"{s.role}-{s.index}" for s in specs]  # every process's, on every host
    if meeting is not None:
        specs = [replace(s, meeting=meeting) for s in specs if meeting.runs(s.role, s.index)]
    # fork: the children inherit torch already imported, which keeps a restart short.
    ctx = mp.get_context("fork")
    launched = time.time()
    stop_at = launched + stop_after_s if stop_after_s is not None else None
    specs = [replace(s, read_ms=read_ms, stop_at=stop_at) for s in specs]
    deadline = time.monotonic() + timeout_s
    store = serve_store(meeting, timeout_s) if meeting is not None and meeting.serve else None
    procs = [
        ctx.Process(target=_child, args=(s,), name=f"gearshift-{s.role}{s.index}") for s in specs
    ]
    for proc in procs:
        proc.start()
    meter = UseMeter(
        [int(pr.pid or 0) for s, pr in zip(specs, procs, strict=True) if s.role == "ps"],
        [int(pr.pid or 0) for s, pr in zip(specs, procs, strict=True) if s.role == "worker"],
    )

    def tick() -> None:
        counter = read_json(gen_dir / PS0_PROGRESS)
        next_batch = int(counter.get("next_batch", first_batch))
        end_batch = int(counter.get("end_batch", first_batch + phase.steps))
        if first_batch < next_batch < end_batch:  # training: not set-up, not the drain
            meter.sample()
        if on_tick is not None:
            on_tick(meter, counter)

    try:
        _wait_all(procs, deadline, tick)
        failed = [(s, pr.exitcode) for s, pr in zip(specs, procs, strict=True) if pr.exitcode != 0]
        if failed:
            names = ", ".join(f"{s.role}{s.index} (exit {code})" for s, code in failed)
            raise RuntimeError(f"PS phase {generation} failed within {timeout_s:.0f} s: {names}")
        if publisher:  # the other hosts' processes too
            results = [gen_dir / f"{n}.json" for n in result_names]
            _wait_for(lambda: all(r.exists() for r in results), deadline, f"phase {generation}")
    except BaseException:
        _kill(procs)
        if shards is not None:  # their uncovered acks are undone: those shards are read again
            for w in range(phase.workers):
                holder = shards.holder(generation, w)
                call_out_of_process(shards, "release", holder=holder, reason="PS phase failed")
        raise
    finally:
        _kill(procs)
        if store is not None:
            del store  # every process has its result: none needs the store any more
    if not publisher:

        def published() -> bool:
            done = ckpt.read_manifest(root)
            return done is not None and done.generation >= generation

        _wait_for(published, deadline, f"phase {generation}'s checkpoint")
    stopped = time.time()
    ps_res = [json.loads((gen_dir / f"ps-{i}.json").read_text()) for i in range(phase.ps)]
    w_res = [json.loads((gen_dir / f"worker-{i}.json").read_text()) for i in range(phase.workers)]
    acked = sum(int(w["updates_acked"]) for w in w_res)
    applied = sum(int(r["updates"]) for r in ps_res) + int(ps_res[0]["dense_updates"])
    manifest = (
        _published(root, generation)
        if not publisher
        else ckpt.Manifest(
            generation=generation,
            num_ps=phase.ps,
            next_batch=int(ps_res[0]["next_batch"]),
            data=asdict(data),
            model=asdict(model),
            updates_acked=(prev.updates_acked if prev else 0) + acked,
            updates_applied=(prev.updates_applied if prev else 0) + applied,
        )
    )
    covered = 0
    if publisher:
        ckpt.write_manifest(root, manifest)
    if shards is not None and publisher:
        for w in w_res:
            covered += call_out_of_process(shards, "cover", holder=w["holder"], shards=w["shards"])
    stepped = [w for w in w_res if w["steps"] > 0]
    samples = sum(int(w["samples"]) for w in w_res)
    if stepped:
        first = min(float(w["first_step_at"]) for w in stepped)
        last = max(float(w["last_step_at"]) for w in stepped)
        rate = samples / max(last - first, 1e-9)
    else:
        first = last = stopped
        rate = 0.0
    trained = [int(b) for w in w_res for b in w["batches"]]
    expected = set(range(first_batch, manifest.next_batch))
    return PhaseResult(
        generation=generation,
        ps=phase.ps,
        workers=phase.workers,
        first_batch=first_batch,
        end_batch=manifest.next_batch,
        samples=samples,
        samples_per_s=rate,
        start_s=first - launched,
        stop_s=stopped - last,
        updates_acked=acked,
        updates_applied=applied,
        ps_busy_s=[float(r["busy_s"]) for r in ps_res],
        batches_missing=len(expected - set(trained)),
        batches_repeated=len(trained) - len(set(trained)),
        shards_covered=covered,
        stopped=manifest.next_batch < first_batch + phase.steps,
        metrics=meter.metrics(),
    )
