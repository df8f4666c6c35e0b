#!/usr/bin/env bash
# The vision stage on the GPU machine, one call (issue 9.4): the fixture's CUDA parity through
# the engine with the stage (scripts/gpu/check_golden.py, as scripts/gpu/gpu_parity.sh), then the dummy
# full-size model benchmarked with `--vision-stage off` and `on` alternately, CUDA graphs on
# (same binary, same graphs). Results to $OUT.
# Needs ONNX Runtime's GPU parts and ocrctl.zst as for docs/benchmarks/2026-12-01-cudagraphs/gpu_graphs.sh.
# Knobs: SIZES (1092x1540), BATCHES (1,8,32,64,128), NEW_TOKENS (1024), PER_SLOT (1: pages per
# sweep point as a multiple of the batch), ROUNDS (1).
set -uo pipefail
OUT=${OUT:-/tmp/out}
. scripts/gpu/gpu_env.sh
FX=tests/fixtures/tiny-lightonocr
M=/tmp/fixture-export
rm -rf $M
$BIN export --checkpoint $FX/checkpoint --out $M --precision fp16 >/dev/null
for v in off on; do
  echo "== fixture, gqa fp16, CUDA graphs on, vision stage $v"
  $BIN ocr --model $M --decoder gqa --precision fp16 --providers cuda --strict-providers \
    --cuda-graphs on --vision-stage $v --max-tokens 40 --ignore-eos --temperature 0 --top-logprobs 5 \
    --json --quiet --batch-size 3 $FX/images/* 2>"$OUT/fixture-$v.log" | tee "$OUT/fixture-$v.jsonl" \
    | python3 scripts/gpu/check_golden.py $FX/golden/golden.json 0.05 || echo "PARITY FAILED (stage $v)"
done
python3 - "$OUT" <<'PY'
import json, sys
o = sys.argv[1]
a = [json.loads(l) for l in open(f"{o}/fixture-off.jsonl")]
b = [json.loads(l) for l in open(f"{o}/fixture-on.jsonl")]
same = sum(x.get("text") == y.get("text") for x, y in zip(a, b))
print(f"{same}/{len(a)} pages read the same with and without the vision stage")
PY
[ -d /tmp/dummy ] || $BIN export --checkpoint dummy:lightonocr-2-1b --out /tmp/dummy --precision fp16 --decoder gqa >/dev/null 2>&1
for round in $(seq 1 "${ROUNDS:-1}"); do
  for v in off on; do
    echo "== bench, vision stage $v, round $round"
    $BIN bench --model /tmp/dummy --precision fp16 --decoder gqa --providers cuda --strict-providers \
      --cuda-graphs on --vision-stage $v --sizes "${SIZES:-1092x1540}" --new-tokens "${NEW_TOKENS:-1024}" \
      --runs 1 --batch-sizes "${BATCHES:-1,8,32,64,128}" --pages-per-slot "${PER_SLOT:-1}" \
      --json-out "$OUT/bench-$v-$round.json" 2>&1 | tee "$OUT/bench-$v-$round.txt" | tail -9
  done
done
