#!/usr/bin/env bash
# Log-probabilities and repetition penalties from the device's candidates on the GPU machine
# (device tool). Results to $OUT/results.tgz.
#   STEP=parity  scripts/gpu/gpu_parity.sh on this build: its top-5 runs now take their
#                log-probabilities from `top_logits` + `logsumexp` (CUDA TopK and
#                Sub/Exp/ReduceSum, captured in CUDA graphs) instead of the full logits.
#   STEP=greedy-ab  build A (no `logsumexp` output) against this build on greedy rows, A, B, A, B
#                (BATCHES, NEW_TOKENS, CUDA graphs on): what the new output costs every step;
#                BUILDS="a b new" adds ocrctl-b.zst, and so on.
#   STEP=profile    ONNX Runtime's profile of this build's decode steps of ROWS (32) rows.
#   STEP=scored  this build's batch sweep (BATCHES, NEW_TOKENS, CUDA graphs on) with greedy
#                rows, then rows that report 5 top log-probabilities (candidates), 65 (more
#                than the 64 candidates: every step's full logits, the path all
#                log-probabilities took before), a repetition penalty, sampling, and all of it.
# Needs ONNX Runtime's GPU parts, ocrctl.zst and ocrctl-a.zst as for scripts/gpu/gpu_ab.sh.
# Knobs: STEP (parity greedy-ab scored), PREC (fp16), BATCHES (32,128), ROWS (32),
# NEW_TOKENS (1024), VARIANTS (all six of STEP=scored, by name).
set -uo pipefail
OUT=${OUT:-/tmp/out}
. scripts/gpu/gpu_env.sh
results_dir
P=${PREC:-fp16}
for step in ${STEP:-parity greedy-ab scored}; do
case $step in
parity)
  bash scripts/gpu/gpu_parity.sh > "$R/parity.txt" 2>&1 && echo "parity: ok" || echo "PARITY FAILED"
  grep -E "^==|max|FAIL|differ" "$R/parity.txt" | head -40
  ;;
profile)
  # Where a decode step of ROWS rows spends its time in this build's graph (ONNX Runtime's
  # profiler, launch-blocking, CUDA graphs off): ReduceLogSumExp's share is the new cost.
  export_with new "$BIN"
  rm -rf /tmp/prof-b && mkdir -p /tmp/prof-b
  CUDA_LAUNCH_BLOCKING=1 OCRCTL_ORT_PROFILE=/tmp/prof-b/ $BIN bench --model /tmp/dummy-new \
    --precision "$P" --decoder gqa --providers cuda --strict-providers --cuda-graphs off \
    --vision-stage off --sizes 1092x1540 --new-tokens 12 --runs 1 --batch-sizes "${ROWS:-32}" \
    > "$R/profile-b.txt" 2>&1
  python3 scripts/ort_profile_summary.py /tmp/prof-b/decoder*.json --top 16 --skip-runs 0 \
    --decode-rows "${ROWS:-32}" | tee "$R/profile-b-rows-${ROWS:-32}.txt"
  ;;
greedy-ab)
  # Build A (no `logsumexp` output) against this build, greedy rows, A, B, A, B.
  # Builds by name: new = this build (ocrctl.zst), NAME = ocrctl-NAME.zst.
  for v in ${BUILDS:-a new}; do
    [ $v = new ] && continue
    export_with $v "$(ocrctl_bin ocrctl-$v.zst ocrctl-$v)"
  done
  export_with new "$BIN"
  for round in 1 2; do
    for v in ${BUILDS:-a new}; do
      bin=$BIN; [ $v = new ] || bin=/opt/ortparts/ocrctl-$v
      echo "== greedy $v round $round"
      $bin bench --model /tmp/dummy-$v --precision "$P" --decoder gqa --providers cuda \
        --strict-providers --cuda-graphs on --sizes 1092x1540 --new-tokens "${NEW_TOKENS:-1024}" \
        --runs 1 --batch-sizes "${BATCHES:-32,128}" --json-out "$R/greedy-$v-$round.json" \
        > "$R/greedy-$v-$round.txt" 2>&1
      grep -E "^ +(batch|[0-9]+ +[0-9]+ )" "$R/greedy-$v-$round.txt"
    done
  done
  ;;
scored)
  export_with new "$BIN"
  while read -r name args; do
    case " ${VARIANTS:-greedy top5 top65 penalty sampled all} " in *" $name "*) ;; *) continue ;; esac
    echo "== $name: $args"
    # shellcheck disable=SC2086
    $BIN bench --model /tmp/dummy-new --precision "$P" --decoder gqa --providers cuda \
      --strict-providers --cuda-graphs on --sizes 1092x1540 --new-tokens "${NEW_TOKENS:-1024}" \
      --runs 1 --batch-sizes "${BATCHES:-32,128}" $args --json-out "$R/scored-$name.json" \
      > "$R/scored-$name.txt" 2>&1
    grep -E "^ +(batch|[0-9]+ +[0-9]+ )|needed full" "$R/scored-$name.txt"
  done <<'EOF'
greedy
top5 --top-logprobs 5
top65 --top-logprobs 65
penalty --repetition-penalty 1.1
sampled --temperature 0.2 --top-p 0.9
all --temperature 0.2 --top-p 0.9 --repetition-penalty 1.1 --top-logprobs 5
EOF
  ;;
esac
pack_results
done
