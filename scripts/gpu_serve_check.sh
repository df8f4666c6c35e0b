#!/usr/bin/env bash
# `ocrctl serve --profile 16gb` on the GPU machine (device tool) with the dummy full-size model
# at int4-fp16: the provider fallback line (no TensorRT there), then a bounded load run of
# A4-page chat requests at batch 1 and at the profile's batch (6), and /metrics (GPU memory,
# TTFT, tokens). Carry target/release/ocrctl and out/a4.png (a 1092x1540 page).
set -euo pipefail
OUT=${OUT:-/tmp/out}
export OCRCTL_ORT_LIB=/opt/ortgpu/onnxruntime/capi/libonnxruntime.so.1.31.1
BIN=./target/release/ocrctl
M=/tmp/dummy-q4
[ -f $M/onnx/decoder_model_merged_q4f16.onnx ] || $BIN export --checkpoint dummy:lightonocr-2-1b --out $M --precision int4-fp16 --force 2>&1 | tail -1
for b in 1 6; do
  $BIN serve --model $M --profile 16gb --port 18080 --batch-size $b --queue-size 1000 2>"$OUT/serve-b$b.log" &
  pid=$!
  until curl -sf localhost:18080/health >/dev/null; do sleep 0.2; done
  python3 scripts/load.py --url http://127.0.0.1:18080 --image out/a4.png --requests ${N:-48} \
    --concurrency 12 --max-tokens ${T:-64} --json | sed "s/^{/{\"batch\": $b, /" | tee -a "$OUT/load.jsonl"
  curl -s localhost:18080/metrics | grep -E "^ocrctl_(gpu|resident|generated|time_to_first_token_seconds_(sum|count)|requests_total)" | tee "$OUT/metrics-b$b.txt"
  kill -TERM $pid; wait $pid || true
  grep -v "^\s*$" "$OUT/serve-b$b.log" | grep -v "W:onnxruntime" | head -8
done
