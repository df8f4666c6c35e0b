#!/usr/bin/env bash
# Fuzzes the server's front door (request parser, data URLs, image decoding) for a bounded
# time with cargo-fuzz. Not part of CI. Needs a nightly toolchain and cargo-fuzz
# (`cargo install cargo-fuzz`). Seeds: the fixture images and chat requests built from them.
# Usage: scripts/fuzz.sh [SECONDS]   (default 120)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${1:-120}"
CORPUS=fuzz/corpus/front_door
mkdir -p "$CORPUS"
for img in tests/fixtures/tiny-lightonocr/images/*; do
  cp "$img" "$CORPUS/$(basename "$img")"
  printf '{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,%s"}},{"type":"text","text":"read"}]}],"max_tokens":8,"temperature":0.2,"top_p":0.9,"top_k":5,"stop":["x"],"logprobs":true,"top_logprobs":2,"stream":true}' \
    "$(base64 -w0 "$img")" > "$CORPUS/chat-$(basename "$img").json"
done
# cargo fuzz runs from fuzz/; the corpus path is relative to it.
cd fuzz
cargo +nightly fuzz run front_door corpus/front_door -- -max_total_time="$SECS" -rss_limit_mb=4096 -max_len=262144
