"""The .prof loader on the paper's A100 profiles, and per-device-batch interpolation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gearshift.brain.deeppool import load_prof, plan, read_prof
from gearshift.brain.deeppool.profiles import times_at_batches
from gearshift.brain.deeppool.structure import Block, decompose

# (file, rows per batch, layers with concatenations, largest batch, ms at it, parameters)
Model = tuple[str, int, int, int, float, int]
MODELS: list[Model] = [
    ("A100_vgg.prof", 37, 37, 64, 103.081, 138_357_544),
    ("A100_wrn.prof", 39, 39, 32, 103.837, 126_886_632),
    ("A100_inception.prof", 107, 122, 64, 74.36, 21_768_352),
]


@pytest.mark.parametrize("model", MODELS, ids=[m[0] for m in MODELS])
def test_reads_the_three_profiles(deeppool_data: Path, model: Model) -> None:
    name, rows, layers, batch, ms, params = model
    table = read_prof(deeppool_data / name)
    assert len(table.layers) == rows
    assert max(table.batch_times) == batch and min(table.batch_times) == 1
    graph = load_prof(deeppool_data / name)
    assert graph.num_layers == layers
    assert graph.global_batch == batch
    assert graph.device_counts[-1] == batch
    # fwd + bwd per row adds up to the file's own SUM line (which rounds).
    assert graph.comp[:, 0].sum() * 1e3 == pytest.approx(ms, rel=2e-3)
    assert graph.param_bytes.sum() == 4 * params
    # One device is the slowest, and more devices never make a layer slower by much.
    assert (graph.comp[:, -1] <= graph.comp[:, 0] * 1.05).all()
    assert graph.comp.sum(axis=0)[-1] < graph.comp.sum(axis=0)[0] / 5
    assert (graph.out_bytes > 0).all()


def test_chains_and_inception_blocks(deeppool_data: Path) -> None:
    vgg = load_prof(deeppool_data / "A100_vgg.prof")
    assert vgg.edges == tuple((v, v + 1) for v in range(36))
    assert vgg.out_bytes[0] == 64 * 64 * 224 * 224 * 4  # conv1_1's output at batch 64
    inception = load_prof(deeppool_data / "A100_inception.prof")
    chain = decompose(inception)
    blocks = [item for item in chain.items if isinstance(item, Block)]
    assert len(chain.items) == 6 + 11  # the stem after its first layer, then 11 blocks
    assert [len(b.branches) for b in blocks] == [4, 4, 4, 3, 4, 4, 4, 4, 3, 4, 4]
    # The last concatenation is Mixed_7c's output: 2048 x 8 x 8 per sample.
    assert inception.out_bytes[-1] == 64 * 2048 * 8 * 8 * 4
    assert inception.comp[-1].max() == 0.0


def test_plans_every_profile_at_1024_devices(deeppool_data: Path) -> None:
    for name, *_ in MODELS:
        graph = load_prof(deeppool_data / name, global_batch=1024, max_devices=1024)
        assert graph.device_counts[-1] == 1024
        best = plan(graph, amp_limit=2.0)
        assert 1 <= best.amplification <= 2.0
        assert best.iteration_time < graph.single_device_time()


def test_refuses_a_row_it_cannot_read(tmp_path: Path) -> None:
    bad = tmp_path / "bad.prof"
    bad.write_text('conv2d{"in_channels":3}[64][3,224,224]  1.0  x  y\n')
    with pytest.raises(ValueError, match="not a profile row"):
        read_prof(bad)
    shapes = tmp_path / "shapes.prof"
    row = '{k}{{"kernel_size":1}}[2][{c},4,4]   0.010      5         5\n'
    shapes.write_text(row.format(k="flatten", c=3) + row.format(k="flatten", c=5) + "SUM 1\n")
    with pytest.raises(ValueError, match="Inception"):
        load_prof(shapes)


def test_times_between_and_beyond_measured_batches() -> None:
    measured = {1: [1.0], 2: [1.5], 4: [2.0]}
    got = times_at_batches(measured, np.array([8.0, 4.0, 3.0, 2.0, 1.0, 0.5]))
    assert got[0].tolist() == [4.0, 2.0, 1.75, 1.5, 1.0, np.inf]
