#!/usr/bin/env bash
# KV cache on the GPU (IoBinding): benchmarks the dummy full-size model at fp16 on the CUDA
# provider for batch sizes 1, 4 and 8, once with the KV cache kept in GPU memory (`--kv-path
# bound`, the default) and once copied through host memory every step (`--kv-path host`, the old
# behaviour), and reports decode tokens/s, the process's peak GPU memory and where the cache was.
#
# Runs on the GPU machine (device tool), like scripts/gpu/gpu_bench.sh: build here with
# `cargo build --release`, carry target/release/ocrctl, and have the ONNX Runtime GPU parts in
# /opt/ortparts (see ../shared/GPU.md) or ONNX Runtime already unpacked in /opt/ortgpu.
# Results (tables, JSON, nvidia-smi) go to $OUT. Knobs: KV_PATHS, BATCHES, SIZES, NEW_TOKENS, RUNS.
#
# What to look for: `KV cache: bound path, in Cuda:0 memory (N bound / 0 host decoder runs …)`;
# a line `keeping the KV cache in Cuda memory failed …; falling back to host memory` means the
# device path could not be used (the run still completes on the host path).
set -euo pipefail
OUT=${OUT:-/tmp/out}
BIN=./target/release/ocrctl
. scripts/gpu/gpu_env.sh
M=/tmp/dummy
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
if [ ! -f $M/onnx/decoder_model_merged_fp16.onnx ]; then
  rm -rf $M
  $BIN export --checkpoint dummy:lightonocr-2-1b --out $M --precision fp16 2>&1 | tail -8 | tee "$OUT/export.txt"
fi
for kv in ${KV_PATHS:-bound host}; do
  $BIN bench --model $M --precision fp16 --providers cuda --strict-providers --kv-path "$kv" \
    --sizes ${SIZES:-1092x1540,544x768} --new-tokens ${NEW_TOKENS:-64} --runs ${RUNS:-3} \
    --batch-sizes ${BATCHES:-1,4,8} --json-out "$OUT/kv-$kv.json" 2>&1 | tee "$OUT/kv-$kv.txt"
done
