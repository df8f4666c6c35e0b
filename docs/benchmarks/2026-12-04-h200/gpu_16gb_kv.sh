#!/usr/bin/env bash
# `serve --profile 16gb` with an fp16 and an fp8 KV cache in one call (issue 9: the 8-bit cache
# had not been measured in the 16 GB profile), after the fixture's CUDA parity
# (scripts/gpu/gpu_parity.sh). The dummy full-size model at int4-fp16 (the profile's precision),
# exported twice (`--kv-cache auto`, `--kv-cache fp8`); each runs scripts/gpu/gpu_serve_check.sh's
# load (A4 chat requests, 1024 new tokens, 16 clients, CUDA graphs on) at the batch sizes in
# BATCHES. Results (parity, load.jsonl lines, /metrics) to $OUT.
# Needs ONNX Runtime's GPU parts and ocrctl.zst in /opt/ortparts as for scripts/gpu/gpu_env.sh.
# Knobs: BATCHES (8), N (32 requests), T (1024), PARITY (1).
set -uo pipefail
OUT=${OUT:-/tmp/out}
. scripts/gpu/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
if [ "${PARITY:-1}" = 1 ]; then
  bash scripts/gpu/gpu_parity.sh > "$OUT/parity.txt" 2>&1 || echo "PARITY FAILED" >> "$OUT/parity.txt"
  grep -E "^==|FAIL" "$OUT/parity.txt"
fi
for kv in auto fp8; do
  M=/tmp/dummy-q4-$kv
  [ -d $M ] || $BIN export --checkpoint dummy:lightonocr-2-1b --out $M --precision int4-fp16 \
    --kv-cache $kv 2>&1 | tail -1
  echo "== 16gb profile, KV cache $kv"
  MODEL=$M OUT="$OUT/serve-$kv" BATCHES="${BATCHES:-8}" GRAPHS=on T="${T:-1024}" \
    bash scripts/gpu/gpu_serve_check.sh 2>&1 | grep -E "^\{|gpu_memory|resident" | head -8
done
