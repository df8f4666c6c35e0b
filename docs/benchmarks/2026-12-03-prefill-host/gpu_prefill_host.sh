#!/usr/bin/env bash
# The page's host-side work and the penalties, on the GPU machine (device tool). Steps (STEP,
# in order; each adds its files to $OUT/results.tgz):
#   parity     scripts/gpu/gpu_parity.sh on this build.
#   ab         build A (ocrctl-a.zst) against this build (ocrctl.zst), A, B, A, B: phase rows
#              (vision, prefill and its host part, TTFT; medians of RUNS, 8 new tokens) and,
#              with SWEEP=1, the batch sweep (BATCHES, NEW_TOKENS, CUDA graphs on).
#   penalties  this build's sweep (BATCHES, NEW_TOKENS) greedy, then with presence and
#              frequency penalties (positive: decided from the candidates; negative: the tail
#              bound rises), and with top-5 log-probabilities.
#   shapes     this build's phase rows over pages of seven sizes (2 runs): `first TTFT` is
#              what the first page of each new size pays (kernel plans made per shape; the
#              first size also pays the session's own warm-up); with ONNX Runtime's default
#              attention kernels and with ORT_ENABLE_CUDNN_FLASH_ATTENTION=0.
#   tunable    this build's phase rows with ONNX Runtime's TunableOp on (ORT_CUDA_TUNABLE_OP_*:
#              GEMM algorithms timed at the first run of each shape) and off.
# Needs ONNX Runtime's GPU parts, ocrctl.zst (and ocrctl-a.zst for ab) as for scripts/gpu/gpu_ab.sh.
# Knobs: STEP (parity ab), PREC (fp16), RUNS (5), BATCHES (32,128), NEW_TOKENS (1024), SWEEP (0).
set -uo pipefail
OUT=${OUT:-/tmp/out}
. scripts/gpu/gpu_env.sh
results_dir
# phase NAME BIN MODEL: phase rows of both page sizes, 8 new tokens, medians of RUNS.
phase() {
  $2 bench --model "$3" --precision "$P" --decoder gqa --providers cuda --strict-providers \
    --cuda-graphs on --sizes 1092x1540,1540x1540 --new-tokens 8 --runs "${RUNS:-5}" \
    --batch-sizes 1 --json-out "$R/phase-$1.json" > "$R/phase-$1.txt" 2>&1
  grep -E "^ +(size|[0-9]+x[0-9]+ )" "$R/phase-$1.txt"
}
for step in ${STEP:-parity ab}; do
  echo "=== $step"
  case $step in
  parity)
    bash scripts/gpu/gpu_parity.sh > "$R/parity.txt" 2>&1 && echo "parity: ok" || echo "PARITY FAILED"
    grep -E "^==|max|FAIL|differ" "$R/parity.txt" | head -40
    ;;
  ab)
    A=$(ocrctl_bin ocrctl-a.zst ocrctl-a)
    export_with a "$A"
    export_with b "$BIN"
    for round in 1 2; do
      for v in a b; do
        bin=$BIN; [ $v = a ] && bin=$A
        echo "== $v round $round"
        phase $v-$round $bin /tmp/dummy-$v
        [ "${SWEEP:-0}" = 1 ] && sweep $v-$round $bin /tmp/dummy-$v
      done
    done
    ;;
  penalties)
    export_with b "$BIN"
    while read -r name args; do
      echo "== $name: $args"
      # shellcheck disable=SC2086
      sweep pen-$name $BIN /tmp/dummy-b $args
    done <<'LIST'
greedy
presence-frequency --presence-penalty 0.5 --frequency-penalty 0.3
negative --presence-penalty -0.5 --frequency-penalty -0.3
top5 --top-logprobs 5
LIST
    ;;
  shapes)
    # Twice: ONNX Runtime's default (cuDNN's flash attention, auto-chosen on SM >= 90, whose
    # execution plans are built per shape) and ORT_ENABLE_CUDNN_FLASH_ATTENTION=0 (its own
    # compiled flash-attention kernels).
    export_with b "$BIN"
    for cudnn in default 0; do
      echo "== cuDNN attention: $cudnn"
      env $([ $cudnn = 0 ] && echo ORT_ENABLE_CUDNN_FLASH_ATTENTION=0) \
        $BIN bench --model /tmp/dummy-b --precision "$P" --decoder gqa --providers cuda \
        --strict-providers --cuda-graphs on --new-tokens 8 --runs 2 --batch-sizes 1 \
        --sizes 1092x1540,1540x1092,1200x1540,1000x1400,1540x1540,800x1100,600x840 \
        --json-out "$R/shapes-$cudnn.json" > "$R/shapes-$cudnn.txt" 2>&1
      grep -E "^ +(size|[0-9]+x[0-9]+ )" "$R/shapes-$cudnn.txt"
    done
    ;;
  tunable)
    export_with b "$BIN"
    for round in 1 2; do
      echo "== TunableOp off, round $round"
      phase tunable-off-$round $BIN /tmp/dummy-b
      echo "== TunableOp on, round $round"
      ORT_CUDA_TUNABLE_OP_ENABLE=1 ORT_CUDA_TUNABLE_OP_TUNING_ENABLE=1 \
        phase tunable-on-$round $BIN /tmp/dummy-b
    done
    ;;
  esac
  pack_results
done
