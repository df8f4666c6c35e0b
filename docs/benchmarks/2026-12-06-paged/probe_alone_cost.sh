#!/usr/bin/env bash
# What does holding the capture lock alone for every vision run whose size changed
# (OCRCTL_VISION_ALONE=changed, which lost no page in probe_collision.sh) cost a server? The
# 16 GiB paged fp8 configuration of §2 (32 clients, ocr-pages.yaml), RUNS runs of DURATION s
# per policy, POLICIES in order; each policy's results in $OUT/<policy>/.
cd "$(dirname "$0")/../../.." || exit 1
for pol in ${POLICIES:-new changed}; do
  mkdir -p "${OUT:-/tmp/out}/$pol"
  OCRCTL_VISION_ALONE=$pol OUT=${OUT:-/tmp/out}/$pol RES=/tmp/sb-$pol \
    CKPT=dummy:lightonocr-2-1b ENGINES=ocrctl MEM=16 KVS=fp8 DECODERS=gqa,paged \
    OCRCTL_ARGS="--decoder paged --batch-size 32" LOADS=c32 RUNS=${RUNS:-3} \
    DURATION=${DURATION:-30} DRAIN_S=30 BUDGET_S=${BUDGET_S:-560} \
    bash scripts/gpu/gpu_serve_bench.sh 2>&1 | grep -E "pages/s|c32|skipped|FAIL|error" | tail -8
done
