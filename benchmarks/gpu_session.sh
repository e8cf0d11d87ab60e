#!/usr/bin/env bash
# The GPU checks the open issues ask for, prepared for a device run (one call runs at most 10 minutes; a
# session has 15 minutes of device time with the machine's start, so pick the steps by priority):
#
#   bash benchmarks/gpu_session.sh STEP [STEP ...]
#
#   determinism  issue 30: periodic async saves, trainer.deterministic, its cost     (~3-4 min)
#   check        issues 32/33: single and fsdp, eager and compiled, reported vs profiler trace, and the
#                plan timed on this GPU next to each (benchmarks/gpu_check.py)      (~6-8 min)
#   plain        issue 33: parallel=single vs a plain loop, eager and compiled, 2 rounds   (~6-8 min)
#   loss_chunk   issue 33: the llama3_8b loss's peak with and without chunking         (~1 min)
#
# Before the first device run, gather here the wheels the GPU machine lacks (hydra-core, omegaconf,
# deepspeed, torchao, ...) into .whl/ (`pip download --no-deps ...`), then run with carry [".whl"]. Everything printed also goes to $OUT/gpu_session.log (the device returns files
# from $OUT only). A step that fails or runs out of its time says so and the next one runs.
set -uo pipefail
out="${OUT:-/tmp}/gpu_session.log"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PWD"
fi
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')" | tee -a "$out"

step() {   # name, seconds, command...
    local name=$1 limit=$2; shift 2
    echo "== $name (at most ${limit}s): $*" | tee -a "$out"
    local start=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee -a "$out"
    echo "== $name: exit ${PIPESTATUS[0]} after $((SECONDS - start))s" | tee -a "$out"
}

for name in "$@"; do
    case "$name" in
        determinism) step determinism 300 python3 benchmarks/gpu_determinism.py ;;
        check) step check 540 python3 benchmarks/gpu_check.py --only single,fsdp_z3 ;;
        plain) step plain 540 python3 benchmarks/plain_loop_vs_framework.py --rounds 2 ;;
        loss_chunk) step loss_chunk 120 python3 benchmarks/loss_chunk_memory.py --chunk 1024 ;;
        *) echo "unknown step $name (determinism | check | plain | loss_chunk)" | tee -a "$out"; exit 2 ;;
    esac
done
