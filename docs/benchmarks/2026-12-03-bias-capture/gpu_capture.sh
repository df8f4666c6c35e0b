#!/usr/bin/env bash
# CUDA graph captures and the stages' threads, on the GPU machine (device tool). The fixture
# (fp16 GQA, CUDA graphs on, vision and prefill stages on, 5 pages at batch 5, 40 tokens past
# EOS, seeded sampling with penalties, a logit bias and every step's full logits: the setting
# in which two pages failed on 2026-12-03 with "operation not permitted when stream is
# capturing") read RUNS times by build A (.ortgpu/ocrctl-a.zst, captures left to the first
# decode steps) and by this build (captures at load, under the capture lock); then one run of
# this build with OCRCTL_ORT_LOG=info, whose ONNX Runtime lines show when the CUDA provider
# captures. Results in $OUT/results.tgz. Knobs: RUNS (6).
set -uo pipefail
OUT=${OUT:-/tmp/out}
. scripts/gpu/gpu_env.sh
results_dir
FX=tests/fixtures/tiny-lightonocr
A=$(ocrctl_bin ocrctl-a.zst ocrctl-a)
ARGS="--decoder gqa --precision fp16 --providers cuda --strict-providers --cuda-graphs on \
  --prefill-stage on --json --batch-size 5 --max-tokens 40 --ignore-eos --temperature 0.2 \
  --top-p 0.9 --seed 9 --repetition-penalty 1.2 --presence-penalty 0.5 --top-logprobs 65"
for v in a b; do
  bin=$BIN; [ $v = a ] && bin=$A
  rm -rf /tmp/fixture-$v
  $bin export --checkpoint $FX/checkpoint --out /tmp/fixture-$v --precision fp16 >/dev/null
  failed=0
  for i in $(seq "${RUNS:-6}"); do
    # shellcheck disable=SC2086
    $bin ocr --model /tmp/fixture-$v $ARGS $FX/images/* </dev/null >"$R/capture-$v-$i.jsonl" \
      2>"$R/capture-$v-$i.log"
    n=$(grep -c . "$R/capture-$v-$i.jsonl")
    [ "$n" = 5 ] || failed=$((failed + 1))
    echo "$v run $i: $n of 5 pages; $(grep -o 'operation not permitted[^;]*' "$R/capture-$v-$i.log" | head -1)"
  done
  echo "== $v: $failed of ${RUNS:-6} runs lost pages"
done
OCRCTL_ORT_LOG=info $BIN ocr --model /tmp/fixture-b $ARGS $FX/images/* </dev/null \
  >"$R/capture-log.jsonl" 2>"$R/capture-log.txt"
echo "== this build's log, lines about graphs, in order:"
grep -inE "cuda graph|captur" "$R/capture-log.txt" | cut -c1-160 | head -30
pack_results
