#!/usr/bin/env bash
# On this (CPU) machine: download the wheels the GPU machine lacks (../../shared/GPU.md) into .gpu/wheels/,
# one folder per side, for run.sh to install there. About 50 MB; .gpu/ is git-ignored and carried to the
# device with the working tree (run's `carry: [".gpu"]`).
set -euo pipefail
cd "$(dirname "$0")/../.."
get() {  # get SIDE NAME==VERSION...
    local side=$1; shift
    mkdir -p ".gpu/wheels/$side"
    pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any \
        -d ".gpu/wheels/$side" "$@"
}
get ag transformer-lens==3.9.0 better-abc fancy-einsum beartype typeguard datasets==5.2.0 dill multiprocess \
    jaxtyping wadler-lindig einops
get ct circuit-tracer==0.5.0 transformer-lens==3.2.1 transformers==4.57.3 tokenizers==0.22.2 \
    huggingface_hub==0.36.2 datasets==5.0.1 dill multiprocess better-abc fancy-einsum beartype typeguard \
    pydantic==2.14.4 pydantic-core==2.50.5 typing-inspection==0.4.5 annotated-types==0.8.0 jaxtyping \
    wadler-lindig einops
du -sh .gpu/wheels/*
