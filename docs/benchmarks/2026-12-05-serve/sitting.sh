#!/usr/bin/env bash
# The 2026-12-05 serving sitting on the H200 (device tool), one STEP a call, back to back:
#   ort         carries .ortgpu/part-NN (the first also .ortgpu/bin, the last .ortgpu/ocrctl.zst)
#               into /opt/ortparts, as scripts/gpu/gpu_env.sh expects them
#   start       copies this checkout to /opt/sbrepo (later calls replace the working tree) and
#               starts, detached, ocrctl's half: scripts/gpu/gpu_serve_bench.sh with the
#               h200-fp16 profile beside this file, KV fp16, closed loop LOAD, RUNS runs
#   stash       carries a vLLM part (.vllm/vllm_stash.sh) and shows the detached run's progress
#   install     waits for ocrctl's half to end (an install beside it would take its CPUs), then
#               .vllm/vllm_anchor.sh install, then starts vLLM's half detached, same load
#   wait S      up to S s for the detached half to end; packs what is there into $OUT
# Results: /tmp/serve-bench (RES of gpu_serve_bench.sh), both engines in one summary.
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 1
OUT=${OUT:-/tmp/out}
HERE=docs/benchmarks/2026-12-05-serve
LOAD=${LOAD:-c64}
common=(env OUT=/tmp/sbout RES=/tmp/serve-bench KVS=fp16 MEM=full LOADS="$LOAD" RUNS="${RUNS:-3}"
  DURATION="${DURATION:-20}" BUDGET_S=3000 PREC=fp16 PROFILE=/opt/sbrepo/$HERE/h200-fp16.yaml)
running() { pgrep -f gpu_serve_bench.sh >/dev/null; }
progress() { tail -n "${1:-4}" /tmp/sb-half.log 2>/dev/null; }

case "${1:-}" in
  ort)
    mkdir -p /opt/ortparts
    for f in .ortgpu/part-0* .ortgpu/bin/zstd .ortgpu/ocrctl.zst; do
      [ -f "$f" ] && cp "$f" /opt/ortparts/
    done
    ls /opt/ortparts
    ;;
  start)
    rm -rf /opt/sbrepo && mkdir -p /opt/sbrepo && cp -a . /opt/sbrepo/ && mkdir -p /opt/sbrepo/.ortgpu
    cp /opt/ortparts/ocrctl.zst /opt/sbrepo/.ortgpu/
    cd /opt/sbrepo || exit 1
    setsid nohup "${common[@]}" ENGINES=ocrctl bash scripts/gpu/gpu_serve_bench.sh \
      > /tmp/sb-half.log 2>&1 < /dev/null &
    sleep 20; progress 10
    ;;
  stash)
    bash .vllm/vllm_stash.sh | grep -E "copied|next|MISMATCH|core"
    progress
    ;;
  install)
    bash .vllm/vllm_stash.sh | grep -E "copied|next|MISMATCH|core"
    for _ in $(seq 100); do running || break; sleep 3; done
    running && { echo "ocrctl's half still running: install not started"; progress; exit 1; }
    progress 12
    bash .vllm/vllm_anchor.sh install 2>&1 | tail -5 || exit 1
    cp -a .vllm /opt/sbrepo/ && cd /opt/sbrepo || exit 1
    setsid nohup "${common[@]}" ENGINES=vllm bash scripts/gpu/gpu_serve_bench.sh \
      > /tmp/sb-half.log 2>&1 < /dev/null &
    sleep 5; progress
    ;;
  wait)
    for _ in $(seq $(( ${2:-500} / 5 ))); do running || break; sleep 5; done
    progress 14
    mkdir -p "$OUT" && cp /tmp/sbout/* "$OUT/" 2>/dev/null
    nvidia-smi --query-gpu=memory.used --format=csv,noheader
    ;;
  *) echo "usage: $0 ort|start|stash|install|wait [S]"; exit 2 ;;
esac
