#!/usr/bin/env bash
# Measures the int4 (block 32, QDQ, round-to-nearest, accuracy level 0) greedy tokens of the
# tiny fixture and their agreement with fp32, and writes
# tests/fixtures/tiny-lightonocr/int4_expected.json, which tests/int4.rs asserts against.
# Run after a change that legitimately alters int4 numerics; review the diff it produces.
set -euo pipefail
cd "$(dirname "$0")/.."
FX=tests/fixtures/tiny-lightonocr
cargo build --quiet
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
target/debug/ocrctl export --checkpoint "$FX/checkpoint" --out "$OUT/m" --precision fp32,int4 --block-size 32 >/dev/null
mapfile -t IMAGES < <(python3 -c "import json;[print('$FX/'+i['file']) for i in json.load(open('$FX/golden/golden.json'))['images']]")
for p in fp32 int4; do
  target/debug/ocrctl ocr --model "$OUT/m" --precision $p --accuracy-level 0 --ignore-eos \
    --max-tokens 40 --temperature 0 --json "${IMAGES[@]}" > "$OUT/$p.jsonl"
done
python3 - "$OUT" > "$FX/int4_expected.json" <<'PY'
import json, sys
out = sys.argv[1]
fp32 = [json.loads(l) for l in open(f"{out}/fp32.jsonl")]
int4 = [json.loads(l) for l in open(f"{out}/int4.jsonl")]
rows = []
for a, b in zip(fp32, int4):
    n = 0
    while n < len(a["token_ids"]) and a["token_ids"][n] == b["token_ids"][n]:
        n += 1
    rows.append({"file": b["file"].split("tiny-lightonocr/")[-1], "int4_greedy_ids": b["token_ids"],
                 "agreement_with_fp32": n, "int4_text": b["text"], "fp32_text": a["text"]})
print(json.dumps({"derivation": "scripts/measure_int4_fixture.sh: ocrctl export --precision fp32,int4 --block-size 32 (QDQ, RTN); ocrctl ocr --accuracy-level 0 --ignore-eos --max-tokens 40 --temperature 0",
                  "images": rows}, indent=1))
PY
echo "wrote $FX/int4_expected.json"
