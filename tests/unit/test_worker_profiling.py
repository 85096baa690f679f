"""The worker's torch.fx profiler on a small branching module, and the three reference
models; the Brain plans over what it measures."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

from gearshift.brain.deeppool import FREE_NETWORK, LayerGraph, plan
from gearshift.brain.deeppool.structure import Block, decompose
from gearshift.brain.profile_messages import graph_from_message
from gearshift.worker.profiling.fxprofile import TracedLayers, profile_module, trace_layers
from gearshift.worker.profiling.reference_models import inception_v3, vgg16, wide_resnet101_2


class Tiny(nn.Module):
    """A stem, a two-branch concatenation, a residual addition, a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.pool = nn.AvgPool2d(3, 1, padding=1)
        self.res = nn.Conv2d(16, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        x = torch.cat([torch.relu(self.conv(x)), self.pool(x)], 1)
        x = x + self.res(x)
        out: torch.Tensor = self.fc(x.flatten(1))
        return out


def test_profiles_a_small_branching_module() -> None:
    message = profile_module(
        Tiny(), (3, 8, 8), global_batch=4, max_devices=4, repeats=2, device="cpu"
    )
    assert message.device == "cpu" and message.global_batch == 4
    graph = graph_from_message(message)  # what the Brain plans over: it checks the message
    names = graph.names
    assert names == (
        "x", "stem", "relu", "conv", "relu_1", "pool", "cat", "res", "add", "flatten", "fc"
    )  # fmt: skip
    at = names.index
    assert set(graph.edges) == {
        (at("x"), at("stem")), (at("stem"), at("relu")),
        (at("relu"), at("conv")), (at("conv"), at("relu_1")), (at("relu_1"), at("cat")),
        (at("relu"), at("pool")), (at("pool"), at("cat")),
        (at("cat"), at("res")), (at("res"), at("add")), (at("cat"), at("add")),
        (at("add"), at("flatten")), (at("flatten"), at("fc")),
    }  # fmt: skip
    assert graph.device_counts == (1, 2, 4)
    assert np.isfinite(graph.comp).all()
    assert graph.comp[at("x")].max() == 0.0
    assert (np.delete(graph.comp, at("x"), axis=0) > 0).all()
    # Output bytes for the global batch of 4, parameters as the modules hold them.
    assert graph.out_bytes[at("stem")] == 4 * 8 * 8 * 8 * 4
    assert graph.out_bytes[at("cat")] == 4 * 16 * 8 * 8 * 4
    assert graph.param_bytes[at("stem")] == (3 * 8 * 9 + 8) * 4
    assert graph.param_bytes[at("fc")] == (16 * 64 * 10 + 10) * 4
    assert graph.param_bytes[at("add")] == 0
    chain = decompose(graph)
    blocks = [item for item in chain.items if isinstance(item, Block)]
    assert [len(b.branches) for b in blocks] == [2, 2]
    assert () in blocks[1].branches  # the residual connection
    best = plan(graph, amp_limit=math.inf, network=FREE_NETWORK)
    assert best.iteration_time == pytest.approx(graph.comp.min(axis=1).sum())


def test_refuses_counts_that_split_a_sample() -> None:
    with pytest.raises(ValueError, match="max_devices"):
        profile_module(Tiny(), (3, 8, 8), global_batch=6, max_devices=4)


def _structure(traced: TracedLayers) -> LayerGraph:
    n = len(traced.nodes)
    return LayerGraph(
        names=traced.names,
        edges=traced.edges,
        device_counts=(1,),
        global_batch=1,
        comp=np.ones((n, 1)),
        out_bytes=np.zeros(n),
        param_bytes=np.zeros(n),
    )


# (builder, input size, parameters as published, top-level blocks, branches per block)
REFERENCE: list[tuple[Callable[[], nn.Module], int, int, int, set[int]]] = [
    (vgg16, 32, 138_357_544, 0, set()),
    (wide_resnet101_2, 32, 126_886_696, 33, {2}),
    (inception_v3, 75, 23_834_568, 11, {3, 4}),
]


@pytest.mark.parametrize("model", REFERENCE, ids=["vgg16", "wrn101_2", "inception_v3"])
def test_reference_models_match_the_published_architectures(
    model: tuple[Callable[[], nn.Module], int, int, int, set[int]],
) -> None:
    build, size, params, blocks, widths = model
    with torch.device("meta"):
        module = build()
        sample = torch.empty(2, 3, size, size)
        assert module(sample).shape == (2, 1000)
        traced = trace_layers(module, sample)
    assert sum(p.numel() for p in module.parameters()) == params
    found = [item for item in decompose(_structure(traced)).items if isinstance(item, Block)]
    assert len(found) == blocks
    assert {len(b.branches) for b in found} == widths
