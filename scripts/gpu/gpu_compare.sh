#!/usr/bin/env bash
# One GPU comparison in one go, on the GPU machine (device tool): ocrctl bench of the dummy
# full-size model (A4 1092x1540 and 1540x1540 pages) for each precision and decoder, and the
# transformers reference (scripts/gpu/bench_transformers.py, bf16 SDPA, random weights, same page)
# in the same call; then scripts/gpu/gpu_report.py writes the markdown report and a JSON summary.
#
# Needs: ocrctl built here (`cargo build --release`), zstd-packed to .ortgpu/ocrctl.zst, and the
# ONNX Runtime GPU parts in /opt/ortparts (see ../shared/GPU.md for carrying them), or ONNX
# Runtime already unpacked in /opt/ortgpu. Results go to $OUT and are kept in /tmp/gpu-results
# so that a later call can add to them (the machine stays warm between calls).
# Knobs: PRECISIONS (fp16 int4-fp16), DECODERS (gqa merged), BATCHES (1,8,32,64,128),
# NEW_TOKENS (1024), RUNS (3), TRANSFORMERS (1: run the reference), TF_TOKENS (256),
# TF_BATCHES (1,8), SERVE (1: `serve --profile 16gb` under load, scripts/gpu/gpu_serve_check.sh, at
# SERVE_BATCHES (8) with SERVE_TOKENS (1024) new tokens), REPORT (1: write the report from
# everything in /tmp/gpu-results).
set -euo pipefail
OUT=${OUT:-/tmp/out}
RES=/tmp/gpu-results
mkdir -p "$RES"
. scripts/gpu/gpu_env.sh
M=/tmp/dummy
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$RES/gpu.txt"
if [ ! -f $M/onnx/decoder_model_gqa_q4f16.onnx ]; then
  rm -rf $M
  /usr/bin/time -f "%e s" $BIN export --checkpoint dummy:lightonocr-2-1b --out $M \
    --precision fp16,int4-fp16 --decoder merged,gqa 2>&1 | tail -12 | tee "$RES/export.txt"
fi
for prec in ${PRECISIONS:-fp16 int4-fp16}; do
  for dec in ${DECODERS:-gqa merged}; do
    $BIN bench --model $M --precision "$prec" --decoder "$dec" --providers cuda --strict-providers \
      --sizes 1092x1540,1540x1540 --new-tokens "${NEW_TOKENS:-1024}" --runs "${RUNS:-3}" \
      --batch-sizes "${BATCHES:-1,8,32,64,128}" --json-out "$RES/bench-$prec-$dec.json" 2>&1 \
      | tee "$RES/bench-$prec-$dec.txt"
  done
done
if [ "${TRANSFORMERS:-1}" = 1 ]; then
  python3 scripts/gpu/bench_transformers.py --size 1092x1540 --new-tokens "${TF_TOKENS:-256}" \
    --batches "${TF_BATCHES:-1,8}" > "$RES/transformers.json" 2> "$RES/transformers.err" || true
  tail -3 "$RES/transformers.err"; cat "$RES/transformers.json"
fi
if [ "${SERVE:-1}" = 1 ]; then
  # The 16gb profile under load, on this call's int4-fp16 export.
  MODEL=$M OUT="$RES/serve" BATCHES="${SERVE_BATCHES:-8}" GRAPHS=on T="${SERVE_TOKENS:-1024}" \
    bash scripts/gpu/gpu_serve_check.sh 2>&1 | tail -4 || true
fi
if [ "${REPORT:-1}" = 1 ]; then
  python3 scripts/gpu/gpu_report.py "$RES" > "$RES/report.md"
  cat "$RES/report.md"
fi
cp "$RES"/*.json "$RES"/*.md "$OUT"/ 2>/dev/null || true
