#!/usr/bin/env bash
# ONNX Runtime's profiler on the GPU machine (issue 9: profile before optimising): the dummy
# full-size model's vision encoder, prefill and decode steps for an A4 page, once as run
# (asynchronous launches: host-side spans) and once with CUDA_LAUNCH_BLOCKING=1 (each node
# waits for its kernels, so a node's span is its GPU time plus a launch), each summarised per
# operator by scripts/ort_profile_summary.py. Traces and summaries to $OUT.
# Needs ONNX Runtime's GPU parts and ocrctl.zst as for docs/benchmarks/2026-12-01-cudagraphs/gpu_graphs.sh.
# Knobs: SIZES (1092x1540), PRECISION (fp16), GRAPHS (off: CUDA graphs hide the decode step's
# nodes from the profiler), DECODE_ROWS (0; N profiles decode steps of N rows too).
set -uo pipefail
OUT=${OUT:-/tmp/out}
. scripts/gpu/gpu_env.sh
P=${PRECISION:-fp16}
M=/tmp/dummy-$P
[ -d $M ] || $BIN export --checkpoint dummy:lightonocr-2-1b --out $M --precision $P --decoder gqa 2>&1 | tail -1
command -v nsys >/dev/null && echo "nsys: $(command -v nsys)" || echo "nsys: not installed"
for mode in async blocking; do
  rm -rf /tmp/prof-$mode && mkdir -p /tmp/prof-$mode
  echo "== $mode"
  env $([ $mode = blocking ] && echo CUDA_LAUNCH_BLOCKING=1) OCRCTL_ORT_PROFILE=/tmp/prof-$mode/ \
    $BIN bench --model $M --precision $P --decoder gqa --providers cuda --strict-providers \
    --cuda-graphs "${GRAPHS:-off}" --vision-stage off --sizes "${SIZES:-1092x1540}" --new-tokens 32 \
    --runs 3 --batch-sizes 1 2>&1 | grep -A2 "vision ms"
  python3 scripts/ort_profile_summary.py /tmp/prof-$mode/vision_encoder*.json --top 14 --skip-runs 1 \
    | tee "$OUT/vision-$mode.txt"
  python3 scripts/ort_profile_summary.py /tmp/prof-$mode/decoder*.json --top 14 --skip-runs 4 --decode-rows 1 \
    | tee "$OUT/decoder-$mode.txt"
  python3 scripts/ort_profile_summary.py /tmp/prof-$mode/decoder*.json --top 14 --skip-runs 0 --prefill \
    | tee "$OUT/prefill-$mode.txt"
done
# Decode steps of a full batch (DECODE_ROWS, 0 = skip): where a step's time goes when the KV
# cache, not the launches, should bound it.
R=${DECODE_ROWS:-0}
if [ "$R" -gt 0 ]; then
  rm -rf /tmp/prof-rows && mkdir -p /tmp/prof-rows
  CUDA_LAUNCH_BLOCKING=1 OCRCTL_ORT_PROFILE=/tmp/prof-rows/ $BIN bench --model $M --precision $P \
    --decoder gqa --providers cuda --strict-providers --cuda-graphs off --vision-stage off \
    --sizes "${SIZES:-1092x1540}" --new-tokens 12 --runs 1 --batch-sizes "$R" 2>&1 | tail -3
  python3 scripts/ort_profile_summary.py /tmp/prof-rows/decoder*.json --top 16 --skip-runs 0 \
    --decode-rows "$R" | tee "$OUT/decoder-rows-$R-blocking.txt"
fi
# The blocking vision trace, kept for a closer look (zstd: traces are large).
/opt/ortparts/zstd -q -19 /tmp/prof-blocking/vision_encoder*.json -o "$OUT/vision-blocking.json.zst"
