#!/usr/bin/env bash
# The GPU session in one command, run from the repository's root on the GPU machine:
#
#   bash benchmarks/gpu_session.sh --seconds 570 --out "$OUT/results" honest_single honest_fsdp kernels
#
# Installs the wheels benchmarks/gather_gpu_wheels.sh gathered into .whl/ (carried to the machine, which has
# torch but no registry) where the packages are not importable yet, then runs the named stages
# (benchmarks/gpu/session.py; `--list` shows them with their estimates) within --seconds counted from
# now, the install included. A stage that would not fit in what is left is skipped with a line saying so.
# Each stage prints its table as its jobs finish and appends its rows to <out>/<stage>.jsonl; the
# console also goes to <out>/session.log (docs/benchmarks/gpu-session.md: the calls, and the tables). `--dry-run` runs every stage on this machine's CPU at tiny
# sizes (tests/integration/benchmarks/test_gpu_session.py does). The project runs from source (PYTHONPATH), not pip install -e:
# the machine's torch is not the one pyproject.toml pins for CI.
set -uo pipefail
export GPU_SESSION_STARTED
GPU_SESSION_STARTED=$(date +%s.%N)
py=${PYTHON:-python3}
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
needed=(hydra omegaconf deepspeed torchao pydantic)
have_all() {   # found, not imported: importing deepspeed alone takes seconds
    "$py" -c 'import importlib.util, sys; sys.exit(any(importlib.util.find_spec(m) is None for m in sys.argv[1:]))' \
        "${needed[@]}"
}
site=${GPU_SESSION_SITE:-/tmp/site}     # where the wheels go: outside the tree, which a device call re-sends
if ! have_all; then
    if ! PYTHONPATH="$site:$PYTHONPATH" have_all; then
        if ! ls .whl/*.whl >/dev/null 2>&1; then
            echo "error: ${needed[*]} not all installed, and no .whl/ to install them from: run" \
                 "bash benchmarks/gather_gpu_wheels.sh on the dev machine and carry .whl" >&2
            exit 2
        fi
        echo "installing $(ls .whl/*.whl | wc -l) wheels from .whl/ into $site"
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
            || { echo "error: the wheels in .whl/ did not install" >&2; exit 1; }
    fi
    export PYTHONPATH="$site:$PYTHONPATH"
fi
exec "$py" -m benchmarks.gpu.session "$@"
