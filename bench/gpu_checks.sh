#!/usr/bin/env bash
# bench/gpu_checks.sh OUTDIR [--parts tests,bitwise,d2,overhead,memory] [...]: the runtime's
# GPU checks on a machine with CUDA (see bench/gpu_checks.py, or --help). Wheels carried in
# .gearshift/gpu-wheels/ (bench/gpu_wheels.sh) are installed first into /tmp, offline.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
wheels=.gearshift/gpu-wheels
if compgen -G "$wheels/*.whl" >/dev/null; then
    site=/tmp/gearshift-gpu-site
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" "$wheels"/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
exec "$python" bench/gpu_checks.py --python "$python" "$@"
