#!/usr/bin/env bash
# On the GPU machine (the device tool, with carry [".gpu"]): the GPU checks of issue 29, logs in $OUT.
# 1. install each side's wheels into its own folder (no package index there);
# 2. (STEPS has tests) the device tests on cuda (tests/test_devices.py: attribution, a training step);
# 3. (STEPS has bench) the benchmark against circuit-tracer (benchmarks/gpu_vs_circuit_tracer.py), CASES cases
#    (default: all six, most wanted first), its tables written into $OUT after every case;
# 4. (STEPS has train) where our trainer's steps spend their time (benchmarks/gpu_train_steps.py), fp32 and bf16;
# 5. (STEPS has frontier) training on the device, below.
# STEPS defaults to "tests bench", about 8 minutes: one device call holds at most 10, so training is a second
# call (STEPS="train frontier" TRAIN_TIMEOUT=90 FRONTIER_TIMEOUT=140, under 8 minutes: the 15 minutes of a
# session hold both calls). DEVICE=cpu (rehearse.sh) runs the same steps on the CPU: the
# device tests' cpu cases, the benchmark's --smoke case, short training runs. At most 8 files come back from a
# call: log.txt holds the small outputs, and the frontier returns its .json alone (frontier.py --rewrite makes
# its table and plot here).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"  # at most 8 files come back from a call: log.txt holds the small ones
stamp() { echo "$(date -u +%T) $*" | tee -a "$OUT/log.txt"; }
stamp "start"
DEVICE=${DEVICE:-cuda}
STEPS=" ${STEPS:-tests bench} "
PY=$(command -v python3)  # the GPU machine's Python, the one with torch
for side in ag ct tr; do
    [ -d ".gpu/$side" ] || "$PY" -m pip install -q --no-index --no-deps --target ".gpu/$side" .gpu/wheels/$side/*.whl
done
if [ "$DEVICE" = cuda ]; then
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee -a "$OUT/log.txt"
    PROFILE=${PROFILE:-llama-1b-32}  # the issue's goal case, profiled once more: where its time goes
else
    BENCH_ARGS="--smoke ${BENCH_ARGS:-}"
    PROFILE=${PROFILE:-smoke}
    export SPARSIFY_DISABLE_TRITON=1  # sparsify decodes with triton wherever it imports, and triton needs a GPU
fi
export HF_HUB_OFFLINE=1 PYTHONPATH="$PWD:$PWD/.gpu/ag"
# attribution on the device (the resident rows of linear_backward.py step 8) equals the CPU graph; a training step runs
stamp "installed; steps:$STEPS"
if [[ $STEPS == *" tests "* ]]; then
    timeout "${TESTS_TIMEOUT:-150}" "$PY" -m pytest -o addopts="" -p no:cacheprovider -q -rA tests/test_devices.py \
        -k "$DEVICE" 2>&1 | tail -40 | tee "$OUT/tests.txt"
    stamp "device tests done"
fi
if [[ $STEPS == *" bench "* ]]; then
    timeout "${BENCH_TIMEOUT:-400}" "$PY" benchmarks/gpu_vs_circuit_tracer.py --ct-path "$PWD/.gpu/ct" \
        --ag-path "$PWD/.gpu/ag" --harness .gpu/peer --case-timeout "${CASE_TIMEOUT:-240}" \
        ${CASES:+--cases $CASES} --profile $PROFILE --results "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.txt"
    stamp "benchmark done"
fi
if [[ $STEPS == *" train "* ]]; then
    for amp in "" --autocast; do
        timeout "${TRAIN_TIMEOUT:-90}" "$PY" benchmarks/gpu_train_steps.py --device "$DEVICE" $amp ${TRAIN_ARGS:-} \
            --out "$OUT/gpu_train_steps_$DEVICE${amp:+_bf16}" 2>&1 | grep -v USDT | tail -8 | tee -a "$OUT/log.txt"
        stamp "train steps ${amp:-fp32} done"
    done
fi
# 5. (STEPS has frontier) training on the device: our trainer's, sae_lens's and sparsify's tokens/s and FVU / L0 on
#    the bundled model, fp32 and bf16 autocast (benchmarks/frontier.py --device; the dumps on the CPU).
#    sparsify runs in a child process that starts with no PYTHONPATH (train_vs_sparsify.run_child): a wrapper file
#    gives it its folders. The methods go in pairs (ours and theirs, TopK first), so a pass cut short by
#    FRONTIER_TIMEOUT still compares like with like. FRONTIER_PASSES picks the passes (default "fp32 bf16").
if [[ $STEPS == *" frontier "* ]]; then
    export PYTHONPATH="$PYTHONPATH:$PWD/.gpu/tr"  # sae_lens for frontier.py itself
    printf '#!/bin/sh\nPYTHONPATH="%s" exec "%s" "$@"\n' "$PYTHONPATH" "$PY" >.gpu/sparsify-python
    chmod +x .gpu/sparsify-python
    FRONTIER_OUT=$(mktemp -d)
    for pass in ${FRONTIER_PASSES:-fp32 bf16}; do  # FRONTIER_PASSES=fp32: the float32 pass alone
        amp=$([ "$pass" = bf16 ] && echo --autocast)
        timeout "${FRONTIER_TIMEOUT:-240}" "$PY" benchmarks/frontier.py --device "$DEVICE" $amp --seeds 0 \
            --methods "${FRONTIER_METHODS:-topk,sparsify_topk,jumprelu_tanh,sae_lens_jumprelu}" --work "${FRONTIER_WORK:-/tmp/frontier_gpu}" \
            --sparsify-python "$PWD/.gpu/sparsify-python" ${FRONTIER_ARGS:-} --out "$FRONTIER_OUT/frontier_$DEVICE${amp:+_bf16}" \
            2>&1 | grep -E "_seed[0-9]+: |^seed [0-9]+: dumped |^frontier setup: |Error|rror:" | tail -40 | tee -a "$OUT/log.txt"  # a line per run
        cp "$FRONTIER_OUT/frontier_$DEVICE${amp:+_bf16}.json" "$OUT/" || true
        stamp "frontier ${amp:-fp32} done"
    done
fi
