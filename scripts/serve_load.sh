#!/usr/bin/env bash
# Load figures for `ocrctl serve` on loopback with the tiny fixture model (CPU, fp32):
# batch 1 vs batch 4 in the same run (same requests, same concurrency), then memory before
# and after 10 000 requests at batch 4. Prints one JSON line per run.
# Usage: scripts/serve_load.sh [REQUESTS=400] [CONCURRENCY=8] [MAX_TOKENS=16]
# Sourced (as scripts/serve_devices.sh does), it only defines load_setup and load_run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=target/release/ocrctl
IMG=tests/fixtures/tiny-lightonocr/images/photo.jpg

# load_setup: builds ocrctl if there is none and exports the fixture (fp32) to $WORK/tiny;
# $WORK and any server still running go away on exit.
load_setup() {
  [ -x "$BIN" ] || cargo build --release
  WORK=$(mktemp -d)
  trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
  "$BIN" export --checkpoint tests/fixtures/tiny-lightonocr/checkpoint --out "$WORK/tiny" \
    --precision fp32 >/dev/null
}

# load_run PORT FIELDS REQUESTS CONCURRENCY MAX_TOKENS [SERVE-ARGS...]: serves $WORK/tiny on
# PORT (CPU, fp32, queue 10 000, then SERVE-ARGS), waits until no engine is still loading,
# runs scripts/load.py and prints its JSON line with FIELDS (`"batch": 4`) put first; with
# LOAD_METRICS set, then the /metrics lines matching that regex. Stops the server.
load_run() {
  local port=$1 fields=$2 n=$3 c=$4 t=$5 pid health
  shift 5
  "$BIN" serve --model "$WORK/tiny" --profile cpu --precision fp32 --port "$port" \
    --queue-size 10000 "$@" 2>"$WORK/serve-$port.log" &
  pid=$!
  until health=$(curl -sf "http://127.0.0.1:$port/health") && ! grep -q '"loading"' <<<"$health"; do
    kill -0 "$pid" 2>/dev/null || { cat "$WORK/serve-$port.log" >&2; return 1; }
    sleep 0.1
  done
  python3 scripts/load.py --url "http://127.0.0.1:$port" --image "$IMG" --requests "$n" \
    --concurrency "$c" --max-tokens "$t" --json | sed "s/^{/{$fields, /"
  if [ -n "${LOAD_METRICS:-}" ]; then
    curl -s "http://127.0.0.1:$port/metrics" | grep -E "$LOAD_METRICS" || true
  fi
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

[ "${BASH_SOURCE[0]}" = "$0" ] || return 0
N="${1:-400}"; C="${2:-8}"; T="${3:-16}"
load_setup
for b in 1 4; do
  load_run $((18000 + b)) "\"batch\": $b" "$N" "$C" "$T" --threads 1 --batch-size "$b"
done
load_run 18004 '"batch": 4' 10000 "$C" "$T" --threads 1 --batch-size 4
