#!/usr/bin/env bash
# A/B on the GPU machine in one call: `ocrctl doctor`, the fixture's CUDA parity
# (scripts/gpu/gpu_parity.sh), then the dummy full-size model exported and benchmarked by two
# ocrctl builds (A: /opt/ortparts/ocrctl-a, B: /opt/ortparts/ocrctl, each exporting its own
# graphs) with the same bench settings, alternating A, B, A, B so drift shows; optionally
# ONNX Runtime's profiler with CUDA_LAUNCH_BLOCKING=1 (a node's span is its GPU time plus a
# launch) on each build's vision encoder and prefill, per operator. Results to $OUT.
# Knobs: PREC (fp16), DEC (gqa), SIZES (1092x1540), BATCHES (1,32,128), NEW_TOKENS (1024),
# RUNS (1: runs per phase row), ROUNDS (2), PARITY (1), PROFILE (0).
# Vision and time to first token only (docs/benchmarks/2026-12-04-h200/ §3):
#   SIZES=1092x1540,1540x1540 BATCHES=1 NEW_TOKENS=2 RUNS=7 ROUNDS=3 PARITY=0 bash scripts/gpu/gpu_ab.sh
set -euo pipefail
OUT=${OUT:-/tmp/out}
. scripts/gpu/gpu_env.sh
ocrctl_bin ocrctl-a.zst ocrctl-a >/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
/opt/ortparts/ocrctl doctor 2>&1 | tee "$OUT/doctor.txt"
if [ "${PARITY:-1}" = 1 ]; then
  bash scripts/gpu/gpu_parity.sh 2>&1 | tee "$OUT/parity.txt" || echo "PARITY FAILED" | tee -a "$OUT/parity.txt"
fi
P=${PREC:-fp16}
for v in a b; do
  bin=/opt/ortparts/ocrctl; [ $v = a ] && bin=/opt/ortparts/ocrctl-a
  [ -d /tmp/dummy-$v ] || $bin export --checkpoint dummy:lightonocr-2-1b --out /tmp/dummy-$v \
    --precision "$P" --decoder merged,gqa >/dev/null 2>&1
done
# bench_ab V [VAR=value...]: build V's bench of its own export with the knobs' settings
# (JSON: also `--json-out JSON`), under the given environment.
bench_ab() {
  local v=$1 bin=/opt/ortparts/ocrctl; shift
  [ $v = a ] && bin=/opt/ortparts/ocrctl-a
  env "$@" $bin bench --model /tmp/dummy-$v --precision "$P" --decoder "${DEC:-gqa}" \
    --providers cuda --strict-providers --sizes "${SIZES:-1092x1540}" \
    --new-tokens "${NEW_TOKENS:-1024}" --runs "${RUNS:-1}" --batch-sizes "${BATCHES:-1,32,128}" \
    ${JSON:+--json-out "$JSON"}
}
for round in $(seq "${ROUNDS:-2}"); do
  for v in a b; do
    echo "== $v, round $round"
    JSON="$OUT/bench-$v-$round.json" bench_ab $v 2>&1 | tee "$OUT/bench-$v-$round.txt" | tail -8
  done
done
for v in $([ "${PROFILE:-0}" = 1 ] && echo a b); do
  rm -rf /tmp/prof-$v && mkdir -p /tmp/prof-$v
  RUNS=3 bench_ab $v CUDA_LAUNCH_BLOCKING=1 OCRCTL_ORT_PROFILE=/tmp/prof-$v/ >/dev/null 2>&1
  echo "== $v, per operator (CUDA_LAUNCH_BLOCKING=1)"
  python3 scripts/ort_profile_summary.py /tmp/prof-$v/vision_encoder*.json --top 12 --skip-runs 1 \
    | tee "$OUT/vision-profile-$v.txt"
  python3 scripts/ort_profile_summary.py /tmp/prof-$v/decoder*.json --top 12 --skip-runs 0 --prefill \
    | tee "$OUT/prefill-profile-$v.txt"
done
