"""Chaos: four deterministic EST jobs and a dynamic-mode job on two workers while every part
of the cluster is killed in turn (seeded), PostgreSQL and Redis included. Every job
succeeds; each EST job ends with the digest of its fixed run and every step's loss bits;
the dynamic job's closed epochs acknowledged every sample exactly once, the shards read
twice are exactly the reads of the steps rolled back, and the redeliveries are exactly
what the killed holders had not covered by a checkpoint (the rolled-back reads and the
grants they held unlogged; none a checkpoint holds).

`pytest -m chaos` runs it alone; the long soak is `python -m tests.chaos.soak --minutes 30`.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tests.chaos.driver import KINDS, Chaos, chaos_site
from tests.chaos.scenario import dynamic_audit, problems, redelivered, run_wave
from tests.e2e.worker_cluster import reference

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

SEED = int(os.environ.get("GEARSHIFT_CHAOS_SEED", "20261125"))
STEPS = 200
DYNAMIC_STEPS = 400  # 4 shards a step, 128 an epoch: epochs 0-12
BUDGET = 240.0  # seconds for every job to end


def test_every_job_survives_every_kind_of_kill(tmp_path: Path) -> None:
    shared = tmp_path.parent if os.environ.get("PYTEST_XDIST_WORKER") else tmp_path
    ref = reference(shared / "gearshift-worker-reference", STEPS)
    with chaos_site(tmp_path) as site:
        chaos = Chaos(site, random.Random(SEED))
        with chaos.running():
            wave = run_wave(chaos, STEPS, DYNAMIC_STEPS, BUDGET)
        report = f"kills {dict(chaos.kills)}:\n" + "\n".join(chaos.journal)
        found = problems(wave, site.cluster, ref, DYNAMIC_STEPS)
        assert not found, "\n".join([*found, report, site.cluster.log_tails()])
        assert set(chaos.kills) == set(KINDS), f"not every kind was killed: {report}"
        audit = dynamic_audit(wave, site.cluster)
        print(f"\n{report}\nshards redelivered {redelivered(wave)}; {audit.figures()}")
