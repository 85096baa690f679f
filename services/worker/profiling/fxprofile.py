"""Profile a torch module layer by layer into a LayerProfile message, with torch.fx.

The module is traced symbolically; every graph node that yields a tensor is a layer (the
input is one too, with no time of its own, so that the graph has one source), and the
tensor arguments are its edges, so residual additions and concatenations become joins.
For each per-device batch B/g the module runs once to capture every node's inputs; each
layer then replays alone on copies of them, forward then backward, and the least of a
few timings counts (the CPU is shared; on CUDA each timing waits for the kernels).
Output bytes come from the tensors themselves, parameter bytes from the node's submodule.
The worker measures; the Brain plans over the message (gearshift.brain.deeppool).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from gearshift.common.profiles import power_of_two_counts
from gearshift.v1 import brain_pb2


@dataclass(frozen=True)
class TracedLayers:
    """A module's layers: fx nodes in graph order and the edges between their indices."""

    module: fx.GraphModule
    nodes: tuple[fx.Node, ...]
    edges: tuple[tuple[int, int], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(node.name for node in self.nodes)


class _Recorder(fx.Interpreter):
    """Runs the traced module and keeps every node's value."""

    def __init__(self, module: fx.GraphModule):
        super().__init__(module, garbage_collect_values=False)
        self.values: dict[fx.Node, Any] = {}

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        self.values[n] = value
        return value


def _record(module: fx.GraphModule, inputs: torch.Tensor) -> dict[fx.Node, Any]:
    recorder = _Recorder(module)
    recorder.run(inputs)
    return recorder.values


def trace_layers(module: nn.Module, sample: torch.Tensor) -> TracedLayers:
    """The layer structure of `module`, telling tensors from other values with `sample`
    (one input batch; any size)."""
    traced = fx.symbolic_trace(module)
    values = _record(traced, sample)
    kinds = ("placeholder", "call_module", "call_function", "call_method")
    layers = [
        n for n in traced.graph.nodes if n.op in kinds and isinstance(values[n], torch.Tensor)
    ]
    index = {n: i for i, n in enumerate(layers)}

    def sources(n: fx.Node) -> Iterable[int]:
        if n in index:
            yield index[n]
        else:  # a non-tensor value (a shape, a getattr): look through it
            for m in n.all_input_nodes:
                yield from sources(m)

    edges = {(u, index[n]) for n in layers for m in n.all_input_nodes for u in sources(m)}
    return TracedLayers(traced, tuple(layers), tuple(sorted(edges)))


def _callable(traced: fx.GraphModule, node: fx.Node) -> Callable[..., Any]:
    if node.op == "call_module":
        module: Callable[..., Any] = traced.get_submodule(str(node.target))
        return module
    if node.op == "call_function":
        function: Callable[..., Any] = node.target  # type: ignore[assignment]
        return function
    return lambda obj, *args, **kwargs: getattr(obj, str(node.target))(*args, **kwargs)


def _synchronize() -> None:
    """Wait for queued CUDA kernels, so that a timing covers them (no-op without CUDA)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()


def _time_layer(
    traced: fx.GraphModule, node: fx.Node, values: dict[fx.Node, Any], repeats: int
) -> float:
    """Least fwd+bwd seconds of one node on fresh copies of its recorded inputs."""
    if node.op == "placeholder":
        return 0.0
    run = _callable(traced, node)

    def fresh(n: fx.Node) -> Any:
        value = values[n]
        if isinstance(value, torch.Tensor):
            copy = value.detach().clone()
            return copy.requires_grad_(copy.is_floating_point())
        return value

    best = float("inf")
    for _ in range(repeats + 1):  # the first is a warm-up
        args = fx.node.map_arg(node.args, fresh)
        kwargs = fx.node.map_arg(node.kwargs, fresh)
        _synchronize()
        start = time.perf_counter()
        out = run(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.requires_grad:
            torch.autograd.backward(out, torch.ones_like(out))
        _synchronize()
        best = min(best, time.perf_counter() - start)
    return best if repeats > 0 else 0.0


def _param_bytes(traced: fx.GraphModule, node: fx.Node) -> int:
    if node.op != "call_module":
        return 0
    params = traced.get_submodule(str(node.target)).parameters()
    return sum(p.numel() * p.element_size() for p in params)


def profile_module(
    module: nn.Module,
    sample_shape: tuple[int, ...],
    *,
    global_batch: int,
    max_devices: int,
    repeats: int = 3,
    threads: int | None = 1,
    make_input: Callable[[int], torch.Tensor] | None = None,
    device: str = "",
) -> brain_pb2.LayerProfile:
    """Per-layer fwd+bwd times on this machine at per-device batch global_batch / g for
    g = 1, 2, 4, ... max_devices, as the LayerProfile the Brain stores and plans over
    (`device`: what it was measured on, in words).

    Inputs: make_input(batch) (e.g. real samples of the job's dataset, on the module's
    device), else float32 noise of sample_shape. global_batch must be a multiple of
    max_devices (a power of two): every count gets whole samples. threads: intra-op
    threads while measuring (one CPU slot is one device; None keeps torch's setting).
    The module is left in training mode with its gradients cleared.
    """
    counts = power_of_two_counts(max_devices)
    if counts[-1] != max_devices or global_batch % max_devices:
        raise ValueError(
            f"max_devices: want a power of two dividing global_batch ({global_batch}), "
            f"got {max_devices}"
        )
    module.train()
    make = make_input or (lambda batch: torch.randn(batch, *sample_shape))
    layers = trace_layers(module, make(1))
    saved_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        seconds, sample_bytes = _measure(layers, make, global_batch, counts, repeats)
    finally:
        torch.set_num_threads(saved_threads)
        module.zero_grad(set_to_none=True)
    return brain_pb2.LayerProfile(
        layers=[
            brain_pb2.ProfiledLayer(
                name=name,
                seconds=[seconds[count][i] for count in counts],
                output_bytes_per_sample=sample_bytes[i],
                parameter_bytes=_param_bytes(layers.module, node),
            )
            for i, (name, node) in enumerate(zip(layers.names, layers.nodes, strict=True))
        ],
        edges=[brain_pb2.LayerEdge(source=u, target=v) for u, v in sorted(set(layers.edges))],
        device_counts=list(counts),
        global_batch=global_batch,
        device=device,
    )


def _measure(
    layers: TracedLayers,
    make_input: Callable[[int], torch.Tensor],
    global_batch: int,
    counts: tuple[int, ...],
    repeats: int,
) -> tuple[dict[int, list[float]], list[float]]:
    """Seconds per layer for each device count (at its per-device batch), and output
    bytes per sample."""
    traced = layers.module
    seconds: dict[int, list[float]] = {}
    sample_bytes: list[float] = []
    with torch.random.fork_rng():
        torch.manual_seed(0)
        for count in counts:
            batch = global_batch // count
            values = _record(traced, make_input(batch))
            seconds[count] = [_time_layer(traced, n, values, repeats) for n in layers.nodes]
            if not sample_bytes:
                sample_bytes = [
                    values[n].numel() * values[n].element_size() / batch for n in layers.nodes
                ]
    return seconds, sample_bytes
