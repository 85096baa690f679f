"""Loader for DeepPool's per-layer profiles (the `.prof` files measured on A100s).

A row is `kind{json params}[batch][input shape]  total_ms  fw_us  bw_us`, one per layer
and per-device batch size, layers in graph order, each batch closed by a `SUM`/`sum`
line. The files carry no edges: a model whose rows chain by shape (every layer's input is
the previous one's output: VGG-16, WRN-101-2) is a chain; otherwise the rows are matched
against Inception-v3's block layout, whose concatenations are added as zero-cost layers
and every edge is checked by shape. Output shapes and parameter sizes (4-byte floats)
follow from each row's kind and parameters.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from .profiles import LayerGraph, graph_from_batch_times

_ROW = re.compile(
    r"^(?P<kind>\w+)(?P<params>\{.*\})\[(?P<batch>\d+)\](?P<shape>\[[\d,]+\]|\d+)"
    r"\s+(?P<total>[\d.]+)\s+(?P<fw>\d+)\s+(?P<bw>\d+)$"
)
_SUM = re.compile(r"^(SUM|sum)\b", re.IGNORECASE)
FLOAT_BYTES = 4

Shape = tuple[int, ...]


@dataclass(frozen=True)
class ProfLayer:
    """One layer of a .prof file: its row signature, shapes and parameter bytes."""

    kind: str
    params: dict[str, Any]
    in_shape: Shape
    out_shape: Shape
    param_bytes: int

    @property
    def name(self) -> str:
        return f"{self.kind}{json.dumps(self.params, separators=(',', ':'), sort_keys=True)}"


def _pair(value: int | list[int]) -> tuple[int, int]:
    return (value[0], value[1]) if isinstance(value, list) else (value, value)


def _spatial(shape: Shape, kernel: Any, padding: Any, stride: Any) -> tuple[int, int]:
    (kh, kw), (ph, pw), (sh, sw) = _pair(kernel), _pair(padding), _pair(stride)
    return (shape[1] + 2 * ph - kh) // sh + 1, (shape[2] + 2 * pw - kw) // sw + 1


def _bottleneck(p: dict[str, Any], shape: Shape) -> tuple[Shape, int]:
    """torchvision-style Bottleneck: 1x1, 3x3 (stride), 1x1 (x4) with BatchNorms."""
    groups = p.get("groups", 1)
    width = p["planes"] * p["base_width"] // 64 * groups
    out = p["planes"] * 4
    stride = p.get("stride", 1)
    params = p["inplanes"] * width + width * width * 9 // groups + width * out
    params += 2 * (width + width + out)
    if "downsampleParams" in p:
        (cin, cout, _), _ = p["downsampleParams"]
        params += cin * cout + 2 * cout
    h, w = _spatial(shape, 3, 1, stride)
    return (out, h, w), params


def _layer(kind: str, p: dict[str, Any], shape: Shape) -> ProfLayer:
    if kind == "conv2d":
        k = _pair(p["kernel_size"])
        h, w = _spatial(shape, p["kernel_size"], p.get("padding", 0), p.get("stride", 1))
        params = p["in_channels"] * p["out_channels"] * k[0] * k[1] + p["out_channels"]
        return ProfLayer(kind, p, shape, (p["out_channels"], h, w), params * FLOAT_BYTES)
    if kind in ("maxPool2d", "avgPool2d"):
        stride = p.get("stride", p["kernel_size"])
        h, w = _spatial(shape, p["kernel_size"], p.get("padding", 0), stride)
        return ProfLayer(kind, p, shape, (shape[0], h, w), 0)
    if kind == "adAvgPool2d":
        return ProfLayer(kind, p, shape, (shape[0], p["output_height"], p["output_width"]), 0)
    if kind in ("ReLU2d", "ReLU1d"):
        return ProfLayer(kind, p, shape, shape, 0)
    if kind == "flatten":
        return ProfLayer(kind, p, shape, (math.prod(shape),), 0)
    if kind == "linear":
        params = p["in_features"] * p["out_features"] + (p["out_features"] if p["bias"] else 0)
        return ProfLayer(kind, p, shape, (p["out_features"],), params * FLOAT_BYTES)
    if kind == "ResnetBottleneck":
        out, params = _bottleneck(p, shape)
        return ProfLayer(kind, p, shape, out, params * FLOAT_BYTES)
    raise ValueError(f"unknown layer kind {kind!r}")


@dataclass(frozen=True)
class ProfTable:
    """A .prof file: the layers (graph order) and fwd+bwd seconds per per-device batch."""

    layers: tuple[ProfLayer, ...]
    batch_times: dict[int, list[float]]


def read_prof(path: str | Path) -> ProfTable:
    """Parse a .prof file; every batch size must list the same layers in the same order."""
    groups: dict[int, list[tuple[ProfLayer, float]]] = {}
    current: list[tuple[ProfLayer, float]] = []
    batch: int | None = None

    def close() -> None:
        nonlocal current, batch
        if current:
            assert batch is not None
            if batch in groups:
                raise ValueError(f"{path}: batch {batch} appears twice")
            groups[batch] = current
        current, batch = [], None

    for lineno, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if _SUM.match(line):
            close()
            continue
        m = _ROW.match(line)
        if m is None:
            raise ValueError(f"{path}:{lineno}: not a profile row: {line[:80]!r}")
        b = int(m["batch"])
        if batch is not None and b != batch:
            close()
        batch = b
        shape = tuple(json.loads(m["shape"])) if m["shape"].startswith("[") else (int(m["shape"]),)
        layer = _layer(m["kind"], json.loads(m["params"]), shape)
        current.append((layer, (int(m["fw"]) + int(m["bw"])) * 1e-6))
    close()
    if not groups:
        raise ValueError(f"{path}: no profile rows")
    reference = next(iter(groups.values()))
    layers = tuple(layer for layer, _ in reference)
    for b, rows in groups.items():
        if [(r.name, r.in_shape) for r, _ in rows] != [(r.name, r.in_shape) for r in layers]:
            raise ValueError(f"{path}: batch {b} lists other layers than the first batch")
    return ProfTable(layers, {b: [t for _, t in rows] for b, rows in groups.items()})


# Inception-v3 (Szegedy et al. 2016, torchvision's layer order): a branch is a list of
# items, an int n is n layers in a row, a tuple is a block of parallel branches closed by a
# concatenation.
Branch = list[Union[int, "Block"]]
Block = tuple[Branch, ...]
_A: Block = ([1], [2], [3], [2])
_B: Block = ([1], [3], [1])
_C: Block = ([1], [3], [5], [2])
_D: Block = ([2], [4], [1])
_E: Block = ([1], [1, ([1], [1])], [2, ([1], [1])], [2])
INCEPTION_V3: Branch = [7, _A, _A, _A, _B, _C, _C, _C, _C, _D, _E, _E]


@dataclass(frozen=True)
class _Node:
    row: int | None  # index into the .prof layers, None for a concatenation
    out_shape: Shape


_Layout = tuple[list[_Node], list[tuple[int, int]]]


def _layout(spec: Branch, layers: tuple[ProfLayer, ...]) -> _Layout:
    """Nodes and edges of `spec` over `layers`; raises ValueError where shapes disagree."""
    nodes: list[_Node] = []
    edges: list[tuple[int, int]] = []
    cursor = 0

    def walk(branch: Branch, pred: int | None) -> int | None:
        nonlocal cursor
        for item in branch:
            if isinstance(item, int):
                for _ in range(item):
                    if cursor >= len(layers):
                        raise ValueError("fewer layers than the layout")
                    layer = layers[cursor]
                    if pred is not None and nodes[pred].out_shape != layer.in_shape:
                        raise ValueError(f"layer {cursor}: input {layer.in_shape} mismatch")
                    nodes.append(_Node(cursor, layer.out_shape))
                    if pred is not None:
                        edges.append((pred, len(nodes) - 1))
                    pred, cursor = len(nodes) - 1, cursor + 1
            else:
                ends = [walk(sub, pred) for sub in item]
                shapes = [nodes[e].out_shape for e in ends if e is not None]
                if len(shapes) != len(ends) or len({s[1:] for s in shapes}) != 1:
                    raise ValueError("a concatenation joins outputs of different sizes")
                nodes.append(_Node(None, (sum(s[0] for s in shapes), *shapes[0][1:])))
                edges.extend((e, len(nodes) - 1) for e in ends if e is not None)
                pred = len(nodes) - 1
        return pred

    walk(spec, None)
    if cursor != len(layers):
        raise ValueError(f"{len(layers)} layers, the layout places {cursor}")
    return nodes, edges


def _topology(layers: tuple[ProfLayer, ...]) -> _Layout:
    """The chain when the rows chain by shape, else Inception-v3's layout if it fits."""
    if all(a.out_shape == b.in_shape for a, b in itertools.pairwise(layers)):
        return _layout([len(layers)], layers)
    try:
        return _layout(INCEPTION_V3, layers)
    except ValueError as exc:
        raise ValueError(f"rows neither chain by shape nor fit Inception-v3 ({exc})") from exc


def load_prof(
    path: str | Path, *, global_batch: int | None = None, max_devices: int | None = None
) -> LayerGraph:
    """The LayerGraph of a .prof file for `global_batch` (default: its largest batch size).

    Counts go up to max_devices (default: the global batch); per-device batches that were
    not measured are interpolated or extrapolated (`times_at_batches`).
    """
    table = read_prof(path)
    nodes, edges = _topology(table.layers)
    names: list[str] = []
    for i, node in enumerate(nodes):
        names.append(f"concat#{i}" if node.row is None else f"{table.layers[node.row].kind}#{i}")
    batch_times = {
        b: [0.0 if n.row is None else times[n.row] for n in nodes]
        for b, times in table.batch_times.items()
    }
    params = [0 if n.row is None else table.layers[n.row].param_bytes for n in nodes]
    sample_bytes = [math.prod(n.out_shape) * FLOAT_BYTES for n in nodes]
    return graph_from_batch_times(
        names,
        edges,
        batch_times,
        sample_bytes,
        params,
        global_batch=max(table.batch_times) if global_batch is None else global_batch,
        max_devices=max_devices,
    )
