#!/usr/bin/env bash
# The tiny fixture on the GPU (CUDA provider) against the transformers goldens, for each decoder
# and 16/32-bit precision the CUDA kernels run: greedy ids exact and top-5 log-probabilities
# within the parity tests' tolerances (scripts/gpu/check_golden.py). The GQA decoder runs CUDA's
# GroupQueryAttention kernels (fp16 only on CUDA), which CI's CPU runs cannot check.
# Needs ONNX Runtime's GPU parts and ocrctl in /opt/ortparts, as for scripts/gpu/gpu_compare.sh.
# Greedy (`--temperature 0`): `ocr` otherwise samples as the checkpoint's generation_config.json
# says (the fixture's, like LightOnOCR's: temperature 0.2), which picks the second token at
# the fixture's near-ties now and then. The images are the reference's own
# (scripts/gpu/golden_images.py: the JPEG as Pillow decoded it, since ocrctl's decode differs by up
# to 4 levels, which alone moves the photo's log-probabilities by 0.0035, on the CPU too).
# The paged decoder (its own fp16 export) runs the same checks, then once more on a pool of two
# blocks of 128 for five pages (a profile of 256 positions a page and almost no KV budget): pages
# wait for blocks and are preempted and recomputed, and their ids must not change.
# Knobs: BIN (/opt/ortparts/ocrctl).
set -euo pipefail
. scripts/gpu/gpu_env.sh
FX=tests/fixtures/tiny-lightonocr
M=/tmp/fixture-export
rm -rf $M
$BIN export --checkpoint $FX/checkpoint --out $M --precision fp32,fp16 >/dev/null
python3 scripts/gpu/golden_images.py /tmp/golden-images >/dev/null
status=0
# The fields: decoder, precision, tolerance, top-5 log-probabilities asked for (logits to the
# host) or not (greedy ids chosen on the GPU by the GQA graph's argmax), CUDA graphs for the
# decode steps (GQA only) off or on, and the prefill stage (GQA only; off when not given).
for run in "gqa fp16 0.05 5 off" "gqa fp16 0.05 0 off" "gqa fp16 0.05 5 on" "gqa fp16 0.05 0 on" \
  "gqa fp16 0.05 5 on on" "merged fp16 0.05 5 off" "merged fp32 0.001 5 off"; do
  set -- $run
  echo "== $1 decoder, $2, CUDA (tolerance $3, top-logprobs $4, CUDA graphs $5, prefill stage ${6:-off})"
  $BIN ocr --model $M --decoder "$1" --precision "$2" --providers cuda --strict-providers \
    --cuda-graphs "$5" --prefill-stage "${6:-off}" --max-tokens 40 --ignore-eos --temperature 0 --top-logprobs "$4" --json \
    --quiet --batch-size 5 /tmp/golden-images/* 2>/dev/null \
    | python3 scripts/gpu/check_golden.py $FX/golden/golden.json "$3" || status=1
done
MP=/tmp/fixture-export-paged
rm -rf $MP
$BIN export --checkpoint $FX/checkpoint --out $MP --precision fp16 --decoder gqa,paged >/dev/null
for run in "0.05 5 off" "0.05 0 off" "0.05 5 on" "0.05 0 on"; do
  set -- $run
  echo "== paged decoder, fp16, CUDA (tolerance $1, top-logprobs $2, CUDA graphs $3)"
  $BIN ocr --model $MP --decoder paged --precision fp16 --providers cuda --strict-providers \
    --cuda-graphs "$3" --max-tokens 40 --ignore-eos --temperature 0 --top-logprobs "$2" --json \
    --quiet --batch-size 5 /tmp/golden-images/* 2>/dev/null \
    | python3 scripts/gpu/check_golden.py $FX/golden/golden.json "$1" || status=1
done
# Preemption: 15 pages (the five images three times) at batch 15, 150 tokens each, on a pool of
# one longest page (max_sequence_length 3200: 25 blocks of 128) against the default pool: pages
# wait and are preempted and recomputed, and their ids must equal the ample pool's.
rm -rf /tmp/pages15 && mkdir -p /tmp/pages15
for i in 1 2 3; do for f in /tmp/golden-images/*; do cp "$f" "/tmp/pages15/$i-$(basename "$f")"; done; done
sed -e 's/^name: .*/name: paged-tight/' -e 's/^precision: .*/precision: fp16/' \
  -e 's/^providers: .*/providers: [cuda, cpu]/' -e 's/^max_batch_size: .*/max_batch_size: 15/' \
  -e 's/^max_sequence_length: .*/max_sequence_length: 3200/' -e 's/^kv_cache_gb: .*/kv_cache_gb: 0.0001/' \
  -e 's/^default_max_new_tokens: .*/default_max_new_tokens: 150/' \
  -e 's/^max_new_tokens_limit: .*/max_new_tokens_limit: 150/' profiles/16gb.yaml > /tmp/paged-tight.yaml
common=(ocr --model $MP --decoder paged --precision fp16 --providers cuda --strict-providers
  --cuda-graphs on --max-tokens 150 --ignore-eos --temperature 0 --json --quiet --batch-size 15)
echo "== paged decoder, 15 pages at batch 15: a pool of 25 blocks against the default pool"
# A failed page (exit 2) or a crash is reported with its error, not silently ended by `set -e`.
for pool in ample tight; do
  extra=() && [ $pool = tight ] && extra=(--profile /tmp/paged-tight.yaml)
  RUST_LOG=warn,ocrctl=debug $BIN "${common[@]}" "${extra[@]}" /tmp/pages15/* \
    2>/tmp/paged-$pool.log > /tmp/paged-$pool.jsonl || { echo "$pool pool: exit $?"; status=1; }
  grep -E "^error|refused|panicked" /tmp/paged-$pool.log | cut -c1-240 | head -5 || true
done
grep -E "KV pool" /tmp/paged-tight.log | head -1
echo "preemptions: $(grep -c 'preempted: the paged KV cache is full' /tmp/paged-tight.log)"
python3 - /tmp/paged-ample.jsonl /tmp/paged-tight.jsonl <<'PY' || status=1
import json, sys
ids = [{json.loads(l)["file"]: json.loads(l)["token_ids"] for l in open(p) if l.startswith("{")}
       for p in sys.argv[1:]]
same = sum(ids[0][f] == ids[1].get(f) for f in ids[0])
for f in sorted(ids[0]):
    a, b = ids[0][f], ids[1].get(f) or []
    d = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if a != b:
        print(f"{f}: first difference at step {d} ({len(a)} / {len(b)} tokens)")
print(f"{same} of {len(ids[0])} pages with the same ids on the tight pool")
sys.exit(0 if same == len(ids[0]) == 15 else 1)
PY
exit $status
