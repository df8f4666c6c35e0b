#!/usr/bin/env bash
# Ahead-of-time TensorRT-RTX engines, as CI and the release workflow build them (no GPU):
# exports CHECKPOINT with --target tensorrt in each profile's precision, runs
# `ocrctl build-engines` per profile, then checks what issue 13 asks of them:
#  - every graph has an engine and an EPContext model (`build-engines --check`: the manifest
#    entry matches the export and profile, engines hash to what was recorded, EPContext
#    models hold EPContext nodes only),
#  - the EPContext models are valid ONNX (onnx.checker),
#  - a second run builds nothing (same output line, same files).
#
# Usage: scripts/check_engines.sh [CHECKPOINT] [OUT] [PROFILES]
#   CHECKPOINT  default tests/fixtures/tiny-lightonocr/checkpoint (or dummy:lightonocr-2-1b)
#   OUT         export folder to write (default: a temporary one, removed at the end)
#   PROFILES    comma-separated (default 16gb,24gb)
# Needs scripts/setup.sh --trt-rtx (the builder) and target/release/ocrctl (built if absent).
set -euo pipefail
cd "$(dirname "$0")/.."
CKPT="${1:-tests/fixtures/tiny-lightonocr/checkpoint}"
OUT="${2:-}"
PROFILES="${3:-16gb,24gb}"
BIN=target/release/ocrctl
[ -x "$BIN" ] || cargo build --release
if [ -z "$OUT" ]; then
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
  OUT="$WORK/model"
fi
precisions=$(for p in ${PROFILES//,/ }; do "$BIN" profiles show "$p" | sed -n 's/^precision: *//p'; done | sort -u | paste -sd, -)
t0=$(date +%s.%N)
"$BIN" export --checkpoint "$CKPT" --out "$OUT" --target tensorrt --precision "$precisions" --force >/dev/null
echo "exported $CKPT ($precisions, --target tensorrt) in $(echo "$(date +%s.%N) - $t0" | bc) s"
for p in ${PROFILES//,/ }; do
  "$BIN" build-engines --model "$OUT" --profile "$p" 2>"$OUT/.build-$p.log" || { cat "$OUT/.build-$p.log" >&2; exit 1; }
  dir="$OUT/trt-rtx/$p"
  state() { ls -l --time-style=+%s.%N "$dir" | sort; sha256sum <"$OUT/ocrctl.json"; }
  before=$(state)
  second=$("$BIN" build-engines --model "$OUT" --profile "$p" 2>&1)
  case "$second" in
    *"up to date"*) ;;
    *) echo "error: a second build-engines run for $p was not a no-op: $second" >&2; exit 1 ;;
  esac
  [ "$before" = "$(state)" ] || { echo "error: the second run for $p changed files" >&2; exit 1; }
  "$BIN" build-engines --model "$OUT" --profile "$p" --check
  .venv/bin/python - "$dir" <<'PY'
import glob, sys, onnx
models = sorted(glob.glob(f"{sys.argv[1]}/*_ctx.onnx"))
assert len(models) == 3, f"expected 3 EPContext models in {sys.argv[1]}, found {models}"
for f in models:
    m = onnx.load(f)
    onnx.checker.check_model(m)
    ops = {(n.domain, n.op_type) for n in m.graph.node}
    assert ops == {("com.microsoft", "EPContext")}, f"{f}: {ops}"
    assert not m.graph.initializer, f"{f}: holds weights"
print(f"onnx.checker: {len(models)} EPContext models valid in {sys.argv[1]}")
PY
done
