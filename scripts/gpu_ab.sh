#!/usr/bin/env bash
# A/B on the GPU machine in one call: `ocrctl doctor`, the fixture's CUDA parity
# (scripts/gpu_parity.sh), then the dummy full-size model exported and benchmarked by two
# ocrctl builds (A: /opt/ortparts/ocrctl-a, B: /opt/ortparts/ocrctl, each exporting its own
# graphs) with the same bench settings, alternating A, B, A, B so drift shows. Results to $OUT.
# Knobs: PREC (fp16), DEC (gqa), SIZES (1092x1540), BATCHES (1,32,128), NEW_TOKENS (1024).
set -euo pipefail
OUT=${OUT:-/tmp/out}
. scripts/gpu_env.sh
ocrctl_bin ocrctl-a.zst ocrctl-a >/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
/opt/ortparts/ocrctl doctor 2>&1 | tee "$OUT/doctor.txt"
bash scripts/gpu_parity.sh 2>&1 | tee "$OUT/parity.txt" || echo "PARITY FAILED" | tee -a "$OUT/parity.txt"
P=${PREC:-fp16}
for v in a b; do
  bin=/opt/ortparts/ocrctl; [ $v = a ] && bin=/opt/ortparts/ocrctl-a
  [ -d /tmp/dummy-$v ] || $bin export --checkpoint dummy:lightonocr-2-1b --out /tmp/dummy-$v \
    --precision "$P" --decoder merged,gqa >/dev/null 2>&1
done
for round in 1 2; do
  for v in a b; do
    bin=/opt/ortparts/ocrctl; [ $v = a ] && bin=/opt/ortparts/ocrctl-a
    $bin bench --model /tmp/dummy-$v --precision "$P" --decoder "${DEC:-gqa}" --providers cuda \
      --strict-providers --sizes "${SIZES:-1092x1540}" --new-tokens "${NEW_TOKENS:-1024}" --runs 1 \
      --batch-sizes "${BATCHES:-1,32,128}" --json-out "$OUT/bench-$v-$round.json" 2>&1 \
      | tee "$OUT/bench-$v-$round.txt" | tail -8
  done
done
