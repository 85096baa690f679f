"""Users' code packages: a folder zipped the same way every time, named by its SHA-256.

The client packages a job's folder (or one file) and uploads it once; the scheduler
keeps it by hash; a worker fetches it by hash, unpacks it once into its cache and
puts it first on the training processes' import path. The archive is deterministic
(sorted names, fixed timestamps and modes), so the same folder always has the same
hash and a second submit uploads nothing.

What goes in: every file under the folder except what its `.gitignore` files say
(the rules of each `.gitignore` apply below its own folder, as git reads them), and
`.git`, `__pycache__`, virtual environments and `*.pyc` always stay out.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pathspec

from gearshift.common.errors import ValidationError
from gearshift.v1 import common_pb2

MAX_PACKAGE_BYTES = 32 * 1024 * 1024  # the scheduler's database keeps each package whole
CHUNK_BYTES = 1024 * 1024  # well under gRPC's 4 MiB message limit
ALWAYS_OUT = (".git/", "__pycache__/", "*.pyc", ".venv/", "venv/", ".mypy_cache/", ".ruff_cache/")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_EPOCH = (1980, 1, 1, 0, 0, 0)  # zip's earliest date: the same bytes whenever packaged


@dataclass(frozen=True)
class CodePackage:
    sha256: str
    data: bytes
    files: tuple[str, ...]  # archive names, sorted


def check_sha256(value: str, field: str) -> str:
    """A package name as the contracts spell it (64 lowercase hex digits)."""
    if not _SHA256.fullmatch(value):
        raise ValidationError(field, f"{value!r} is not a SHA-256 in hex (64 lowercase digits)")
    return value


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _ignored(folder: Path) -> pathspec.GitIgnoreSpec:
    """The folder's `.gitignore` rules (each file's rules prefixed by its own folder)."""
    lines = list(ALWAYS_OUT)
    for ignore in sorted(folder.rglob(".gitignore")):
        base = ignore.parent.relative_to(folder).as_posix()
        prefix = "" if base == "." else base + "/"
        for raw in ignore.read_text(errors="replace").splitlines():
            rule = raw.strip()
            if not rule or rule.startswith("#"):
                continue
            negate = rule.startswith("!")
            rule = rule[1:] if negate else rule
            anchored = rule.startswith("/") or "/" in rule.rstrip("/")
            rule = rule.lstrip("/")
            rule = prefix + rule if anchored else prefix + "**/" + rule
            lines.append(("!" if negate else "") + rule)
    return pathspec.GitIgnoreSpec.from_lines(lines)


def package_files(folder: Path) -> list[str]:
    """The files of `folder` a package holds, as sorted POSIX paths relative to it."""
    spec = _ignored(folder)
    out = []
    for root, dirs, files in os.walk(folder):
        here = Path(root).relative_to(folder)
        dirs[:] = sorted(d for d in dirs if not spec.match_file((here / d).as_posix() + "/"))
        for name in files:
            path = (here / name).as_posix()
            if not spec.match_file(path) and not (Path(root) / name).is_symlink():
                out.append(path)
    return sorted(out)


def package(path: Path, *, limit: int = MAX_PACKAGE_BYTES) -> CodePackage:
    """Package a folder, or a single file (alone in the package). Raises ValidationError
    naming the path when it is missing, empty or over `limit` bytes."""
    field = str(path)
    if path.is_file():
        folder, names = path.parent, [path.name]
    elif path.is_dir():
        folder, names = path, package_files(path)
    else:
        raise ValidationError(field, "no such file or folder")
    if not names:
        raise ValidationError(field, "holds no file to package (all ignored?)")
    raw = sum((folder / n).stat().st_size for n in names)
    if raw > limit:
        raise ValidationError(
            field,
            f"{raw / 2**20:.1f} MiB of code is over the {limit / 2**20:.0f} MiB limit of a "
            "package: keep data and checkpoints out of the folder (or list them in .gitignore)",
        )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in names:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, (folder / name).read_bytes())
    data = buffer.getvalue()
    if len(data) > limit:
        raise ValidationError(field, f"the package is {len(data)} bytes, over {limit}")
    return CodePackage(sha256_of(data), data, tuple(names))


def chunks(sha256: str, data: bytes) -> Iterator[common_pb2.CodeChunk]:
    """A package as upload/fetch chunks: the first names it and its size."""
    yield common_pb2.CodeChunk(sha256=sha256, size=len(data), data=data[:CHUNK_BYTES])
    for start in range(CHUNK_BYTES, len(data), CHUNK_BYTES):
        yield common_pb2.CodeChunk(data=data[start : start + CHUNK_BYTES])


def assemble(
    stream: Iterable[common_pb2.CodeChunk], *, limit: int = MAX_PACKAGE_BYTES
) -> tuple[str, bytes]:
    """Join chunks into (sha256, data), checking the announced name, size and the hash."""
    sha256 = ""
    size = -1
    parts: list[bytes] = []
    received = 0
    for index, chunk in enumerate(stream):
        if index == 0:
            sha256 = check_sha256(chunk.sha256, "chunk[0].sha256")
            size = chunk.size
            if not 0 < size <= limit:
                raise ValidationError(
                    "chunk[0].size", f"{size} bytes: a package is 1 to {limit} bytes"
                )
        elif chunk.sha256 or chunk.size:
            raise ValidationError(f"chunk[{index}]", "only the first chunk names the package")
        received += len(chunk.data)
        if received > size:
            raise ValidationError(f"chunk[{index}]", f"more than the announced {size} bytes")
        parts.append(chunk.data)
    if size < 0:
        raise ValidationError("chunks", "the stream was empty")
    if received != size:
        raise ValidationError("chunks", f"{received} bytes received of the announced {size}")
    data = b"".join(parts)
    actual = sha256_of(data)
    if actual != sha256:
        raise ValidationError("chunk[0].sha256", f"the bytes hash to {actual}, not {sha256}")
    return sha256, data


def unpack(data: bytes, cache: Path, sha256: str) -> Path:
    """The package's folder in `cache` (unpacked once; concurrent callers are safe: each
    unpacks into a temporary folder and renames it into place)."""
    target = cache / sha256
    if target.is_dir():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{sha256[:12]}-", dir=cache))
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for name in archive.namelist():
                pure = PurePosixPath(name)
                if pure.is_absolute() or ".." in pure.parts:
                    raise ValidationError("package", f"{name!r} points outside the package")
            archive.extractall(scratch)
        try:
            scratch.rename(target)
        except OSError:  # another caller unpacked it first
            if not target.is_dir():
                raise
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)
    return target
