#!/usr/bin/env bash
# On this (CPU) machine: the device session, rehearsed, so that its few minutes of GPU time are not lost to a missing
# wheel or path. Every step of run.sh runs on the CPU (DEVICE=cpu), in a copy of what a device call carries (the
# working tree git does not ignore, and .gpu/ with this machine's Python's wheels, ../shared left behind), with a
# Python that holds what the GPU machine's holds (the device tool's KINDS.md, "Python packages already there";
# torch 2.13 on the CPU stands in for 2.11 with CUDA unless TORCH=2.11.0, a 3 GB CUDA build from PyPI that runs on
# the CPU here; numpy 2.4 for 2.5, Python 3.11 for 3.12) and nothing more.
# Then it checks that each step left its result: the device tests passed, the benchmark's smoke row, the frontier's
# rows for ours, sae_lens and sparsify. About 6 minutes; the venv is kept in VENV for the next rehearsal.
set -euo pipefail

rehearse() {  # one function, read whole before it runs: editing this file meanwhile is safe
    cd "$(dirname "$0")/../.."
    VENV=${VENV:-/tmp/gpu-rehearsal-venv}
    WORK=${WORK:-/tmp/gpu-rehearsal}
    if [ ! -x "$VENV/bin/python3" ]; then
        python3 -m venv "$VENV"
        "$VENV/bin/pip" install -q "torch==${TORCH:-2.13.0}" transformers==5.17.0 huggingface_hub==1.33.0 tokenizers==0.23.2 \
            safetensors==0.8.0 accelerate==1.15.0 jaxtyping==0.3.11 wadler-lindig einops numpy scipy h5py networkx \
            pyarrow pandas requests matplotlib psutil xxhash rich click joblib protobuf pyyaml tqdm regex fsspec \
            pytest hypothesis
        # the GPU machine has no pydantic (something above pulls it in here)
        "$VENV/bin/pip" uninstall -q -y pydantic pydantic-core annotated-types typing-inspection
    fi
    rm -rf "$WORK" && mkdir -p "$WORK/repo"
    git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$WORK/repo"
    py=$("$VENV/bin/python3" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    PY=$py GPU_DIR="$WORK/repo/.gpu" bash benchmarks/gpu/prepare.sh
    (
        cd "$WORK/repo"
        PATH="$VENV/bin:$PATH" DEVICE=cpu OUT="$WORK/out" FRONTIER_WORK="$WORK/frontier" STEPS="tests bench train frontier" TRAIN_ARGS="--runs bundled:topk:256:1024 wide:jumprelu:256:512 --wide-d-model 64 --steps 3 --block-tokens 4096" FRONTIER_METHODS=topk,sparsify_topk,sae_lens_jumprelu \
            FRONTIER_ARGS="--n-tokens 8192" bash benchmarks/gpu/run.sh
    )
    echo "--- rehearsal: what each step left in $WORK/out"
    ok=1
    check() {  # check WHAT FILE PATTERN
        if grep -q -- "$3" "$WORK/out/$2" 2>/dev/null; then echo "ok: $1"; else echo "MISSING: $1 ($2: $3)"; ok=0; fi
    }
    check "each step's time" log.txt "frontier --autocast done"
    check "the device tests passed" tests.txt " passed"
    grep -q -E "[0-9]+ (failed|error)" "$WORK/out/tests.txt" && { echo "FAILED: a device test"; ok=0; }
    check "the benchmark's smoke case" gpu_vs_circuit_tracer_cpu_smoke.md "| smoke | [0-9]"
    check "the benchmark's profile" gpu_vs_circuit_tracer_cpu_smoke.md "## Profile of smoke"
    check "the benchmark's wall times" gpu_vs_circuit_tracer_cpu_smoke.md "- smoke: wall s: circuit-tracer's process"
    check "the frontier's run times" log.txt "topk_12_seed0: .*, run [0-9]* s)"
    check "the trainer's steps (fp32)" gpu_train_steps_cpu.md "| bundled, topk, batch 256, d_sae 1024 |"
    check "the trainer's steps (bf16 autocast)" gpu_train_steps_cpu_bf16.md "| wide, jumprelu, batch 256, d_sae 512 |"
    check "the frontier (fp32): ours" frontier_cpu.json '"method": "topk"'
    check "the frontier (fp32): sparsify" frontier_cpu.json '"method": "sparsify_topk"'
    check "the frontier (fp32): sae_lens" frontier_cpu.json '"method": "sae_lens_jumprelu"'
    check "the frontier (bf16 autocast): ours" frontier_cpu_bf16.json '"method": "topk"'
    [ $ok = 1 ] && echo "the rehearsal passed" || { echo "the rehearsal failed"; exit 1; }
}

rehearse
