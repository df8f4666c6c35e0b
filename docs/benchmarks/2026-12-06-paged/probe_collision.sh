#!/usr/bin/env bash
# Do pages lost to "operation not permitted when stream is capturing" (§3) come from vision
# runs of a size already seen but other than the previous run's (ONNX Runtime's cuDNN
# convolution rebuilds its plan on every change of shape)? The fixture's 15 pages (five sizes,
# interleaved) at batch 15, N runs per vision capture-lock policy (OCRCTL_VISION_ALONE:
# new = alone for a size never run, the default; changed = alone when the size changed).
# Since the requeue (src/generation/engine/requeue.rs) a collision on the paged decoder shows as
# a requeued page (its warning in the log) rather than a lost one.
cd "$(dirname "$0")/../../.." || exit 1
. scripts/gpu/gpu_env.sh
N=${N:-8}
FX=tests/fixtures/tiny-lightonocr MP=/tmp/fixture-export-paged
[ -f $MP/ocrctl.json ] || $BIN export --checkpoint $FX/checkpoint --out $MP --precision fp16 \
  --decoder gqa,paged >/dev/null
[ -d /tmp/golden-images ] || python3 scripts/gpu/golden_images.py /tmp/golden-images >/dev/null
rm -rf /tmp/pages15 && mkdir -p /tmp/pages15
for i in 1 2 3; do for f in /tmp/golden-images/*; do cp "$f" "/tmp/pages15/$i-$(basename "$f")"; done; done
common=(ocr --model $MP --precision fp16 --providers cuda --strict-providers --cuda-graphs on
  --max-tokens 150 --ignore-eos --temperature 0 --json --quiet --batch-size 15)
for v in "paged new" "paged changed" "gqa new" "gqa changed"; do
  set -- $v
  fails=0 lost=0 crashes=0 requeued=0 t0=$SECONDS
  for r in $(seq $N); do
    OCRCTL_VISION_ALONE=$2 $BIN "${common[@]}" --decoder $1 /tmp/pages15/* > /tmp/c.jsonl 2> /tmp/c.log
    rc=$?
    [ $rc -ne 0 ] && fails=$((fails + 1))
    [ $rc -gt 128 ] && crashes=$((crashes + 1))
    lost=$((lost + 15 - $(grep -c '"status":"ok"' /tmp/c.jsonl)))
    requeued=$((requeued + $(grep -c "is recomputed" /tmp/c.log)))
    [ $rc -ne 0 ] && grep -E "^error|refused" /tmp/c.log | cut -c1-160 | head -2
  done
  echo "== $1 decoder, vision alone for $2 sizes: $fails of $N runs failed ($crashes crashed), $lost pages lost, $requeued steps' pages requeued, $((SECONDS - t0)) s"
done
