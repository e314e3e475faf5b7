#!/usr/bin/env bash
# On the GPU machine (the device tool, with carry [".gpu"]): every GPU check of issue 29 in one go, logs in $OUT.
# 1. install each side's wheels into its own folder (no package index there);
# 2. the device tests on cuda (tests/test_devices.py: attribution and a training step on the model's device);
# 3. the benchmark against circuit-tracer (benchmarks/gpu_vs_circuit_tracer.py), CASES cases (default: all);
# results land in benchmarks/results/ and are copied to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
for side in ag ct; do
    [ -d ".gpu/$side" ] || pip install -q --no-index --no-deps --target ".gpu/$side" .gpu/wheels/$side/*.whl
done
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee "$OUT/gpu.txt"
export HF_HUB_OFFLINE=1 PYTHONPATH="$PWD:$PWD/.gpu/ag"
# attribution on cuda (the resident rows of linear_backward.py step 8) equals the CPU graph; a training step runs
timeout 240 python -m pytest -o addopts="" -p no:cacheprovider -q tests/test_devices.py -k cuda 2>&1 \
    | tail -30 | tee "$OUT/tests.txt"
timeout "${BENCH_TIMEOUT:-420}" python benchmarks/gpu_vs_circuit_tracer.py --ct-path "$PWD/.gpu/ct" \
    --ag-path "$PWD/.gpu/ag" ${CASES:+--cases $CASES} 2>&1 | tee "$OUT/bench.txt"
cp benchmarks/results/gpu_vs_circuit_tracer.* "$OUT/" 2>/dev/null || true
# 4. (FRONTIER=1) training on cuda: our trainer's tokens/s and FVU / L0 on the bundled model, fp32 and bf16 autocast
#    (benchmarks/frontier.py --device cuda; sae_lens and sparsify are not among the wheels brought here)
if [ "${FRONTIER:-0}" = 1 ]; then
    for amp in "" --autocast; do
        timeout "${FRONTIER_TIMEOUT:-240}" python benchmarks/frontier.py --device cuda $amp --seeds 0 \
            --methods "${FRONTIER_METHODS:-jumprelu_tanh,topk,batchtopk}" --work /tmp/frontier_gpu \
            --out "$OUT/frontier_cuda${amp:+_bf16}" 2>&1 | tail -25 | tee -a "$OUT/frontier.txt"
    done
fi
