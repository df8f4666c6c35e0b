#!/usr/bin/env bash
# logit_bias on the GPU machine (device tool), and the largest batch. Steps (STEP, in order;
# each adds its files to $OUT/results.tgz):
#   fixture  the fixture on CUDA (its greedy pages write ids 17, 21, 20 and 23 most often) (fp16 GQA, CUDA graphs on, 5 pages at batch 5, 40 tokens
#            past EOS): for each setting below, the tokens chosen from the device's candidates
#            equal those chosen from the full logits (--top-logprobs 65 takes every step's
#            full logits to the host), and the greedy ban holds (the banned id never appears).
#   sweep    the dummy full-size model's batch sweep (BATCHES, NEW_TOKENS): greedy, greedy
#            with one id banned (-100: decided from the candidates), and greedy with +5 on an
#            id outside them (every row falls back to full logits; at FALLBACK_TOKENS).
#   big      the greedy sweep at BIG_BATCHES (128,256): the largest batch the H200 holds.
# Needs ONNX Runtime's GPU parts and .ortgpu/ocrctl.zst, carried as for scripts/gpu/gpu_ab.sh.
# Knobs: STEP (fixture sweep big), PREC (fp16), BATCHES (128), NEW_TOKENS (1024),
# FALLBACK_TOKENS (128), BIG_BATCHES (128,256), PROVIDERS (cuda) and GRAPHS (on) for the fixture.
set -uo pipefail
OUT=${OUT:-/tmp/out}
. scripts/gpu/gpu_env.sh
results_dir
FX=tests/fixtures/tiny-lightonocr
for step in ${STEP:-fixture sweep big}; do
  echo "=== $step"
  case $step in
  fixture)
    rm -rf /tmp/fixture-bias
    $BIN export --checkpoint $FX/checkpoint --out /tmp/fixture-bias --precision fp16 >/dev/null
    CUDA="--decoder gqa --precision fp16 --providers ${PROVIDERS:-cuda} --strict-providers --cuda-graphs ${GRAPHS:-on} \
      --json --quiet --batch-size 5 --max-tokens 40 --ignore-eos"
    status=0
    while read -r name args; do
      for path in candidates full; do
        # shellcheck disable=SC2086
        $BIN ocr --model /tmp/fixture-bias $CUDA $args </dev/null \
          $([ $path = full ] && echo --top-logprobs 65) $FX/images/* \
          2>"$R/fixture-$name-$path.log" > "$R/fixture-$name-$path.jsonl"
      done
      python3 - "$R/fixture-$name-candidates.jsonl" "$R/fixture-$name-full.jsonl" "$name" \
        "$args" <<'PY' || status=1
import json, re, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 5, (len(a), len(b))
same = sum(x["token_ids"] == y["token_ids"] for x, y in zip(a, b))
banned = [int(m) for m in re.findall(r"(\d+)=-100", sys.argv[4])]
seen = sorted({t for x in a for t in x["token_ids"] if t in banned})
ok = same == 5 and not seen
print(f"{sys.argv[3]}: {same}/5 pages equal through candidates and full logits; "
      f"banned ids written: {seen or 'none'} -> {'ok' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
    done <<'LIST'
ban-greedy --temperature 0 --logit-bias 17=-100,21=-100
mixed-greedy --temperature 0 --logit-bias 19=2.5,16=-1,250=0.7
raise-outside --temperature 0 --logit-bias 300=6
ban-sampled --temperature 0.7 --top-p 0.9 --seed 5 --logit-bias 20=-100,23=-100
penalties-bias --temperature 0.2 --top-p 0.9 --seed 9 --repetition-penalty 1.2 --presence-penalty 0.5 --logit-bias 19=1.5,17=-3
LIST
    [ $status = 0 ] && echo "fixture: all equal" || echo "FIXTURE FAILED"
    ;;
  sweep)
    export_with b "$BIN"
    BATCHES=${BATCHES:-128} sweep greedy "$BIN" /tmp/dummy-b
    BATCHES=${BATCHES:-128} sweep ban "$BIN" /tmp/dummy-b --logit-bias 13=-100
    BATCHES=${BATCHES:-128} NEW_TOKENS=${FALLBACK_TOKENS:-128} sweep greedy-short "$BIN" /tmp/dummy-b
    BATCHES=${BATCHES:-128} NEW_TOKENS=${FALLBACK_TOKENS:-128} sweep raise "$BIN" /tmp/dummy-b \
      --logit-bias 13=5
    ;;
  big)
    export_with b "$BIN"
    BATCHES=${BIG_BATCHES:-128,256} sweep big "$BIN" /tmp/dummy-b
    ;;
  esac
  pack_results
done
