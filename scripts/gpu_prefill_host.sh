#!/usr/bin/env bash
# The prefill's host side on the GPU machine (device tool): build A (ocrctl-a.zst: the whole
# prompt embedded, features and embeddings converted one value at a time) against this build
# (ocrctl.zst: only the text ids embedded, slice conversions), A, B, A, B on the same
# GPU. Phase rows (vision, prefill and its host part, TTFT; medians of RUNS) and the batch
# sweep (BATCHES, NEW_TOKENS, CUDA graphs on). Results to $OUT/results.tgz.
# Needs ONNX Runtime's GPU parts, ocrctl.zst and ocrctl-a.zst as for scripts/gpu_ab.sh.
# Knobs: PREC (fp16), RUNS (5), BATCHES (32,128), NEW_TOKENS (1024), PARITY (1: first run
# scripts/gpu_parity.sh on this build).
set -uo pipefail
OUT=${OUT:-/tmp/out}
. scripts/gpu_env.sh
R=/tmp/gpu-res
mkdir -p "$R"
P=${PREC:-fp16}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$R/gpu.txt"
if [ "${PARITY:-1}" = 1 ]; then
  bash scripts/gpu_parity.sh > "$R/parity.txt" 2>&1 && echo "parity: ok" || echo "PARITY FAILED"
  grep -E "^==|max|FAIL|differ" "$R/parity.txt" | head -30
fi
A=$(ocrctl_bin ocrctl-a.zst ocrctl-a)
for v in a b; do
  bin=$BIN; [ $v = a ] && bin=$A
  [ -d /tmp/dummy-$v ] || $bin export --checkpoint dummy:lightonocr-2-1b --out /tmp/dummy-$v \
    --precision "$P" --decoder gqa >/dev/null 2>&1 || echo "export $v FAILED"
done
for round in 1 2; do
  for v in a b; do
    bin=$BIN; [ $v = a ] && bin=$A
    echo "== $v round $round"
    # Phase rows (8 new tokens: the phase decode takes every step's logits to the host), then
    # the sweep.
    $bin bench --model /tmp/dummy-$v --precision "$P" --decoder gqa --providers cuda \
      --strict-providers --cuda-graphs on --sizes 1092x1540,1540x1540 --new-tokens 8 \
      --runs "${RUNS:-5}" --batch-sizes 1 --json-out "$R/phase-$v-$round.json" \
      > "$R/phase-$v-$round.txt" 2>&1
    grep -E "^ +(size|[0-9]+x[0-9]+ )" "$R/phase-$v-$round.txt"
    $bin bench --model /tmp/dummy-$v --precision "$P" --decoder gqa --providers cuda \
      --strict-providers --cuda-graphs on --sizes 1092x1540 --new-tokens "${NEW_TOKENS:-1024}" \
      --runs 1 --batch-sizes "${BATCHES:-32,128}" --json-out "$R/sweep-$v-$round.json" \
      > "$R/sweep-$v-$round.txt" 2>&1
    grep -E "^ +(batch|[0-9]+ +[0-9]+ )" "$R/sweep-$v-$round.txt"
    tar czf "$OUT/results.tgz.part" -C "$R" . && mv "$OUT/results.tgz.part" "$OUT/results.tgz"
  done
done
