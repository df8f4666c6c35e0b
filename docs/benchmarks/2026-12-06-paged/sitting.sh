#!/usr/bin/env bash
# The 2026-12-06 sitting on one GPU (device tool): the paged decoder in ocrctl's runtime. One STEP
# a call, back to back (the machine is kept ~30 s after a call):
#   ort N     carries .ortgpu/part-0N into /opt/ortparts (N=0 also .ortgpu/bin, the last also
#             .ortgpu/ocrctl.zst), as scripts/gpu/gpu_env.sh expects them. With the tree at
#             15 MiB, 52 MiB parts no longer fit a call's 64: re-split them into five,
#             `cat part-0* > all && rm part-0* && split -b 44m -d all part-` in .ortgpu/
#   parity    scripts/gpu/gpu_parity.sh: the fixture against the transformers goldens, the GQA
#             and merged decoders as before and the paged decoder (graphs off/on, a 2-block pool)
#   check     the paged decoder's preemption on the fixture (the last part of gpu_parity.sh:
#             15 pages on a pool of 25 blocks against the default pool, same ids)
#   serve D   the steady-state benchmark at 16 GiB (the 16gb profile, int4-fp16, fp16 cache),
#             closed loop c16, 3 runs of 20 s, on one export with both decoders:
#             D=gqa (6 slots of 8 192 positions, the profile as users run it) or
#             D=paged (--decoder paged --batch-size 24, a pool of the profile's 5.5 GiB)
# Results: $OUT/parity.txt, $OUT/serve-bench.tgz and $OUT/summary.md (both decoders).
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
case "${1:-}" in
  ort)
    mkdir -p /opt/ortparts
    cp ".ortgpu/part-0$2" /opt/ortparts/
    [ "$2" = 0 ] && cp .ortgpu/bin/zstd /opt/ortparts/
    [ "$2" = 3 ] && rm -rf /opt/ortgpu
    [ -f .ortgpu/ocrctl.zst ] && cp .ortgpu/ocrctl.zst /opt/ortparts/
    ls /opt/ortparts
    ;;
  parity)
    mkdir -p .ortgpu && cp /opt/ortparts/ocrctl.zst .ortgpu/
    bash scripts/gpu/gpu_parity.sh 2>&1 | tee "$OUT/parity.txt" | tail -40
    ;;
  check)
    mkdir -p .ortgpu && cp /opt/ortparts/ocrctl.zst .ortgpu/
    . scripts/gpu/gpu_env.sh
    FX=tests/fixtures/tiny-lightonocr MP=/tmp/fixture-export-paged status=0
    [ -f $MP/ocrctl.json ] || $BIN export --checkpoint $FX/checkpoint --out $MP --precision fp16 \
      --decoder gqa,paged >/dev/null
    [ -d /tmp/golden-images ] || python3 scripts/gpu/golden_images.py /tmp/golden-images >/dev/null
    eval "$(sed -n '/^# Preemption:/,/^PY$/p' scripts/gpu/gpu_parity.sh)"
    cp /tmp/paged-tight.log /tmp/paged-ample.log /tmp/paged-ample.jsonl /tmp/paged-tight.jsonl "$OUT/"
    exit $status
    ;;
  serve)
    mkdir -p .ortgpu && cp /opt/ortparts/ocrctl.zst .ortgpu/
    case "${2:-}" in
      gqa) args="--decoder gqa" ;;
      paged) args="--decoder paged --batch-size 24" ;;
      *) echo "serve gqa|paged"; exit 2 ;;
    esac
    env CKPT=dummy:lightonocr-2-1b ENGINES=ocrctl MEM=16 KVS=fp16 DECODERS=gqa,paged \
      OCRCTL_ARGS="$args" LOADS=c16 RUNS=3 DURATION=${DURATION:-20} DRAIN_S=30 BUDGET_S=580 \
      bash scripts/gpu/gpu_serve_bench.sh 2>&1 | tail -30
    ;;
  *) echo "usage: $0 ort N|parity|serve gqa|paged"; exit 2 ;;
esac
