#!/usr/bin/env bash
# CUDA graphs for GQA decode steps on the GPU machine, one call (issue 9): the fixture's CUDA
# parity with graphs off and on (scripts/gpu/check_golden.py, as scripts/gpu/gpu_parity.sh), the
# greedy text of both compared, then the dummy full-size model benchmarked with
# `--cuda-graphs off` and `on` alternately (same binary, same graphs). Results to $OUT.
# Needs ONNX Runtime's GPU parts and ocrctl.zst as for scripts/gpu/gpu_ab.sh.
# Knobs: SIZES (1092x1540), BATCHES (1,8,32,64), NEW_TOKENS (512), ROUNDS (1).
set -uo pipefail
OUT=${OUT:-/tmp/out}
. scripts/gpu/gpu_env.sh
FX=tests/fixtures/tiny-lightonocr
M=/tmp/fixture-export
rm -rf $M
$BIN export --checkpoint $FX/checkpoint --out $M --precision fp16 >/dev/null
for g in off on; do
  for k in 5 0; do
    echo "== fixture, gqa fp16, CUDA graphs $g, top-logprobs $k"
    RUST_LOG=ocrctl=info $BIN ocr --model $M --decoder gqa --precision fp16 --providers cuda --strict-providers \
      --cuda-graphs $g --max-tokens 40 --ignore-eos --temperature 0 --top-logprobs $k --json --quiet \
      --batch-size 5 $FX/images/* 2>"$OUT/fixture-$g-$k.log" | tee "$OUT/fixture-$g-$k.jsonl" \
      | python3 scripts/gpu/check_golden.py $FX/golden/golden.json 0.05 || echo "PARITY FAILED ($g, $k)"
    grep -i "graph" "$OUT/fixture-$g-$k.log" | head -3
  done
done
python3 - "$OUT" <<'PY'
import json, sys
o = sys.argv[1]
for k in ("5", "0"):
    a = [json.loads(l) for l in open(f"{o}/fixture-off-{k}.jsonl")]
    b = [json.loads(l) for l in open(f"{o}/fixture-on-{k}.jsonl")]
    same = sum(x.get("text") == y.get("text") for x, y in zip(a, b))
    print(f"top-logprobs {k}: {same}/{len(a)} pages read the same with and without CUDA graphs")
PY
[ -d /tmp/dummy ] || $BIN export --checkpoint dummy:lightonocr-2-1b --out /tmp/dummy --precision fp16 --decoder gqa >/dev/null 2>&1
for round in $(seq 1 "${ROUNDS:-1}"); do
  for g in off on; do
    echo "== bench, CUDA graphs $g, round $round"
    $BIN bench --model /tmp/dummy --precision fp16 --decoder gqa --providers cuda --strict-providers \
      --cuda-graphs $g --sizes "${SIZES:-1092x1540}" --new-tokens "${NEW_TOKENS:-512}" --runs 1 \
      --batch-sizes "${BATCHES:-1,8,32,64}" --json-out "$OUT/bench-$g-$round.json" 2>&1 \
      | tee "$OUT/bench-$g-$round.txt" | tail -9
  done
done
