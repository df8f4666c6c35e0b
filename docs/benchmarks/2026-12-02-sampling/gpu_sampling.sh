#!/usr/bin/env bash
# Sampling from the device's candidates on the GPU machine, one call (issue 9.3): the
# fixture's greedy CUDA parity with the new decoder outputs bound, seeded sampling on CUDA
# through the candidates against the same requests through full logits (--top-logprobs
# fetches them), then the dummy full-size model benchmarked with sampling through one binary
# on two exports: P (made before the candidates: its decoder has no top_logits, so sampling
# rows copy the full logits to the host, the old path) and B (with them). Results to $OUT.
# Carry ONNX Runtime's GPU parts as for docs/benchmarks/2026-12-01-cudagraphs/gpu_graphs.sh, with .ortgpu/ocrctl.zst (B)
# and .ortgpu/ocrctl-prev.zst (the binary that makes P's export).
# Knobs: BATCHES (1,32,128), NEW_TOKENS (256).
set -uo pipefail
OUT=${OUT:-/tmp/out}
. scripts/gpu/gpu_env.sh
ocrctl_bin ocrctl-prev.zst ocrctl-prev >/dev/null
B=$(ocrctl_bin ocrctl.zst ocrctl-b)
FX=tests/fixtures/tiny-lightonocr
rm -rf /tmp/fixture-b
$B export --checkpoint $FX/checkpoint --out /tmp/fixture-b --precision fp16 >/dev/null
CUDA="--decoder gqa --precision fp16 --providers cuda --strict-providers --json --quiet --batch-size 3 --max-tokens 40 --ignore-eos"
for g in off on; do
  echo "== fixture greedy parity, CUDA graphs $g"
  $B ocr --model /tmp/fixture-b $CUDA --cuda-graphs $g --temperature 0 --top-logprobs 5 $FX/images/* \
    2>"$OUT/greedy-$g.log" | python3 scripts/gpu/check_golden.py $FX/golden/golden.json 0.05 || echo "PARITY FAILED (graphs $g)"
  for path in candidates full; do
    $B ocr --model /tmp/fixture-b $CUDA --cuda-graphs $g --temperature 0.2 --top-p 0.9 --seed 11 \
      $([ $path = full ] && echo --top-logprobs 1) $FX/images/* 2>"$OUT/sample-$g-$path.log" > "/tmp/sample-$g-$path.jsonl"
  done
  python3 - /tmp/sample-$g-candidates.jsonl /tmp/sample-$g-full.jsonl $g <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
same = sum(x.get("text") == y.get("text") for x, y in zip(a, b))
print(f"graphs {sys.argv[3]}: {same}/{len(a)} sampled pages read the same through the candidates and through full logits")
PY
done
/opt/ortparts/ocrctl-prev export --checkpoint dummy:lightonocr-2-1b --out /tmp/dummy-p --precision fp16 --decoder gqa 2>&1 | tail -1
$B export --checkpoint dummy:lightonocr-2-1b --out /tmp/dummy-b --precision fp16 --decoder gqa 2>&1 | tail -1
# name, export, sweep arguments. The old path (P) and the all-fallback case (B without top-k:
# the random weights' logits are flat) are slow; the latter runs at batch 32 only, so the
# call stays within 10 minutes.
while read -r name v batches args; do
  echo "== $name, export $v"
  $B bench --model /tmp/dummy-$v --precision fp16 --decoder gqa --providers cuda --strict-providers \
    --cuda-graphs on --vision-stage on --sizes 1092x1540 --runs 1 --new-tokens "${NEW_TOKENS:-256}" \
    --batch-sizes "$batches" $args --json-out "$OUT/bench-$name-$v.json" 2>&1 \
    | tee "$OUT/bench-$name-$v.txt" | grep -E "sweep samples|^ +[0-9]+ +[0-9]+ +1092"
done <<EOT
greedy p ${BATCHES:-1,32,128} --temperature 0
greedy b ${BATCHES:-1,32,128} --temperature 0
t02p09 p ${BATCHES:-1,32,128} --temperature 0.2 --top-p 0.9
t02p09k50 b ${BATCHES:-1,32,128} --temperature 0.2 --top-p 0.9 --top-k 50
t02p09-b32 b 32 --temperature 0.2 --top-p 0.9
EOT
