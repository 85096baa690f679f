"""Generate the Python code of the v1 contracts with grpcio-tools and mypy-protobuf.

Used by `make protos` (writes beside the .proto files) and by the staleness
test (writes to a temporary folder and compares), so both run the same command.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PROTO_DIR = PROTO_ROOT / "gearshift" / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def proto_files() -> list[Path]:
    return sorted(PROTO_DIR.glob("*.proto"))


def generated_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.endswith(GENERATED_SUFFIXES))


def _plugin(name: str) -> str:
    """Locate a protoc plugin next to this interpreter, where pip installed it."""
    candidate = Path(sys.executable).parent / name
    found = str(candidate) if candidate.exists() else shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} not found: install the dev extra (pip install -e '.[dev]')")
    return found


def generate(out_root: Path) -> list[Path]:
    """Write generated code for every proto under out_root/gearshift/v1 and return the files."""
    out_dir = out_root / "gearshift" / "v1"
    out_dir.mkdir(parents=True, exist_ok=True)
    grpc_include = Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{grpc_include}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *(str(p.relative_to(PROTO_ROOT)) for p in proto_files()),
    ]
    code = protoc.main(args)
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")
    return generated_files(out_dir)


def descriptor_set(proto_root: Path = PROTO_ROOT) -> descriptor_pb2.FileDescriptorSet:
    """The contracts' descriptors with comments (source info), for the contract tests."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        code = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{proto_root}",
                f"-I{Path(protoc.__file__).parent / '_proto'}",
                "--include_source_info",
                f"--descriptor_set_out={out}",
                *(
                    str(p.relative_to(proto_root))
                    for p in sorted(proto_root.glob("gearshift/v1/*.proto"))
                ),
            ]
        )
        if code != 0:
            raise SystemExit(f"protoc failed with exit code {code}")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=PROTO_ROOT, help="output root (default: protos/)"
    )
    args = parser.parse_args()
    for path in generate(args.out):
        print(path.relative_to(args.out))


if __name__ == "__main__":
    main()
