#!/usr/bin/env bash
# On this (CPU) machine: download the wheels the GPU machine lacks (../../shared/GPU.md) into .gpu/wheels/,
# one folder per side, for run.sh to install there. About 26 MB; .gpu/ is git-ignored and carried to the
# device with the working tree (run's `carry: [".gpu"]`). PY (default 3.12, the GPU machine's) picks the wheels'
# Python: rehearse.sh sets this machine's, and GPU_DIR (default .gpu) its copy's folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
G=${GPU_DIR:-.gpu}
get() {  # get SIDE NAME==VERSION...
    local side=$1; shift
    mkdir -p "$G/wheels/$side"
    pip download -q --no-deps --only-binary=:all: --python-version "${PY:-3.12}" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any \
        -d "$G/wheels/$side" "$@"
}
get ag transformer-lens==3.9.0 better-abc fancy-einsum beartype typeguard datasets==5.2.0 dill multiprocess \
    jaxtyping wadler-lindig einops
get ct circuit-tracer==0.5.0 transformer-lens==3.2.1 transformers==4.57.3 tokenizers==0.22.2 \
    huggingface_hub==0.36.2 datasets==5.0.1 dill multiprocess better-abc fancy-einsum beartype typeguard \
    pydantic==2.14.4 pydantic-core==2.50.5 typing-inspection==0.4.5 annotated-types==0.8.0 jaxtyping \
    wadler-lindig einops
# sparsify and sae_lens, for the training comparison on the device (STEPS=frontier); what they need beyond these
# (accelerate, einops, safetensors) the machine has. sae_lens comes without what its package __init__ imports for its
# runner (wandb, plotly, nltk, babe: about 35 MB, past the 64 MiB a call carries): benchmarks/frontier.py imports
# its training SAE modules alone (import_sae_lens_training).
get tr eai-sparsify==1.3.3 schedulefree==1.4.1 natsort==8.4.0 simple-parsing==0.1.9 docstring-parser==0.18.0 \
    sae-lens==6.54.12
# circuit-tracer's side runs ../shared/peer/ct_gpu.py, and ../shared does not travel to the device: a copy does
mkdir -p "$G/peer" && cp ../shared/peer/ct_gpu.py ../shared/peer/ct_graph.py "$G/peer/"
du -sh "$G"/wheels/* "$G/peer"
# what a device call carries: the working tree (tracked and untracked files git does not ignore) and .gpu
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1)
gpu=$(du -sb "$G/wheels" "$G/peer" | awk '{s += $1} END {print s}')
echo "a device call carries $(( (tree + gpu) / 1048576 )) MiB (the limit: 64 MiB)"
[ $(( tree + gpu )) -lt $(( 64 * 1048576 )) ] || { echo "over the device's limit" >&2; exit 1; }
