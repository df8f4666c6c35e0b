#!/usr/bin/env bash
# The prefill stage on the GPU machine (device tool): pages prefilled on the vision stage's
# second thread with a second decoder session, concurrently with the decode steps, against
# prefilled between decode steps on the engine's thread (`--prefill-stage on|off`; same binary,
# same graphs, CUDA graphs and the vision stage on). STEP=parity: the fixture's CUDA parity
# through the engine both ways (batch 3, so pages prefill while others decode;
# scripts/gpu/check_golden.py). STEP=bench: the dummy full-size model (fp16 GQA, A4 page)
# benchmarked both ways in turn (ROUNDS), then, with SERVE=1, `serve --profile 16gb` under load
# both ways (scripts/gpu/gpu_serve_check.sh). Results to $OUT.
# Needs ONNX Runtime's GPU parts and ocrctl.zst as for scripts/gpu/gpu_compare.sh.
# Knobs: STEP (parity bench), VARIANTS (off on), BATCHES (1,8,32,64,128), NEW_TOKENS (1024),
# PER_SLOT (1), ROUNDS (1), SERVE (1), SERVE_BATCHES (8), TAIL (9: lines of each bench shown).
set -uo pipefail
OUT=${OUT:-/tmp/out}
. scripts/gpu/gpu_env.sh
for step in ${STEP:-parity bench}; do
if [ "$step" = parity ]; then
  FX=tests/fixtures/tiny-lightonocr
  M=/tmp/fixture-export
  rm -rf $M
  $BIN export --checkpoint $FX/checkpoint --out $M --precision fp16 >/dev/null
  for v in ${VARIANTS:-off on}; do
    echo "== fixture, gqa fp16, CUDA graphs on, prefill stage $v"
    $BIN ocr --model $M --decoder gqa --precision fp16 --providers cuda --strict-providers \
      --cuda-graphs on --prefill-stage $v --max-tokens 40 --ignore-eos --temperature 0 --top-logprobs 5 \
      --json --quiet --batch-size 3 $FX/images/* 2>"$OUT/fixture-$v.log" | tee "$OUT/fixture-$v.jsonl" \
      | python3 scripts/gpu/check_golden.py $FX/golden/golden.json 0.05 || echo "PARITY FAILED ($v)"
    grep -iE "graphs|stage" "$OUT/fixture-$v.log" | head -3
  done
  python3 - "$OUT" <<'PY'
import glob, json, sys
runs = {f: [json.loads(l) for l in open(f)] for f in sorted(glob.glob(f"{sys.argv[1]}/fixture-*.jsonl"))}
base = next(iter(runs.values()))
for f, r in runs.items():
    same = sum(x.get("text") == y.get("text") for x, y in zip(base, r))
    print(f"{f}: {same}/{len(base)} pages read as the first variant")
PY
fi
if [ "$step" = bench ]; then
  D=/tmp/dummy
  [ -f $D/onnx/decoder_model_gqa_fp16.onnx ] || $BIN export --checkpoint dummy:lightonocr-2-1b \
    --out $D --precision fp16 --decoder gqa --force >/dev/null 2>&1
  for round in $(seq 1 "${ROUNDS:-1}"); do
    for v in ${VARIANTS:-off on}; do
      echo "== bench, prefill stage $v, round $round"
      $BIN bench --model $D --precision fp16 --decoder gqa --providers cuda --strict-providers \
        --cuda-graphs on --prefill-stage $v --sizes 1092x1540 --new-tokens "${NEW_TOKENS:-1024}" \
        --runs 1 --batch-sizes "${BATCHES:-1,8,32,64,128}" --pages-per-slot "${PER_SLOT:-1}" \
        --json-out "$OUT/bench-$v-$round.json" 2>&1 | tee "$OUT/bench-$v-$round.txt" | tail -"${TAIL:-9}"
    done
  done
  if [ "${SERVE:-1}" = 1 ]; then
    OUT="$OUT/serve" BATCHES="${SERVE_BATCHES:-8}" GRAPHS=on PREFILL="${VARIANTS:-off on}" \
      T="${NEW_TOKENS:-1024}" bash scripts/gpu/gpu_serve_check.sh 2>&1 | tail -12
  fi
fi
done
