"""One wave of the chaos run: four deterministic EST jobs and a dynamic-mode job submitted
together and followed to their ends while the driver strikes, then everything that must
hold of them, as a list of problems (empty: the wave held). The CI test runs one wave; the
soak runs waves until its time is up."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gearshift.client.devcluster import DevCluster
from gearshift.common.facts import TERMINAL_STATES
from gearshift.v1 import common_pb2, scheduler_pb2
from tests import index_logs
from tests.chaos.driver import Chaos, ShardLedger, index_dir, job_states, submit
from tests.e2e.worker_cluster import SIZE, Reference, digits_spec, step_log
from tests.helpers import wait_until

EST_JOBS = 4


@dataclass
class Wave:
    """A wave's jobs and what was seen of them."""

    est_jobs: list[str]
    dynamic_job: str
    ledger: ShardLedger
    final: dict[str, scheduler_pb2.Job] = field(default_factory=dict)

    @property
    def jobs(self) -> list[str]:
        return [*self.est_jobs, self.dynamic_job]


def released(cluster: DevCluster, job_id: str) -> int:
    """Shards the shard managers (every incarnation: a restart appends to the log) put back
    from the job's released holders: those a dead process held, and those it had read
    after its last checkpoint (provisional acknowledgements undone). The releases come from
    the scheduler when a process dies and from each process as it starts."""
    pattern = re.compile(
        rf"holder released dataset_id={re.escape(job_id)} .*?requeued=\[([^\]]*)\]"
    )
    log = cluster.logs / "shardmanager.log"
    return sum(
        len([s for s in found.split(",") if s.strip()])
        for found in pattern.findall(log.read_text())
    )


def run_wave(
    chaos: Chaos, steps: int, dynamic_steps: int, budget: float, name: str = "chaos"
) -> Wave:
    """Submit the wave, aim the driver's training kills at its dynamic job, wait for its end."""
    cluster = chaos.site.cluster
    est_jobs = [submit(cluster, digits_spec(f"{name}-{i}", steps)) for i in range(EST_JOBS)]
    spec = digits_spec(f"{name}-dynamic", dynamic_steps)
    spec.dataset.mode = common_pb2.DATA_MODE_DYNAMIC
    dynamic_job = submit(cluster, spec)
    wave = Wave(est_jobs, dynamic_job, ShardLedger(cluster, dynamic_job))
    chaos.focus = dynamic_job

    def ended() -> bool:
        wave.ledger.poll()
        if chaos.error is not None:
            raise AssertionError(f"the chaos driver failed: {chaos.error!r}")
        states = job_states(cluster, wave.jobs)
        if states is not None:
            wave.final.update(states)
        return states is not None and all(j.state in TERMINAL_STATES for j in states.values())

    wait_until(ended, budget, f"every job of {name} ends", interval=0.25)
    return wave


def problems(wave: Wave, cluster: DevCluster, ref: Reference, dynamic_steps: int) -> list[str]:
    """What went wrong with the wave's jobs: nothing, when they held up."""
    found = []
    for job_id in wave.jobs:
        job = wave.final[job_id]
        if job.state != common_pb2.JOB_STATE_SUCCEEDED:
            found.append(f"{job_id} ended {common_pb2.JobState.Name(job.state)}: {job.message}")
    for job_id in wave.est_jobs:
        if wave.final[job_id].final_digest != ref.digest:
            found.append(f"{job_id}: digest {wave.final[job_id].final_digest} != {ref.digest}")
        if step_log(cluster.checkpoint_root / job_id / "steps.jsonl") != ref.losses:
            found.append(f"{job_id}: its steps' loss bits differ from the fixed run's")
    if wave.final[wave.dynamic_job].progress.step != dynamic_steps:
        found.append(f"{wave.dynamic_job} ran {wave.final[wave.dynamic_job].progress.step} steps")
    ledger = wave.ledger
    closed = ledger.closed_epochs()
    if len(closed) < 2:
        found.append(f"the ledger saw {len(closed)} closed epochs: {ledger.epochs}")
    for epoch in closed:
        if (epoch.samples_done, epoch.shards_done, epoch.samples_failed) != (
            ledger.size,
            ledger.num_shards,
            0,
        ):
            found.append(f"epoch {epoch.epoch} not read exactly once: {epoch}")
    # Counted from the training processes' index logs: every sample of every epoch handed
    # out in full was read, and every shard a killed placement read after its last
    # checkpoint was read again. (Not "only those": under chaos the scheduler's release of
    # a dead peer's holders can overtake the checkpoint writer's cover, and the shards of
    # a checkpoint just written are then read once more: at least once still holds.)
    logs = index_logs.load(index_dir(cluster.config.run_dir), wave.dynamic_job)
    unread = index_logs.unread(logs, ledger.size or SIZE)
    if unread:
        found.append(f"samples never read, by epoch: {unread}")
    twice, uncovered = index_logs.read_twice(logs), index_logs.uncovered(logs)
    if uncovered - twice:
        found.append(f"read after the last checkpoint and never again: {dict(uncovered - twice)}")
    # What the killed holders held or had not covered came back, once: the shard manager
    # logs each release.
    if redelivered(wave) != released(cluster, wave.dynamic_job):
        found.append(
            f"{redelivered(wave)} shards redelivered, "
            f"{released(cluster, wave.dynamic_job)} released from dead holders"
        )
    return found


def redelivered(wave: Wave) -> int:
    return sum(e.shards_redelivered for e in wave.ledger.epochs.values())
