#!/usr/bin/env bash
# Runs on the GPU machine (device tool), after the ONNX Runtime GPU parts were copied to
# /opt/ortparts (see ../shared/GPU.md): unpacks ONNX Runtime, exports the dummy full-size
# model, and benchmarks it with the CUDA provider (no CPU fallback). Results go to $OUT.
# Carry: target/release/ocrctl.
set -euo pipefail
OUT=${OUT:-/tmp/out}
BIN=./target/release/ocrctl
. scripts/gpu/gpu_env.sh
M=/tmp/dummy
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
[ -d $M ] || $BIN export --checkpoint dummy:lightonocr-2-1b --out $M --precision ${PRECISIONS:-fp16,int4-fp16} 2>&1 | tail -8 | tee "$OUT/export.txt"
for p in ${BENCH_PRECISIONS:-fp16 int4-fp16}; do
  $BIN bench --model $M --precision $p --providers cuda,cpu \
    --sizes ${SIZES:-1092x1540,544x768} --new-tokens ${NEW_TOKENS:-64} --runs ${RUNS:-3} \
    --batch-sizes ${BATCHES:-1,4,8} 2>&1 | tee "$OUT/bench-$p.txt"
done
