#!/usr/bin/env bash
# Load figures for `ocrctl serve` on loopback with the tiny fixture model (CPU, fp32):
# batch 1 vs batch 4 in the same run (same requests, same concurrency), then memory before
# and after 10 000 requests at batch 4. Prints one JSON line per run.
# Usage: scripts/serve_load.sh [REQUESTS=400] [CONCURRENCY=8] [MAX_TOKENS=16]
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-400}"; C="${2:-8}"; T="${3:-16}"
BIN=target/release/ocrctl
[ -x "$BIN" ] || cargo build --release
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
"$BIN" export --checkpoint tests/fixtures/tiny-lightonocr/checkpoint --out "$WORK/tiny" --precision fp32 >/dev/null
IMG=tests/fixtures/tiny-lightonocr/images/photo.jpg
run() { # batch requests concurrency
  local port=$((18000 + $1))
  "$BIN" serve --model "$WORK/tiny" --profile cpu --precision fp32 --threads 1 --port $port \
    --batch-size "$1" --queue-size 10000 2>"$WORK/serve-$1.log" &
  local pid=$!
  until curl -sf "http://127.0.0.1:$port/health" >/dev/null; do sleep 0.1; done
  python3 scripts/load.py --url "http://127.0.0.1:$port" --image "$IMG" --requests "$2" \
    --concurrency "$3" --max-tokens "$T" --json | sed "s/^{/{\"batch\": $1, /"
  kill $pid; wait $pid 2>/dev/null || true
}
run 1 "$N" "$C"
run 4 "$N" "$C"
run 4 10000 "$C"
