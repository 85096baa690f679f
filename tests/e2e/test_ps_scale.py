"""A parameter-server job scaled by hand through the scheduler while it runs (issue 14,
"PS mode"): a Wide&Deep job with 2 PS x 2 workers is set to 3 PS x 4 workers, then back to
2 x 2 (`ScaleJob`, `gearshift scale`), and ends SUCCEEDED; the whole cluster as processes
(Brain on PostgreSQL, shard manager on Redis, one worker daemon with a 2-core slot).

On 2 cores the Brain's formulas always give 1 PS, so the counts are pinned from the start
(right after submit: no Brain plan interleaves). Each re-partition is checked through the
checkpoint folder: the rows every PS of a new phase started with (the SHA-256 in its
result) are the stopped phase's checkpoint rows taken by global row id (row g on PS g % n),
and updates_acked == updates_applied at the end; the shard manager's counts show every
shard of every finished epoch consumed.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from gearshift.client.devcluster import DevCluster
from gearshift.client.sdk import Client
from gearshift.common.errors import PreconditionError, ValidationError
from gearshift.v1 import common_pb2, scheduler_pb2, shardmanager_pb2
from gearshift.worker.ps import checkpoint as ckpt
from tests.e2e.test_ps_jobs import epochs
from tests.e2e.worker_cluster import client_of, digits_spec, e2e_cluster, started, worker_tasks
from tests.helpers import wait_until

C = common_pb2
S = scheduler_pb2
TOTAL = 2400  # global batches of 128 samples
TRAIN_BLOCKS = 400  # 6 epochs in the job
VOCAB, FIELDS = 2000, 4
WAIT = 120.0
PHASES = ((2, 2), (3, 4), (2, 2))
SCALE_AT = (300, 1100)  # the global batch after which the job is set to the next counts


@pytest.fixture
def cluster(tmp_path: Path, postgres_db: str, redis_url: str) -> Iterator[DevCluster]:
    flags = {"workers": ["--cpu-cores", "2"]}
    cluster = e2e_cluster(tmp_path, postgres_db, redis_url, workers=(("w1", "cpu:1"),), flags=flags)
    try:
        yield started(cluster)
    finally:
        cluster.stop()


def ps_spec() -> C.JobSpec:
    return C.JobSpec(
        name="wide-deep-scaled",
        total_steps=TOTAL,
        parameter_server=C.ParameterServerSpec(
            ps=2, workers=2, max_ps=4, max_workers=4, seed=5, fields=FIELDS, vocab=VOCAB,
            batch=128, train_blocks=TRAIN_BLOCKS, eval_blocks=20,
        ),
    )  # fmt: skip


@dataclass
class Generations:
    """What the test saw of each checkpoint generation while the job ran (a generation's
    folder is deleted once two newer ones are published: read as they appear)."""

    root: Path
    rows: int = 0
    seen: dict[int, tuple[int, int]] = field(default_factory=dict)  # gen -> (PS, workers)
    starts: dict[int, dict[int, bool]] = field(default_factory=dict)  # gen -> PS -> rows kept
    first_step: dict[int, float] = field(default_factory=dict)  # gen -> first step (wall)

    def poll(self) -> None:
        manifest = ckpt.read_manifest(self.root)
        if manifest is None or manifest.generation in self.seen:
            return
        gen = manifest.generation
        folder = self.root / ckpt.gen_folder(gen)
        results = {p.stem: json.loads(p.read_text()) for p in folder.glob("*-*.json")}
        ps = sorted(int(k[3:]) for k in results if k.startswith("ps-"))
        workers = [v for k, v in results.items() if k.startswith("worker-")]
        self.seen[gen] = (len(ps), len(workers))
        assert manifest.num_ps == len(ps), (manifest, sorted(results))
        self.rows = manifest.click_config().rows
        stepped = [float(w["first_step_at"]) for w in workers if w.get("first_step_at")]
        if stepped:
            self.first_step[gen] = min(stepped)
        if gen == 0:
            return
        previous = self._table(gen - 1)  # the stopped phase's checkpoint, by global row id
        kept = {}
        for k in ps:
            ids = torch.arange(k, self.rows, len(ps))  # PS k of n holds rows k, k + n, ...
            digest = hashlib.sha256(previous[ids].contiguous().numpy().tobytes()).hexdigest()
            kept[k] = digest == results[f"ps-{k}"]["start_rows_sha256"]
        self.starts[gen] = kept

    def _table(self, gen: int) -> torch.Tensor:
        """The whole table of generation `gen`'s PS files, placed by global row id."""
        files = sorted((self.root / ckpt.gen_folder(gen)).glob("ps-*.pt"))
        assert files, f"generation {gen} was deleted before the test read it"
        table: torch.Tensor | None = None
        for path in files:
            k = int(path.stem[3:])
            rows = torch.load(path, weights_only=True)["rows"]
            if table is None:
                table = torch.empty((self.rows, *rows.shape[1:]), dtype=rows.dtype)
            table[torch.arange(k, self.rows, len(files))] = rows
        assert table is not None
        return table


def follow(client: Client, job_id: str, gens: Generations, until: int) -> S.Job:
    """Poll the job (and its checkpoints) until it trained `until` batches or ended."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        gens.poll()
        job = client.get(job_id)
        assert job.state not in (C.JOB_STATE_FAILED, C.JOB_STATE_CANCELLED), job
        if job.progress.step >= until or job.state == C.JOB_STATE_SUCCEEDED:
            return job
        time.sleep(0.1)  # polling interval, not synchronization: the deadline bounds it
    raise AssertionError(f"the job never reached batch {until} within {WAIT:.0f} s")


@pytest.mark.slow
def test_a_ps_job_scales_2x2_to_3x4_and_back_while_running(cluster: DevCluster) -> None:
    snapshots: list[shardmanager_pb2.Dataset] = []
    with client_of(cluster) as client:
        other = client.submit(digits_spec("not-ps", 5)).job_id
        with pytest.raises(PreconditionError, match="not a parameter-server job"):
            client.scale(other, 2, 2)
        client.cancel(other)
        with pytest.raises(PreconditionError, match="already ended"):
            client.scale(other, 2, 2)
        job_id = client.submit(ps_spec()).job_id
        client.scale(job_id, 2, 2)  # pinned from the start: the Brain's plans stay out
        # Bad input is refused naming the field, and changes nothing.
        with pytest.raises(ValidationError, match=r"ps: must be 1\.\.4"):
            client.scale(job_id, 5, 4)
        with pytest.raises(ValidationError, match="workers"):
            client.scale(job_id, 2, 0)
        with pytest.raises(ValidationError, match="ps_cores"):
            client.scale(job_id, 2, 2, ps_cores=64)

        path = wait_until(
            lambda: next((t.checkpoint_path for t in worker_tasks(cluster, "w1")), None),
            WAIT,
            "the PS task never started",
        )
        assert path
        checkpoint = Path(path)
        gens = Generations(checkpoint)
        asked_at = []
        for at, (ps, workers) in zip(SCALE_AT, PHASES[1:], strict=True):
            job = follow(client, job_id, gens, at)
            assert job.state == C.JOB_STATE_RUNNING, f"ended before batch {at}: {job}"
            asked_at.append(time.time())
            client.scale(job_id, ps, workers)
            if (seen := epochs(cluster, job_id)) is not None:
                snapshots.append(seen)
        while (job := follow(client, job_id, gens, TOTAL)).state != C.JOB_STATE_SUCCEEDED:
            if (seen := epochs(cluster, job_id)) is not None:
                snapshots.append(seen)
        events = list(client.events(job_id))
    gens.poll()
    for line in (f"{S.JobEventType.Name(e.type)}: {e.message[:200]}" for e in events):
        print(line)

    # Each phase ran its counts: the checkpoint generations, the PLAN and AUC events.
    assert [gens.seen[g] for g in sorted(gens.seen)][-3:] == list(PHASES), gens.seen
    plans = [e.message for e in events if e.type == S.JOB_EVENT_TYPE_PLAN]
    assert [p.split(" (")[0] for p in plans] == [
        "set by a user: 2 PS",
        "set by a user: 3 PS",
        "set by a user: 2 PS",
    ], plans
    assert [p.split(") ", 1)[1][: len("x 2 workers")] for p in plans] == [
        "x 2 workers",
        "x 4 workers",
        "x 2 workers",
    ], plans
    aucs = [e.message for e in events if e.message.startswith("held-out AUC")]
    assert any(a.endswith("(3 PS x 4 workers)") for a in aucs), aucs
    assert aucs and aucs[-1].endswith(f"at step {TOTAL} (2 PS x 2 workers)"), aucs
    kinds = [e.type for e in events]
    assert kinds.count(S.JOB_EVENT_TYPE_RESCALED) >= 2
    assert S.JOB_EVENT_TYPE_STARTED_FRESH not in kinds

    # No acknowledged update lost across either re-partition, and none in the whole run.
    last = max(gens.seen)
    for gen in (last - 1, last):
        assert gens.starts[gen] and all(gens.starts[gen].values()), gens.starts
    manifest = ckpt.read_manifest(checkpoint)
    assert manifest is not None and manifest.next_batch == TOTAL
    assert manifest.updates_acked == manifest.updates_applied > 0

    # Every shard of every finished epoch consumed (the shard manager's counts).
    assert snapshots, "the job's dataset was never seen"
    final = snapshots[-1]
    finished = [e for e in final.epochs if e.epoch < final.epoch]
    assert finished and all(e.shards_done >= TRAIN_BLOCKS for e in finished), final

    # Figures: phase times and the scale time (stop request -> first step of the new phase).
    rescaling = [e.time for e in events if e.type == S.JOB_EVENT_TYPE_RESCALING]
    started_at = [e.time for e in events if e.type == S.JOB_EVENT_TYPE_STARTED]
    ended_at = next(e.time for e in events if e.type == S.JOB_EVENT_TYPE_SUCCEEDED)
    bounds = [started_at[0], *rescaling[-2:], ended_at]
    for i, (ps, workers) in enumerate(PHASES):
        print(f"phase {i}: {ps} PS x {workers} workers, {bounds[i + 1] - bounds[i]:.1f} s")
    for i, gen in enumerate((last - 1, last)):
        print(
            f"scale {PHASES[i]} -> {PHASES[i + 1]}: ScaleJob -> stop request "
            f"{rescaling[-2 + i] - asked_at[i]:.2f} s, stop request -> first step "
            f"{gens.first_step[gen] - rescaling[-2 + i]:.2f} s"
        )
