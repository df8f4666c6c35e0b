#!/usr/bin/env bash
# `ocrctl serve --devices cpu,cpu` against one engine on the same machine, same requests:
# the tiny fixture model (CPU, fp32), batch 4 per engine, REQUESTS requests at CONCURRENCY.
# One engine gets all cores (--threads 0); each of two engines gets half. Prints one JSON
# line per run (requests/s, latency percentiles from scripts/load.py) and the per-device
# request counters of the two-engine server.
# Usage: scripts/serve_devices.sh [REQUESTS=400] [CONCURRENCY=16] [MAX_TOKENS=32]
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-400}"; C="${2:-16}"; T="${3:-32}"
BIN=target/release/ocrctl
[ -x "$BIN" ] || cargo build --release
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
"$BIN" export --checkpoint tests/fixtures/tiny-lightonocr/checkpoint --out "$WORK/tiny" --precision fp32 >/dev/null
IMG=tests/fixtures/tiny-lightonocr/images/photo.jpg
run() { # label port serve-args...
  local label=$1 port=$2; shift 2
  "$BIN" serve --model "$WORK/tiny" --profile cpu --precision fp32 --port "$port" \
    --batch-size 4 --queue-size 10000 "$@" 2>"$WORK/serve-$port.log" &
  local pid=$!
  until curl -sf "http://127.0.0.1:$port/health" | grep -q '"ok"'; do sleep 0.1; done
  sleep 1 # every engine loaded
  python3 scripts/load.py --url "http://127.0.0.1:$port" --image "$IMG" --requests "$N" \
    --concurrency "$C" --max-tokens "$T" --json | sed "s/^{/{\"engines\": \"$label\", /"
  curl -s "http://127.0.0.1:$port/metrics" | grep '^ocrctl_engine_requests_total' || true
  kill $pid; wait $pid 2>/dev/null || true
}
run one 18101 --threads 0
run cpu,cpu 18102 --devices cpu,cpu
