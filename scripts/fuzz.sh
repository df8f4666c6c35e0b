#!/usr/bin/env bash
# Fuzzes ocrctl for a bounded time with cargo-fuzz. Not part of CI. Needs a nightly toolchain
# and cargo-fuzz (`cargo install cargo-fuzz`).
# Targets:
#   front_door  the server's front door (request parser, data URLs, image decoding); seeds:
#               the fixture images and chat requests built from them
#   sampler     sampling parameters and logits (no panic, no NaN, ids in range)
# Usage: scripts/fuzz.sh [TARGET] [SECONDS]   (default: front_door, 120)
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET="${1:-front_door}"
SECS="${2:-120}"
CORPUS="fuzz/corpus/$TARGET"
mkdir -p "$CORPUS"
case "$TARGET" in
  front_door)
    for img in tests/fixtures/tiny-lightonocr/images/*; do
      cp "$img" "$CORPUS/$(basename "$img")"
      printf '{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,%s"}},{"type":"text","text":"read"}]}],"max_tokens":8,"temperature":0.2,"top_p":0.9,"top_k":5,"stop":["x"],"logprobs":true,"top_logprobs":2,"stream":true}' \
        "$(base64 -w0 "$img")" > "$CORPUS/chat-$(basename "$img").json"
    done
    ;;
  sampler)
    # temperature 0.2, top_p 0.9, top_k 5, penalty 1e-38, seed 1, then a few logits.
    python3 - "$CORPUS/seed" <<'PY'
import struct, sys
b = struct.pack('<ff', 0.2, 0.9) + struct.pack('<HH', 5, 0) + struct.pack('<f', 1e-38)
b += bytes([1, 0, 0, 0]) + struct.pack('<6f', 1.0, 5.0, float('inf'), -2.0, float('nan'), 3.0)
open(sys.argv[1], 'wb').write(b)
PY
    ;;
  *) echo "unknown target $TARGET (front_door or sampler)" >&2; exit 2 ;;
esac
# cargo fuzz runs from fuzz/; the corpus path is relative to it.
cd fuzz
cargo +nightly fuzz run "$TARGET" "corpus/$TARGET" -- -max_total_time="$SECS" -rss_limit_mb=4096 -max_len=262144
