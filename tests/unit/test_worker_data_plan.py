"""The dataset a dynamic-mode job asks the shard manager for: enough epochs for its steps
read twice over, since every restart from a checkpoint hands out again the shards of the
steps since it (the chaos soak ran a one-spare-epoch dataset out after ~20 restarts)."""

from __future__ import annotations

import argparse
import math

from gearshift.worker.runtime.settings import RunSettings
from gearshift.worker.wiring import _plan


def test_a_dynamic_dataset_has_room_for_restarts() -> None:
    settings = RunSettings(num_ests=4, global_batch_size=16, total_steps=600)
    args = argparse.Namespace(
        dataset_id="job-1", job_id="job-1", data_mode="dynamic", data_size=512
    )
    plan = _plan(args, settings)
    shards = math.ceil(512 / settings.per_est_batch)  # one shard per EST mini-batch
    needed = math.ceil(600 * 4 / shards)  # epochs the steps read once
    assert plan.shard_size == settings.per_est_batch
    assert plan.num_epochs == 2 * needed + 1
