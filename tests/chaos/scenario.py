"""One wave of the chaos run: four deterministic EST jobs and a dynamic-mode job submitted
together and followed to their ends while the driver strikes, then everything that must
hold of them, as a list of problems (empty: the wave held). The CI test runs one wave; the
soak runs waves until its time is up."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from gearshift.client.devcluster import DevCluster
from gearshift.common.facts import TERMINAL_STATES
from gearshift.v1 import common_pb2, scheduler_pb2
from tests import index_logs
from tests.chaos.driver import Chaos, ShardLedger, index_dir, job_states, submit
from tests.e2e.worker_cluster import SIZE, Reference, digits_spec, step_log
from tests.helpers import wait_until

EST_JOBS = 4
LEDGER_INTERVAL = 0.1  # seconds between two reads of the dynamic job's shard ledger


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


def released(cluster: DevCluster, job_id: str) -> list[index_logs.Given]:
    """Shards the shard managers (every incarnation: a restart appends to the log) put back
    from the job's released holders, with the step that read each: those a dead process
    held (the scheduler's release when a process dies, or the next process's), and those
    it had read at or after the step the next process resumes from (provisional
    acknowledgements undone by that process's release)."""
    log = cluster.logs / "shardmanager.log"
    return index_logs.given_back(log.read_text(), job_id)


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

    # The ledger is read on its own thread: asking the scheduler for the jobs' states
    # blocks while it restarts, and the dataset is deleted at the job's end, so a ledger
    # read between those calls could miss the last redeliveries (seen in a soak: a
    # restart's 40 redeliveries 2 s before the end, while the scheduler was down).
    polling = threading.Event()
    failures: list[BaseException] = []

    def poll() -> None:
        while not polling.wait(LEDGER_INTERVAL):
            try:
                wave.ledger.poll()
            except BaseException as exc:  # reported by ended()
                failures.append(exc)
                return

    def ended() -> bool:
        if failures:
            raise AssertionError(f"reading the shard ledger failed: {failures[0]!r}")
        if chaos.error is not None:
            raise AssertionError(f"the chaos driver failed: {chaos.error!r}")
        states = job_states(cluster, wave.jobs)
        if states is not None:
            wave.final.update(states)
        return states is not None and all(j.state in TERMINAL_STATES for j in states.values())

    poller = threading.Thread(target=poll, name="ledger", daemon=True)
    poller.start()
    try:
        wait_until(ended, budget, f"every job of {name} ends", interval=0.25)
    finally:
        polling.set()
        poller.join(LEDGER_INTERVAL + 10)
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
    # out in full was read, and the shards read twice are exactly the reads of the steps
    # rolled back (at or after the step the next placement resumed from).
    logs = index_logs.load(index_dir(cluster.config.run_dir), wave.dynamic_job)
    unread = index_logs.unread(logs, ledger.size or SIZE)
    if unread:
        found.append(f"samples never read, by epoch: {unread}")
    audit = dynamic_audit(wave, cluster)
    twice = index_logs.read_twice(logs)
    rolled = Counter((epoch, shard) for _, epoch, shard, _ in audit.rolled_back.elements())
    if twice != rolled:
        found.append(
            f"read twice but not rolled back: {dict(twice - rolled)}; rolled back but read "
            f"once: {dict(rolled - twice)}"
        )
    # Exact: the redeliveries are what the killed holders had not covered by a checkpoint:
    # every rolled-back read and every grant a killed process held but never logged, and
    # not one read a checkpoint holds (the shard manager logs each shard it gives back).
    if audit.lost or audit.held_back:
        found.append(f"given back wrongly: {audit.figures()}; lost {dict(audit.lost)}, "
                     f"covered but given back {dict(audit.held_back)}")  # fmt: skip
    given = sum(audit.given_back.values())
    expected = sum(audit.rolled_back.values()) + sum(audit.unlogged.values())
    if not redelivered(wave) == given == expected:
        found.append(
            f"{redelivered(wave)} shards redelivered, {given} given back from killed holders, "
            f"{expected} rolled back or held unlogged ({audit.figures()})"
        )
    return found


def dynamic_audit(wave: Wave, cluster: DevCluster) -> index_logs.Audit:
    """The dynamic job's reads set against what the shard manager gave back."""
    logs = index_logs.load(index_dir(cluster.config.run_dir), wave.dynamic_job)
    return index_logs.audit(logs, released(cluster, wave.dynamic_job))


def redelivered(wave: Wave) -> int:
    return sum(e.shards_redelivered for e in wave.ledger.epochs.values())
