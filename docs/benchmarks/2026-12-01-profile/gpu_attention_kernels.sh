#!/usr/bin/env bash
# Which attention kernel ONNX Runtime's CUDA MultiHeadAttention picks for the vision encoder,
# and the vision time under each kernel ONNX Runtime can be steered to by its environment
# switches (issue 9.4). The dummy full-size model, fp16, one A4 page. Results to $OUT.
# Needs ONNX Runtime's GPU parts and ocrctl.zst as for docs/benchmarks/2026-12-01-cudagraphs/gpu_graphs.sh.
set -uo pipefail
OUT=${OUT:-/tmp/out}
. scripts/gpu/gpu_env.sh
M=/tmp/dummy-fp16
[ -d $M ] || $BIN export --checkpoint dummy:lightonocr-2-1b --out $M --precision fp16 --decoder gqa 2>&1 | tail -1
for cfg in default ORT_DISABLE_FLASH_ATTENTION=1 ORT_DISABLE_MEMORY_EFFICIENT_ATTENTION=1 \
  "ORT_DISABLE_FLASH_ATTENTION=1 ORT_DISABLE_MEMORY_EFFICIENT_ATTENTION=1" \
  ORT_ENABLE_CUDNN_FLASH_ATTENTION=1 ORT_DISABLE_TRT_FLASH_ATTENTION=1; do
  echo "== $cfg"
  env $([ "$cfg" = default ] || echo $cfg) ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO=1 \
    $BIN bench --model $M --precision fp16 --decoder gqa --providers cuda --strict-providers \
    --sizes 1092x1540,1540x1540 --new-tokens 2 --runs 5 --batch-sizes 1 >"$OUT/run.txt" 2>&1
  grep -i "sdpa\|kernel=" "$OUT/run.txt" | sort | uniq -c | head -4
  grep -A3 "vision ms" "$OUT/run.txt"
done
