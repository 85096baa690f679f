"""Code packages: what goes in (.gitignore, always-out), the same bytes every time, the size
limit, and the checks on upload (announced hash and size) and on unpacking."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import pytest

from gearshift.common import codepkg
from gearshift.common.errors import ValidationError
from gearshift.v1 import common_pb2


def make_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_gitignore_rules_and_the_always_out_folders(tmp_path: Path) -> None:
    root = make_tree(
        tmp_path / "proj",
        {
            "train.py": "x = 1\n",
            "lib/model.py": "y = 2\n",
            "lib/.gitignore": "scratch.txt\n",
            "lib/scratch.txt": "no\n",
            "scratch.txt": "kept: the rule is lib's\n",
            ".gitignore": "data/\n*.ckpt\n!keep.ckpt\n",
            "data/big.bin": "no\n",
            "w.ckpt": "no\n",
            "keep.ckpt": "yes\n",
            ".git/HEAD": "no\n",
            "__pycache__/train.cpython-311.pyc": "no\n",
            ".venv/bin/python": "no\n",
        },
    )
    assert codepkg.package_files(root) == [
        ".gitignore",
        "keep.ckpt",
        "lib/.gitignore",
        "lib/model.py",
        "scratch.txt",
        "train.py",
    ]


def test_the_same_folder_has_the_same_hash_whatever_the_file_times(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "p", {"train.py": "a = 1\n", "util/x.py": "b = 2\n"})
    first = codepkg.package(root)
    os.utime(root / "train.py", (1, 1))
    second = codepkg.package(root)
    assert first.sha256 == second.sha256 and first.data == second.data
    (root / "train.py").write_text("a = 2\n")
    assert codepkg.package(root).sha256 != first.sha256


def test_one_file_is_packaged_alone(tmp_path: Path) -> None:
    make_tree(tmp_path, {"train.py": "a = 1\n", "other.py": "b = 1\n"})
    package = codepkg.package(tmp_path / "train.py")
    assert package.files == ("train.py",)


def test_over_the_size_limit_is_a_clear_error(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "p", {"train.py": "a = 1\n", "weights.bin": "x" * 5000})
    with pytest.raises(ValidationError, match=r"over the 0 MiB limit.*\.gitignore") as info:
        codepkg.package(root, limit=4096)
    assert info.value.field == str(root)


def test_missing_and_empty_paths_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="no such file or folder"):
        codepkg.package(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValidationError, match="holds no file"):
        codepkg.package(tmp_path / "empty")


def test_chunks_assemble_back_and_every_lie_is_caught(tmp_path: Path) -> None:
    data = os.urandom(3 * codepkg.CHUNK_BYTES + 17)
    sha = codepkg.sha256_of(data)
    parts = list(codepkg.chunks(sha, data))
    assert len(parts) == 4 and all(len(p.data) <= codepkg.CHUNK_BYTES for p in parts)
    assert codepkg.assemble(parts) == (sha, data)
    C = common_pb2.CodeChunk
    cases = [
        ([], "the stream was empty"),
        ([C(sha256="zz", size=1, data=b"a")], "not a SHA-256"),
        ([C(sha256=sha, size=0, data=b"")], "1 to"),
        (parts[:-1], "bytes received of the announced"),
        ([*parts, C(data=b"x")], "more than the announced"),
        ([parts[0], C(sha256=sha, data=b"x")], "only the first chunk"),
        ([C(sha256="0" * 64, size=len(data), data=data)], "hash to"),
    ]
    for chunks, problem in cases:
        with pytest.raises(ValidationError, match=problem):
            codepkg.assemble(chunks)


def test_unpack_once_and_refuse_paths_outside(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "p", {"train.py": "a = 1\n", "pkg/m.py": "b = 1\n"})
    package = codepkg.package(root)
    cache = tmp_path / "cache"
    folder = codepkg.unpack(package.data, cache, package.sha256)
    assert (folder / "pkg" / "m.py").read_text() == "b = 1\n"
    assert codepkg.unpack(package.data, cache, package.sha256) == folder
    evil = io.BytesIO()
    with zipfile.ZipFile(evil, "w") as archive:
        archive.writestr("../escape.py", "x = 1\n")
    with pytest.raises(ValidationError, match="outside the package"):
        codepkg.unpack(evil.getvalue(), cache, "e" * 64)
    assert not (cache / ("e" * 64)).exists() and not (tmp_path / "escape.py").exists()
    assert sorted(p.name for p in cache.iterdir()) == [package.sha256]  # no scratch left
