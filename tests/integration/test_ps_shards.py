"""PS training on dynamic shards from a real shard manager (gRPC, Redis): at-least-once.

Workers read one-block shards; a phase's acknowledgements are provisional until its
checkpoint is published (then covered), and a phase that dies releases its workers,
so the shards whose updates the checkpoint lost are read again in their epoch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gearshift.worker.ps import checkpoint as ckpt
from gearshift.worker.ps.data import ClickConfig
from gearshift.worker.ps.feed import ShardSource
from gearshift.worker.ps.launch import Phase, run_phase
from gearshift.worker.shard_client import ShardClient
from tests.integration.test_ps_training import MODEL, TIMEOUT_S
from tests.integration.test_shard_service import sm  # noqa: F401 (the fixture)

DATA = ClickConfig(seed=9, fields=4, vocab=2000, dense=4, batch=128, train_blocks=20)


@pytest.mark.slow
def test_every_block_is_read_at_least_once_per_epoch_across_rescales_and_a_failure(
    tmp_path: Path,
    sm: Callable[..., str],  # noqa: F811
) -> None:
    address = sm()
    source = ShardSource(address, "ps-clicks", epochs=1000)
    first = run_phase(tmp_path, Phase(2, 2, 15), DATA, MODEL, timeout_s=TIMEOUT_S, shards=source)
    assert first.shards_covered == 15 and first.batches_missing == 0
    # A phase that dies: its reads are released (undone) and happen again.
    with pytest.raises(RuntimeError, match="PS phase 1 failed"):
        run_phase(tmp_path, Phase(3, 2, 100_000), DATA, MODEL, timeout_s=2.0, shards=source)
    with ShardClient(address) as client:
        undone = sum(e.shards_undone for e in client.describe("ps-clicks").epochs)
    # Enough steps after it to read every undone shard again and finish an epoch more.
    second = run_phase(
        tmp_path, Phase(3, 4, undone + 15), DATA, MODEL, timeout_s=TIMEOUT_S, shards=source
    )
    third = run_phase(tmp_path, Phase(2, 2, 10), DATA, MODEL, timeout_s=TIMEOUT_S, shards=source)
    assert (second.shards_covered, third.shards_covered) == (undone + 15, 10)
    manifest = ckpt.read_manifest(tmp_path)
    assert manifest is not None and manifest.next_batch == undone + 40
    assert manifest.updates_acked == manifest.updates_applied
    with ShardClient(address) as client:
        dataset = client.describe("ps-clicks")
    epochs = list(dataset.epochs)
    # Every read the checkpoint holds is a DONE shard, and nothing else is.
    assert sum(e.shards_done for e in epochs) == manifest.next_batch
    # Every block of every finished epoch was read (at least once) into the checkpoint.
    finished = [e for e in epochs if e.epoch < dataset.epoch]
    assert finished and all(e.shards_done == DATA.train_blocks for e in finished), epochs
    assert all(e.samples_in_flight == 0 for e in epochs)
    assert sum(e.shards_redelivered for e in epochs) >= undone > 0
