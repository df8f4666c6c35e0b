#!/usr/bin/env bash
# Which paged runs fail (seen 2026-12-06 on an H100: 15 pages at batch 15 with CUDA graphs on,
# one page "operation not permitted when stream is capturing", once a SIGSEGV), and which
# thread captures a stream then (scripts/gpu/capture_shim.c).
cd "$(dirname "$0")/../../.." || exit 1
# Carried: .ortgpu/ocrctl-old.zst (main before the fix) and .ortgpu/ocrctl.zst (with it).
. scripts/gpu/gpu_env.sh
OLD=$(ocrctl_bin ocrctl-old.zst ocrctl-old)
NEW=/opt/ortparts/ocrctl-new && /opt/ortparts/zstd -dcqf .ortgpu/ocrctl.zst -o $NEW && chmod +x $NEW
BIN=$NEW
FX=tests/fixtures/tiny-lightonocr MP=/tmp/fixture-export-paged
[ -f $MP/ocrctl.json ] || $BIN export --checkpoint $FX/checkpoint --out $MP --precision fp16 \
  --decoder gqa,paged >/dev/null
[ -d /tmp/golden-images ] || python3 scripts/gpu/golden_images.py /tmp/golden-images >/dev/null
rm -rf /tmp/pages15 && mkdir -p /tmp/pages15
for i in 1 2 3; do for f in /tmp/golden-images/*; do cp "$f" "/tmp/pages15/$i-$(basename "$f")"; done; done
shim=/tmp/capture_shim.so
cp /opt/ortparts/capture_shim.so $shim 2>/dev/null || cp .ortgpu/capture_shim.so $shim 2>/dev/null \
  || cc -shared -fPIC -O1 -o $shim scripts/gpu/capture_shim.c -ldl
common=(ocr --model $MP --precision fp16 --providers cuda --strict-providers --cuda-graphs on
  --max-tokens 150 --ignore-eos --temperature 0 --json --quiet --batch-size 15)
run() { # NAME BIN ARGS...
  local name=$1 bin=$2; shift 2
  LD_PRELOAD=$shim RUST_LOG=warn,ocrctl=debug $bin "${common[@]}" "$@" /tmp/pages15/* \
    > /tmp/$name.jsonl 2> /tmp/$name.log
  echo "== $name: rc $? pages $(grep -c '^{' /tmp/$name.jsonl) errors $(grep -c '^error' /tmp/$name.log)"
  grep -E '^error|refused' /tmp/$name.log | cut -c1-200 | head -3
  echo "captures begun by thread (tid: count):"
  grep 'capture_shim' /tmp/$name.log | grep -i 'begin' | awk '{print $4}' | sort | uniq -c | head
  grep "capture_shim" /tmp/$name.log | grep -i begin | tail -2 | cut -c1-200
  grep -B3 -A1 -m2 'capture_shim.*= [1-9]' /tmp/$name.log | cut -c1-220
}
run paged-old $OLD --decoder paged
run paged-old-novision $OLD --decoder paged --vision-stage off
run gqa $NEW --decoder gqa
run paged-new1 $NEW --decoder paged
run paged-new2 $NEW --decoder paged
tar czf ${OUT:-/tmp/out}/probe-logs.tgz -C /tmp paged-old.log paged-old-novision.log gqa.log \
  paged-new1.log paged-new2.log
