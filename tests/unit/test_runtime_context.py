"""EST contexts: each EST sees its own random streams, however ESTs are interleaved."""

from __future__ import annotations

import io
import random
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from gearshift.worker.runtime import checkpoint
from gearshift.worker.runtime.context import (
    Switcher,
    context_from_plain,
    context_to_plain,
    fresh_context,
)
from gearshift.worker.runtime.rng import restore, seeded, snapshot


@pytest.fixture(autouse=True)
def keep_global_rng() -> Iterator[None]:
    state = snapshot()
    yield
    restore(state)


def draws() -> tuple[bytes, float, float, float]:
    return (
        torch.rand(4).numpy().tobytes(),
        random.random(),
        float(np.random.random()),
        float(np.random.normal()),  # the legacy API caches every second Gaussian
    )


def test_seeded_states_are_reproducible_and_leave_the_globals_alone() -> None:
    probe = snapshot()
    expected_globals = draws()
    restore(probe)
    state = seeded(1234)
    assert draws() == expected_globals
    restore(state)
    expected = draws()
    restore(seeded(1234))
    assert draws() == expected
    restore(seeded(1235))
    assert draws() != expected
    torch.manual_seed(1234)
    assert torch.rand(4).numpy().tobytes() == expected[0]


def test_interleaved_ests_draw_what_they_would_alone() -> None:
    switcher = Switcher()
    alone = []
    for est in range(3):
        ctx = fresh_context(est, seed=7, loader_workers=2)
        mine = []
        for _ in range(4):  # four mini-batches, each one switch
            with switcher.inside(ctx):
                mine.append((draws(), draws()))
        alone.append(mine)
    contexts = [fresh_context(est, seed=7, loader_workers=2) for est in range(3)]
    interleaved: list[list[object]] = [[], [], []]
    for _ in range(4):
        for ctx in reversed(contexts):
            draws()  # draws between ESTs do not leak in
            with switcher.inside(ctx):
                interleaved[ctx.est].append((draws(), draws()))
    assert interleaved == alone
    assert alone[0] != alone[1]


def test_without_contexts_ests_share_one_stream() -> None:
    switcher = Switcher(enabled=False)
    torch.manual_seed(0)
    contexts = [fresh_context(est, seed=7, loader_workers=1) for est in range(2)]
    seen = []
    for ctx in contexts:
        with switcher.inside(ctx):
            seen.append(torch.rand(2).numpy().tobytes())
    torch.manual_seed(0)
    assert seen == [torch.rand(2).numpy().tobytes(), torch.rand(2).numpy().tobytes()]


def test_loader_seeds_are_drawn_from_the_est_generator() -> None:
    a, b = fresh_context(0, 7, 3), fresh_context(1, 7, 3)
    again = fresh_context(0, 7, 3)
    assert len(a.loader_rng) == 3
    keys = [s.torch_cpu.numpy().tobytes() for s in a.loader_rng]
    assert len(set(keys)) == 3
    assert keys == [s.torch_cpu.numpy().tobytes() for s in again.loader_rng]
    assert keys[0] != b.loader_rng[0].torch_cpu.numpy().tobytes()
    numpy_keys = [s.numpy.state["state"]["key"].tobytes() for s in a.loader_rng]
    assert len(set(numpy_keys)) == 3


def test_contexts_survive_a_weights_only_round_trip() -> None:
    ctx = fresh_context(2, seed=9, loader_workers=2)
    with Switcher().inside(ctx):
        draws()
        random.gauss(0, 1)  # leaves a cached Gaussian in Python's state
    buf = io.BytesIO()
    torch.save(checkpoint.as_tensors(context_to_plain(ctx)), buf)
    buf.seek(0)
    back = context_from_plain(torch.load(buf, weights_only=True))
    switcher = Switcher()
    with switcher.inside(ctx):
        expected = (draws(), random.gauss(0, 1), np.random.normal())
    with switcher.inside(back):
        assert (draws(), random.gauss(0, 1), np.random.normal()) == expected
    assert back.position == ctx.position
