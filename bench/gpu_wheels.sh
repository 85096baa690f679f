#!/usr/bin/env bash
# bench/gpu_wheels.sh: download, here (where pip reaches the registry), the wheels the
# device machines lack for bench/gpu_checks.sh - gRPC, its health and reflection services
# and protobuf, at this virtual environment's versions (the generated code checks them) -
# for Python 3.12 on x86-64, into .gearshift/gpu-wheels/ (git ignores .gearshift/). Then
# name that folder in the device command's carry.
set -euo pipefail
cd "$(dirname "$0")/.."
version() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
packages=()
for name in grpcio grpcio-health-checking grpcio-reflection protobuf; do
    packages+=("$name==$(version "$name")")
done
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 \
    manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$tag")
done
.venv/bin/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d .gearshift/gpu-wheels "${packages[@]}"
ls -l .gearshift/gpu-wheels
