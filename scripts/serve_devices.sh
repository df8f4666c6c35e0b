#!/usr/bin/env bash
# `ocrctl serve --devices cpu,cpu` against one engine on the same machine, same requests:
# the tiny fixture model (CPU, fp32), batch 4 per engine, REQUESTS requests at CONCURRENCY.
# One engine gets all cores (--threads 0); each of two engines gets half. Prints one JSON
# line per run (requests/s, latency percentiles from scripts/load.py) and the per-device
# request counters of the two-engine server.
# Usage: scripts/serve_devices.sh [REQUESTS=400] [CONCURRENCY=16] [MAX_TOKENS=32]
# Starting, waiting for and loading each server is scripts/serve_load.sh's load_run.
set -euo pipefail
source "$(dirname "$0")/serve_load.sh"
N="${1:-400}"; C="${2:-16}"; T="${3:-32}"
load_setup
LOAD_METRICS='^ocrctl_engine_requests_total'
load_run 18101 '"engines": "one"' "$N" "$C" "$T" --batch-size 4 --threads 0
load_run 18102 '"engines": "cpu,cpu"' "$N" "$C" "$T" --batch-size 4 --devices cpu,cpu
