"""Checkpoints are atomic: a crash mid-write leaves the last good checkpoint as the latest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gearshift.worker.runtime import checkpoint
from gearshift.worker.runtime.digest import differences, state_digest


def payload(step: int) -> dict[str, Any]:
    return {"format": 1, "step": step, "w": torch.full((3,), float(step)), "meta": {"n": 4}}


def test_save_latest_load_and_keep(tmp_path: Path) -> None:
    assert checkpoint.latest(tmp_path) is None
    for step in (5, 10, 15):
        checkpoint.save(tmp_path, step, payload(step), keep=2)
    assert [s for s, _ in checkpoint.checkpoints(tmp_path)] == [10, 15]
    latest = checkpoint.latest(tmp_path)
    assert latest is not None
    assert latest.name == "ckpt-00000015.pt"
    assert differences(checkpoint.load(latest), payload(15)) == []


def test_a_crash_mid_write_keeps_the_last_good_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint.save(tmp_path, 5, payload(5))
    real_save = torch.save

    def crash(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        f.write(b"half a checkpoint")
        raise OSError("disk gone")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk gone"):
        checkpoint.save(tmp_path, 10, payload(10))
    monkeypatch.setattr(torch, "save", real_save)
    latest = checkpoint.latest(tmp_path)
    assert latest is not None
    assert latest.name == "ckpt-00000005.pt"
    assert checkpoint.load(latest)["step"] == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints.log", "ckpt-00000005.pt"]
    assert checkpoint.recorded(tmp_path) == (5, tmp_path / "ckpt-00000005.pt")  # not 10


def test_a_killed_writer_leaves_only_a_temporary_file_that_is_ignored(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 5, payload(5))
    (tmp_path / ".ckpt-00000010.pt.tmp-4242").write_bytes(b"\x80garbage")
    latest = checkpoint.latest(tmp_path)
    assert latest is not None
    assert latest.name == "ckpt-00000005.pt"
    checkpoint.save(tmp_path, 10, payload(10))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoints.log",
        "ckpt-00000005.pt",
        "ckpt-00000010.pt",
    ]


def test_a_foreign_file_is_not_loaded_as_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "ckpt-00000001.pt"
    torch.save({"hello": 1}, path)
    with pytest.raises(ValueError, match="not a Gearshift checkpoint"):
        checkpoint.load(path)


def test_digest_and_differences_compare_bytes_not_values() -> None:
    zero, negative_zero = torch.tensor([0.0]), torch.tensor([-0.0])
    assert torch.equal(zero, negative_zero)
    assert state_digest({"a": zero}) != state_digest({"a": negative_zero})
    assert differences({"a": zero}, {"a": negative_zero}) == ["/a: bytes differ"]
    nan = torch.tensor([float("nan")])
    assert not torch.equal(nan, nan)
    assert differences({"a": nan}, {"a": nan.clone()}) == []
    assert differences({"a": zero}, {"a": zero.double()}) == ["/a: bytes differ"]
    assert differences({"a": 1.0, "b": [zero]}, {"a": 1.0}) == ["/b/0: only in first"]


def test_discard_removes_only_the_file_it_wrote(tmp_path: Path) -> None:
    """A superseded writer's checkpoint goes; one of the same step written since by the
    placement that took over (another file) stays."""
    path = checkpoint.save(tmp_path, 5, payload(5))
    written = path.stat()
    assert checkpoint.discard(path, written)
    assert checkpoint.latest(tmp_path) is None
    assert not checkpoint.discard(path, written)  # already gone
    path = checkpoint.save(tmp_path, 5, payload(5))
    written = path.stat()
    checkpoint.save(tmp_path, 5, payload(5))  # the newer placement's, at the same step
    assert not checkpoint.discard(path, written)
    assert checkpoint.latest(tmp_path) == path
