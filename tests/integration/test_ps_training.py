"""Parameter-server training with real processes over torch.distributed.rpc.

Each test launches PS and worker processes through `run_phase` / `run` (the CLI's
code path) on a temporary checkpoint folder and reads back what the PSs wrote.
PS training is asynchronous: tests assert what holds under any interleaving
(every batch trained exactly once, every acknowledged update applied, rows kept
bytewise across re-partitioning, the model learns), never exact losses.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gearshift.worker.ps import checkpoint as ckpt
from gearshift.worker.ps.data import ClickConfig
from gearshift.worker.ps.launch import Phase, PhaseResult, run_phase
from gearshift.worker.ps.model import ModelConfig, init_rows
from gearshift.worker.ps.run import main, run
from gearshift.worker.ps.sharding import assemble

DATA = ClickConfig(seed=5, fields=6, vocab=4000, dense=4, batch=256, train_blocks=400)
MODEL = ModelConfig(dim=8, lr=0.05)
TIMEOUT_S = 120.0


def _phase(root: Path, ps: int, workers: int, steps: int) -> PhaseResult:
    res = run_phase(root, Phase(ps, workers, steps), DATA, MODEL, timeout_s=TIMEOUT_S)
    assert (res.ps, res.workers) == (ps, workers)
    assert res.end_batch - res.first_batch == steps
    assert res.batches_missing == 0 and res.batches_repeated == 0
    assert res.updates_acked == res.updates_applied
    return res


def _state(root: Path) -> tuple[bytes, bytes]:
    """The whole table and Adagrad state of the last checkpoint, as bytes."""
    manifest = ckpt.read_manifest(root)
    assert manifest is not None
    rows, accum = ckpt.load_shards(root, manifest)
    total = DATA.rows
    return assemble(rows, total).numpy().tobytes(), assemble(accum, total).numpy().tobytes()


@pytest.mark.slow
def test_a_short_run_learns(tmp_path: Path) -> None:
    [res] = run(tmp_path, [Phase(2, 2, 120)], DATA, MODEL, eval_blocks=20, timeout_s=TIMEOUT_S)
    assert res.batches_missing == 0 and res.batches_repeated == 0
    assert res.updates_acked == res.updates_applied > 120
    assert res.samples == 120 * DATA.batch
    assert res.auc is not None and res.auc > 0.65, res


@pytest.mark.slow
def test_repartition_keeps_rows_and_optimizer_state(tmp_path: Path) -> None:
    _phase(tmp_path, 2, 2, 40)
    trained = _state(tmp_path)
    _phase(tmp_path, 3, 1, 0)  # 2 -> 3 PS: re-partition only
    manifest = ckpt.read_manifest(tmp_path)
    assert manifest is not None and manifest.num_ps == 3
    assert _state(tmp_path) == trained
    _phase(tmp_path, 2, 1, 0)  # and back
    assert _state(tmp_path) == trained
    # The rows really were trained (not an untouched table kept equal).
    assert manifest.updates_applied == manifest.updates_acked > 40
    initial = init_rows(DATA.rows, 0, 1, MODEL, DATA.seed)
    assert not torch.equal(ckpt.load_table(tmp_path), initial)


@pytest.mark.slow
def test_scale_ps_and_workers_out_and_back_while_training(tmp_path: Path) -> None:
    results = run(
        tmp_path,
        [Phase(2, 2, 60), Phase(3, 4, 60), Phase(2, 2, 60)],
        DATA,
        MODEL,
        eval_blocks=20,
        timeout_s=TIMEOUT_S,
    )
    assert [(r.ps, r.workers) for r in results] == [(2, 2), (3, 4), (2, 2)]
    assert [(r.first_batch, r.end_batch) for r in results] == [(0, 60), (60, 120), (120, 180)]
    for r in results:
        assert r.batches_missing == 0 and r.batches_repeated == 0
        assert r.updates_acked == r.updates_applied
        assert len(r.ps_busy_s) == r.ps
    manifest = ckpt.read_manifest(tmp_path)
    assert manifest is not None
    assert manifest.next_batch == 180 and manifest.num_ps == 2
    assert (
        manifest.updates_acked == manifest.updates_applied == sum(r.updates_acked for r in results)
    )
    aucs = [r.auc for r in results]
    assert all(a is not None for a in aucs)
    assert aucs[-1] is not None and aucs[0] is not None
    assert aucs[-1] > 0.65 and aucs[-1] >= aucs[0] - 0.01, aucs  # kept training after rescales


def test_a_checkpoint_of_another_model_is_refused_and_left_alone(tmp_path: Path) -> None:
    _phase(tmp_path, 1, 1, 5)
    before = (tmp_path / ckpt.MANIFEST).read_bytes()
    other = ModelConfig(dim=4, lr=0.05)
    with pytest.raises(ValueError, match="was made with"):
        run_phase(tmp_path, Phase(1, 1, 5), DATA, other, timeout_s=TIMEOUT_S)
    assert (tmp_path / ckpt.MANIFEST).read_bytes() == before


@pytest.mark.slow
def test_the_cli_prints_throughput_and_auc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        sys.executable, "-m", "gearshift.worker.ps.run", "--ps", "1", "--workers", "2",
        "--steps", "20", "--vocab", "2000", "--fields", "4", "--train-blocks", "20",
        "--eval-blocks", "4", "--checkpoint-dir", str(tmp_path), "--json",
    ]  # fmt: skip
    out = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    [line] = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    res = json.loads(line)
    assert res["end_batch"] == 20 and res["samples_per_s"] > 0 and 0.0 < res["auc"] < 1.0
    assert torch.load(tmp_path / "gen-0000" / "dense.pt", weights_only=True)["net"]
    with pytest.raises(SystemExit) as exit_info:
        main(["--phases", "2x:5"])
    assert exit_info.value.code == 2 and "'2x:5'" in capsys.readouterr().err


@pytest.mark.slow
def test_a_phase_that_dies_leaves_the_last_checkpoint_to_resume_from(tmp_path: Path) -> None:
    _phase(tmp_path, 2, 2, 20)
    before = _state(tmp_path)
    manifest = (tmp_path / ckpt.MANIFEST).read_bytes()
    # A deadline far too short for the phase: its processes are killed mid-way.
    with pytest.raises(RuntimeError, match="PS phase 1 failed"):
        run_phase(tmp_path, Phase(3, 2, 100_000), DATA, MODEL, timeout_s=0.5)
    assert (tmp_path / ckpt.MANIFEST).read_bytes() == manifest
    assert _state(tmp_path) == before
    res = _phase(tmp_path, 3, 2, 20)  # the retry re-partitions the last good checkpoint
    assert (res.generation, res.first_batch, res.end_batch) == (1, 20, 40)
