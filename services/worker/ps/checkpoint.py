"""PS checkpoints on disk: one file per shard + the dense part, and a manifest.

Layout of a checkpoint folder D:
    D/manifest.json         the last complete generation (written last, atomically)
    D/gen-NNNN/ps-K.pt      rows and Adagrad state of PS K of that generation
    D/gen-NNNN/dense.pt     dense net, its optimizer, the next global batch number
A generation's files count only once the manifest names it, so a phase that dies
midway leaves the previous checkpoint as it was.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gearshift.worker.ps.data import ClickConfig, ClickData
from gearshift.worker.ps.model import DenseNet, ModelConfig
from gearshift.worker.ps.sharding import assemble

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Manifest:
    generation: int
    num_ps: int
    next_batch: int  # global batches claimed (and applied) so far
    data: dict[str, Any]
    model: dict[str, Any]
    updates_acked: int  # pushes the workers saw acknowledged, over all generations
    updates_applied: int  # pushes the PSs applied, over all generations

    @property
    def folder(self) -> str:
        return gen_folder(self.generation)

    def click_config(self) -> ClickConfig:
        return ClickConfig(**self.data)

    def model_config(self) -> ModelConfig:
        fields = dict(self.model)
        fields["hidden"] = tuple(fields["hidden"])
        return ModelConfig(**fields)


def gen_folder(generation: int) -> str:
    return f"gen-{generation:04d}"


def shard_path(root: Path, generation: int, shard: int) -> Path:
    return root / gen_folder(generation) / f"ps-{shard}.pt"


def dense_path(root: Path, generation: int) -> Path:
    return root / gen_folder(generation) / "dense.pt"


def read_manifest(root: Path) -> Manifest | None:
    """The last complete checkpoint in `root`, or None when there is none yet."""
    path = root / MANIFEST
    if not path.exists():
        return None
    return Manifest(**json.loads(path.read_text()))


def write_manifest(root: Path, manifest: Manifest) -> None:
    """Publish a generation (atomic rename), then drop generations before the previous one."""
    tmp = root / (MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(asdict(manifest), f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / MANIFEST)
    for old in root.glob("gen-*"):
        if old.is_dir() and int(old.name[4:]) < manifest.generation - 1:
            shutil.rmtree(old, ignore_errors=True)


def save_atomic(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_shards(root: Path, manifest: Manifest) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(rows, Adagrad accumulators) of every PS shard of the manifest's generation."""
    rows, accum = [], []
    for k in range(manifest.num_ps):
        blob = torch.load(shard_path(root, manifest.generation, k), weights_only=True)
        rows.append(blob["rows"])
        accum.append(blob["accum"])
    return rows, accum


def load_table(root: Path) -> torch.Tensor:
    """The whole embedding table of the last checkpoint in `root`, in global row order."""
    manifest = read_manifest(root)
    if manifest is None:
        raise FileNotFoundError(f"no PS checkpoint in {root}")
    rows, _ = load_shards(root, manifest)
    return assemble(rows, manifest.click_config().rows)


def evaluate(root: Path, heldout_blocks: int = 40) -> float:
    """Held-out AUC of the model in the last checkpoint of `root`."""
    from sklearn.metrics import roc_auc_score  # noqa: PLC0415 - seconds to import: only here

    manifest = read_manifest(root)
    if manifest is None:
        raise FileNotFoundError(f"no PS checkpoint in {root}")
    data_cfg, model_cfg = manifest.click_config(), manifest.model_config()
    table = load_table(root)
    net = DenseNet(model_cfg, data_cfg.fields, data_cfg.dense, data_cfg.seed)
    blob = torch.load(dense_path(root, manifest.generation), weights_only=True)
    net.load_state_dict(blob["net"])
    batch = ClickData(data_cfg).heldout(heldout_blocks)
    with torch.no_grad():
        emb = table[torch.from_numpy(batch.ids)]
        scores = net(emb, torch.from_numpy(batch.dense)).numpy()
    return float(roc_auc_score(batch.labels, scores.astype(np.float64)))
