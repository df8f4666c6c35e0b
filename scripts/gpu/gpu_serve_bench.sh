#!/usr/bin/env bash
# The steady-state serving benchmark (issue 37 items 3, 4, 5, 7) on the GPU machine (device
# tool): for each engine in ENGINES and KV cache in KVS, starts the server on the same random
# full-size checkpoint (CKPT), waits for /health, runs scripts/serve_bench/serve_bench.py once per load point
# in LOADS (each RUNS times), stops the server, and waits for its GPU memory to go back.
#   ocrctl: `ocrctl serve` on an export of CKPT (the profile's precision, `--kv-cache auto|fp8`),
#           `--profile` 80gb for MEM=full, 16gb for MEM=16 (arena and KV budget of 16 GiB).
#   vllm:   `vllm serve CKPT` from the venv `.vllm/vllm_anchor.sh install` made, with LightOn's
#           flags (--limit-mm-per-prompt '{"image":1}' --mm-processor-cache-gb 0
#           --no-enable-prefix-caching), --gpu-memory-utilization 0.90 (MEM=full) or
#           16 GiB / the card (MEM=16), --kv-cache-dtype auto|fp8 (auto = bf16, 2 bytes as fp16).
# Results collect in RES (/tmp/serve-bench, kept while the machine stays warm) and are packed
# into $OUT/serve-bench.tgz after every load point: bench/runs/*.json (every page's record),
# bench/occupancy/*.svg, bench/summary.json (issue 37 item 7's schema) and bench/summary.md
# (medians, ranges, ocrctl / vLLM ratios), logs/ (servers, exports), gpu.txt.
#
# A device call may run 10 minutes: split the work over calls (ENGINES, KVS, MEM, LOADS); a load
# point that would not finish within BUDGET_S of the call's start is skipped and named, so that a
# later call runs it. Calls add to the same RES, and the summary covers every run there.
#
# Needs: ONNX Runtime's GPU parts and .ortgpu/ocrctl.zst as for scripts/gpu/gpu_env.sh; for vLLM,
# `.vllm/vllm_anchor.sh install` done on this machine (../shared/GPU.md: parts carried, then
# install) and the checkpoint CKPT (`.vllm/vllm_anchor.sh ckpt` makes it; this script runs that
# when CKPT is missing and .vllm is there).
# Knobs: ENGINES ("ocrctl vllm"), KVS (fp16; "fp16 fp8"), MEM (full | 16), MEM_LABEL (the
# summary's memory_gib: the card's GiB for full, 16), LOADS ("c8 c32 r2 r4": cN = N clients,
# rR = R pages/s), RUNS (3), DURATION (60 s of sending a run), PAGES (none: a cap on pages a
# run), SCALE / MAX_NEW (none: pass --scale/--max-new), BUDGET_S (540), DRAIN_S (90: allowance
# per run for the pages in flight when sending stops), PROFILE, PREC, OCRCTL_ARGS, VLLM_ARGS
# (extra server flags; with `--decoder paged` the rows are labelled ocrctl-paged), DECODERS (the
# export's --decoder list, e.g. gqa,paged), GPU_UTIL (0.90), CKPT (/opt/lightonocr-2-1b-random; dummy:lightonocr-2-1b for ocrctl alone), VENV
# (/opt/vllmenv), WORKLOAD (benchmarks/workloads/ocr-pages.yaml), DRY_RUN=1 (print what would
# run, start nothing; works without a GPU).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
RES=${RES:-/tmp/serve-bench}
DRY=${DRY_RUN:-0}
ENGINES=${ENGINES:-ocrctl vllm}
KVS=${KVS:-fp16}
MEM=${MEM:-full}
LOADS=${LOADS:-c8 c32 r2 r4}
RUNS=${RUNS:-3}
DURATION=${DURATION:-60}
BUDGET_S=${BUDGET_S:-540}
DRAIN_S=${DRAIN_S:-90}
export CKPT=${CKPT:-/opt/lightonocr-2-1b-random}
export VENV=${VENV:-/opt/vllmenv}
WL=${WORKLOAD:-benchmarks/workloads/ocr-pages.yaml}
mkdir -p "$OUT" "$RES/bench" "$RES/logs"
# A dry run's clock: what the steps it prints would take (server starts ~60 s, points ~est).
DRY_CLOCK=0
log() { printf '[gpu_serve_bench %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
run() { if [ "$DRY" = 1 ]; then echo "+ $*"; else "$@"; fi; }
case "$MEM" in full | 16) ;; *) log "MEM must be full or 16, not $MEM"; exit 2 ;; esac

if [ "$DRY" = 1 ]; then
  BIN=${BIN:-target/release/ocrctl}
  TOTAL_MIB=143771
else
  . scripts/gpu/gpu_env.sh
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$RES/gpu.txt"
  TOTAL_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
fi
if [ "$MEM" = full ]; then
  MEM_LABEL=${MEM_LABEL:-$(( (TOTAL_MIB + 512) / 1024 ))}
  UTIL=${GPU_UTIL:-0.90}
else
  MEM_LABEL=${MEM_LABEL:-16}
  UTIL=$(python3 -c "print(f'{16 * 1024 / $TOTAL_MIB:.4f}')")
fi
# The workload's page sizes, for ocrctl's --warm-up (vLLM has none; serve_bench.py sends one
# untimed page of each size to both first).
SIZES=$(python3 -c "import sys; sys.path.insert(0, 'scripts/serve_bench'); import serve_workload as w
print(','.join(f'{a}x{b}' for a, b, _ in w.load_workload('$WL').sizes))") || exit 2

pack() {
  [ "$DRY" = 1 ] && return 0
  tar czf "$OUT/serve-bench.tgz.part" -C "$RES" . && mv "$OUT/serve-bench.tgz.part" "$OUT/serve-bench.tgz"
  cp "$RES/bench/summary.md" "$OUT/" 2>/dev/null || true
}

# start_server LOG CMD...: CMD (a `setsid …`, so the server leads its own process group) in the
# background with its output in LOG; SERVER_PID is its pid.
start_server() {
  local logf=$1; shift
  if [ "$DRY" = 1 ]; then echo "+ $* > $logf &"; SERVER_PID=0; DRY_CLOCK=$((DRY_CLOCK + 60)); return 0; fi
  "$@" > "$logf" 2>&1 &
  SERVER_PID=$!
}

# wait_health PORT PID LIMIT_S LOG: until GET /health is 200; fails when the server exits first.
wait_health() {
  local t0=$SECONDS
  [ "$DRY" = 1 ] && { echo "+ wait for http://127.0.0.1:$1/health"; return 0; }
  until curl -sf "http://127.0.0.1:$1/health" >/dev/null; do
    if ! kill -0 "$2" 2>/dev/null; then log "server exited before /health was 200:"; tail -30 "$4"; return 1; fi
    if [ $((SECONDS - t0)) -gt "$3" ]; then log "no /health after $3 s:"; tail -30 "$4"; return 1; fi
    sleep 1
  done
  log "ready in $((SECONDS - t0)) s"
}

# stop_server PID: SIGTERM to its process group (vLLM's engine is a child process), SIGKILL
# after 60 s, then up to 60 s for nvidia-smi to show no process holding GPU memory.
stop_server() {
  [ "$DRY" = 1 ] && { echo "+ kill -TERM -- -PID; wait for the GPU memory to go back"; return 0; }
  kill -TERM -- "-$1" 2>/dev/null
  for _ in $(seq 60); do kill -0 "$1" 2>/dev/null || break; sleep 1; done
  kill -KILL -- "-$1" 2>/dev/null
  wait "$1" 2>/dev/null
  for _ in $(seq 60); do
    [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader)" ] && return 0
    sleep 1
  done
  log "GPU memory still held after the server stopped:"; nvidia-smi --query-compute-apps=pid,used_memory --format=csv
}

# points ENGINE KV PID NOTES...: serve_bench.py once per load point (each RUNS runs), packing
# after each; a point that would end past BUDGET_S is skipped and named.
points() {
  local engine=$1 kv=$2 pid=$3 p flag est; shift 3
  local notes=() extra=()
  for n in "$@"; do notes+=(--note "$n"); done
  [ -n "${PAGES:-}" ] && extra+=(--pages "$PAGES")
  [ -n "${SCALE:-}" ] && extra+=(--scale "$SCALE")
  [ -n "${MAX_NEW:-}" ] && extra+=(--max-new "$MAX_NEW")
  for p in $LOADS; do
    case "$p" in c*) flag=--concurrency ;; r*) flag=--rate ;; *) log "bad load point $p (cN or rR)"; continue ;; esac
    est=$((RUNS * (${DURATION%.*} + DRAIN_S)))
    if [ $((SECONDS + DRY_CLOCK + est)) -gt "$BUDGET_S" ]; then
      log "SKIPPED (budget): ENGINES=$engine KVS=$kv MEM=$MEM LOADS=$p (~${est} s; $((SECONDS + DRY_CLOCK)) s used of $BUDGET_S)"
      continue
    fi
    [ "$DRY" = 1 ] && DRY_CLOCK=$((DRY_CLOCK + est))
    run python3 scripts/serve_bench/serve_bench.py run --url "http://127.0.0.1:$PORT" --engine "$engine" \
      --kv-cache "$kv" --memory-gib "$MEM_LABEL" --server-pid "$pid" "$flag" "${p:1}" \
      --runs "$RUNS" --duration "$DURATION" --workload "$WL" --out "$RES/bench" \
      "${extra[@]}" "${notes[@]}" 2>&1 | grep -v "^|" | tail -"$((RUNS + 2))"
    pack
  done
}

ensure_ckpt() {
  # ocrctl's own random weights (ocrctl-only runs): nothing to make.
  case "$CKPT" in dummy:*) return 0 ;; esac
  [ "$DRY" = 1 ] && { echo "+ [ -f $CKPT/config.json ] || bash .vllm/vllm_anchor.sh ckpt"; return 0; }
  [ -f "$CKPT/config.json" ] && return 0
  [ -f .vllm/vllm_anchor.sh ] || { log "no checkpoint in $CKPT and no .vllm/vllm_anchor.sh to make one"; return 1; }
  run bash .vllm/vllm_anchor.sh ckpt
}

ocrctl_set() {
  local kv=$1 profile prec model pid logf
  profile=${PROFILE:-$([ "$MEM" = full ] && echo 80gb || echo 16gb)}
  prec=${PREC:-$(awk '/^precision:/ {print $2}' "profiles/$profile.yaml")}
  local label=ocrctl dec=()
  case "${OCRCTL_ARGS:-}" in *"--decoder paged"*) label=ocrctl-paged ;; esac
  [ -n "${DECODERS:-}" ] && dec=(--decoder "$DECODERS")
  model=/tmp/sb-model-$prec-$kv${DECODERS:+-${DECODERS//,/-}}
  logf=$RES/logs/$label-$MEM_LABEL-$kv.log
  if [ ! -f "$model/ocrctl.json" ] && [ "$DRY" != 1 ]; then
    log "export $CKPT -> $model ($prec, KV cache $kv)"
    $BIN export --checkpoint "$CKPT" --out "$model" --precision "$prec" "${dec[@]}" \
      --kv-cache "$([ "$kv" = fp16 ] && echo auto || echo fp8)" --force > "$RES/logs/export-$prec-$kv.log" 2>&1 \
      || { log "export FAILED:"; tail -20 "$RES/logs/export-$prec-$kv.log"; return 1; }
  fi
  PORT=18100
  # A queue and connection limit no load point reaches: overload shows as latency, as with vLLM.
  local cmd=(setsid "$BIN" serve --model "$model" --profile "$profile" --port $PORT
    --providers cuda --strict-providers --queue-size 100000 --max-connections 8192
    --request-timeout 7200 --warm-up "$SIZES")
  # shellcheck disable=SC2206
  cmd+=(${OCRCTL_ARGS:-})
  start_server "$logf" "${cmd[@]}"
  pid=$SERVER_PID
  wait_health $PORT $pid 600 "$logf" || { stop_server $pid; return 1; }
  points "$label" "$kv" "$pid" "profile=$profile" "precision=$prec" "ocrctl_args=${OCRCTL_ARGS:-}"
  stop_server $pid
  [ "$DRY" = 1 ] || grep -v "W:onnxruntime" "$logf" | grep -E "loaded|warmed|KV|batch|graph" | head -8
}

vllm_set() {
  local kv=$1 pid logf cuda_home=""
  [ "$DRY" = 1 ] || "$VENV/bin/python" -c "import vllm" 2>/dev/null \
    || { log "no vLLM in $VENV: run .vllm/vllm_anchor.sh install first"; return 1; }
  logf=$RES/logs/vllm-$MEM_LABEL-$kv.log
  for d in /usr/local/cuda /usr/local/cuda-13.0; do [ -x "$d/bin/nvcc" ] && { cuda_home=$d; break; }; done
  PORT=18200
  # Offline, caches in /tmp (the home may be read-only), as .vllm/vllm_anchor.sh bench runs it.
  local envs=(HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
    VLLM_CACHE_ROOT=/tmp/vllm-cache TRITON_CACHE_DIR=/tmp/triton-cache XDG_CACHE_HOME=/tmp/xdg-cache)
  [ -n "$cuda_home" ] && envs+=(CUDA_HOME="$cuda_home" PATH="$cuda_home/bin:$PATH")
  local cmd=(setsid env "${envs[@]}" "$VENV/bin/python" -m vllm.entrypoints.openai.api_server
    --model "$CKPT" --port $PORT --served-model-name lightonocr --dtype bfloat16 --seed 0
    --max-model-len 8192 --limit-mm-per-prompt '{"image":1}' --mm-processor-cache-gb 0
    --no-enable-prefix-caching --gpu-memory-utilization "$UTIL"
    --kv-cache-dtype "$([ "$kv" = fp16 ] && echo auto || echo fp8)")
  # shellcheck disable=SC2206
  cmd+=(${VLLM_ARGS:-})
  start_server "$logf" "${cmd[@]}"
  pid=$SERVER_PID
  wait_health $PORT $pid 900 "$logf" || { stop_server $pid; return 1; }
  points vllm "$kv" "$pid" "gpu_memory_utilization=$UTIL" "vllm_args=${VLLM_ARGS:-}"
  stop_server $pid
  [ "$DRY" = 1 ] || grep -E "KV cache|GPU blocks|Maximum concurrency|graph" "$logf" | head -6
}

ensure_ckpt || exit 1
for engine in $ENGINES; do
  for kv in $KVS; do
    # A server start (ocrctl: export, load, warm-up; vLLM: load, compile, graphs) that leaves
    # no time for one load point is not made.
    start=$([ "$engine" = vllm ] && echo 300 || echo 120)
    if [ $((SECONDS + DRY_CLOCK + start + RUNS * (${DURATION%.*} + DRAIN_S))) -gt "$BUDGET_S" ]; then
      log "SKIPPED (budget): ENGINES=$engine KVS=$kv MEM=$MEM LOADS=\"$LOADS\" (no time for a start and one point)"
      continue
    fi
    log "== $engine, KV cache $kv, memory $MEM ($MEM_LABEL GiB), loads $LOADS, $RUNS runs of ${DURATION} s"
    case "$engine" in
      ocrctl) ocrctl_set "$kv" ;;
      vllm) vllm_set "$kv" ;;
      *) log "unknown engine $engine (ocrctl, vllm)" ;;
    esac
    pack
  done
done
[ "$DRY" = 1 ] || { python3 scripts/serve_bench/serve_bench.py summarize "$RES/bench" >/dev/null 2>&1 && pack && cat "$RES/bench/summary.md"; }
