#!/usr/bin/env bash
# On the dev machine, before a GPU session: the wheels the GPU machine lacks, into .whl/ at the repository's
# root, which .git/info/exclude then ignores (the device tool carries it with carry [".whl"]; so is
# .gpu_results/, where an earlier call's results are carried back for the planner stage), and the commit
# these files are at into .whl/COMMIT (the GPU machine gets the working tree without .git).
# The machine's image has torch 2.11+cu130, Python 3.12, transformers, tokenizers, safetensors, tensorboard,
# tqdm, numpy, pyyaml, packaging, psutil, py-cpuinfo, msgpack, ninja, einops, but no hydra, omegaconf,
# deepspeed, pydantic or torchao (typing-extensions comes too: pydantic-core needs 4.14 or newer). Wheels already in .whl/ are kept; rerun it before each
# session to refresh the commit. benchmarks/gpu_session.sh installs them there.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
for ignored in /.whl/ /.gpu_results/; do
    grep -qx "$ignored" "$exclude" 2>/dev/null || echo "$ignored" >> "$exclude"
done
mkdir -p .whl
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
binary="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl"
# shellcheck disable=SC2086
"$py" -m pip download -q $binary hydra-core==1.3.2 omegaconf==2.3.0 pydantic==2.12.5 pydantic-core==2.41.5 \
    annotated-types typing-inspection "typing-extensions>=4.14.1" hjson torchao==0.18.0
# pure-Python projects published as source only: built into wheels here (DeepSpeed without its C++ ops,
# which the framework does not use on one GPU; DS_BUILD_OPS=0)
have() { ls .whl/"$1"-*.whl >/dev/null 2>&1; }
have antlr4_python3_runtime || "$py" -m pip download -q --no-deps --no-binary=:all: -d "$tmp" antlr4-python3-runtime==4.9.3
have deepspeed || "$py" -m pip download -q --no-deps -d "$tmp" "deepspeed>=0.19,<0.20"
for source in "$tmp"/*.tar.gz; do
    [ -e "$source" ] && DS_BUILD_OPS=0 "$py" -m pip wheel -q --no-deps -w .whl "$source"
done
commit=$(git rev-parse --short HEAD)
[ -z "$(git status --porcelain --untracked-files=no)" ] || commit="$commit+changes"
echo "$commit" > .whl/COMMIT
ls .whl
