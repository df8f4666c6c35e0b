#!/usr/bin/env bash
# Vision encoder A/B on the GPU machine in one call (issue 9.4): two ocrctl builds (A:
# .ortgpu/ocrctl-a.zst, B: .ortgpu/ocrctl.zst) each export the dummy full-size model (fp16, GQA
# decoder) and bench vision ms and TTFT on an A4 page and 1540×1540, alternating A, B, A, B so
# drift shows; then ONNX Runtime's profiler with CUDA_LAUNCH_BLOCKING=1 (a node's span is its
# GPU time plus a launch) summarises each build's vision encoder per operator; then the
# fixture's CUDA parity with B (scripts/gpu_parity.sh). Results to $OUT.
# Needs ONNX Runtime's GPU parts in /opt/ortparts as for scripts/gpu_env.sh.
# Knobs: PREC (fp16), SIZES (1092x1540,1540x1540), RUNS (7), ROUNDS (2), PROFILE (1), PARITY (1).
set -uo pipefail
OUT=${OUT:-/tmp/out}
. scripts/gpu_env.sh
A=$(ocrctl_bin ocrctl-a.zst ocrctl-a)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
P=${PREC:-fp16}
for v in a b; do
  bin=$BIN; [ $v = a ] && bin=$A
  PREC=$P export_with vision-$v "$bin"
done
bench() { # bench VARIANT BIN [env...]: vision ms and TTFT, batch 1, two new tokens
  local v=$1 bin=$2; shift 2
  env "$@" "$bin" bench --model /tmp/dummy-vision-$v --precision "$P" --decoder gqa \
    --providers cuda --strict-providers --sizes "${SIZES:-1092x1540,1540x1540}" --new-tokens 2 \
    --runs "${RUNS:-7}" --batch-sizes 1
}
for round in $(seq "${ROUNDS:-2}"); do
  for v in a b; do
    bin=$BIN; [ $v = a ] && bin=$A
    echo "== $v, round $round"
    bench $v "$bin" >"$OUT/bench-$v-$round.txt" 2>&1
    grep -A3 -E "vision ms|TTFT" "$OUT/bench-$v-$round.txt" | head -12
  done
done
for v in $([ "${PROFILE:-1}" = 1 ] && echo a b); do
  bin=$BIN; [ $v = a ] && bin=$A
  rm -rf /tmp/prof-$v && mkdir -p /tmp/prof-$v
  RUNS=3 SIZES=1092x1540 bench $v "$bin" CUDA_LAUNCH_BLOCKING=1 OCRCTL_ORT_PROFILE=/tmp/prof-$v/ \
    >/dev/null 2>&1
  echo "== $v, vision encoder per operator (CUDA_LAUNCH_BLOCKING=1)"
  python3 scripts/ort_profile_summary.py /tmp/prof-$v/vision_encoder*.json --top 12 --skip-runs 1 \
    | tee "$OUT/vision-profile-$v.txt"
  python3 scripts/ort_profile_summary.py /tmp/prof-$v/decoder*.json --top 12 --skip-runs 0 --prefill \
    | tee "$OUT/prefill-profile-$v.txt"
done
[ "${PARITY:-1}" = 1 ] || exit 0
echo "== fixture parity, B"
bash scripts/gpu_parity.sh 2>&1 | tee "$OUT/parity.txt" || echo "PARITY FAILED" | tee -a "$OUT/parity.txt"
