#!/usr/bin/env bash
# `ocrctl serve --profile 16gb` on the GPU machine (device tool) with the dummy full-size model at
# int4-fp16 (GQA decoder, the default of an --target ort export): a bounded load run of A4-page
# chat requests (greedy, EOS ignored, T new tokens each) from C clients at each batch size in
# BATCHES, then /metrics (GPU memory, TTFT, tokens) and the server's first log lines.
# Needs the ONNX Runtime GPU parts and ocrctl as for scripts/gpu/gpu_compare.sh (/opt/ortparts).
# Knobs: BATCHES (1 6 8), C (16), N (32 requests), T (1024 new tokens), GRAPHS (off: CUDA graphs
# for decode steps, `off on` runs both), PREFILL (off: the prefill stage, `off on` runs both),
# MODEL (/tmp/dummy-q4, exported when it lacks the int4-fp16 GQA decoder).
set -euo pipefail
OUT=${OUT:-/tmp/out}
. scripts/gpu/gpu_env.sh
M=${MODEL:-/tmp/dummy-q4}
[ -f $M/onnx/decoder_model_gqa_q4f16.onnx ] || $BIN export --checkpoint dummy:lightonocr-2-1b \
  --out $M --precision int4-fp16 --force 2>&1 | tail -1
python3 -c "from PIL import Image, ImageDraw; im = Image.new('RGB', (1092, 1540), 'white'); d = ImageDraw.Draw(im)
for y in range(60, 1500, 40): d.rectangle([60, y, 1030, y + 12], fill='black')
im.save('/tmp/a4.png')"
mkdir -p "$OUT"
for pf in ${PREFILL:-off}; do
for g in ${GRAPHS:-off}; do
for b in ${BATCHES:-1 6 8}; do
  tag=b$b-g$g$([ "$pf" = off ] || echo -prefill-$pf)
  OCRCTL_PREFILL_STAGE=$pf OCRCTL_CUDA_GRAPHS=$g $BIN serve --model $M --profile 16gb --port 18080 --batch-size "$b" --queue-size 1000 2>"$OUT/serve-$tag.log" &
  pid=$!
  until curl -sf localhost:18080/health >/dev/null; do sleep 0.2; kill -0 $pid; done
  python3 scripts/load.py --url http://127.0.0.1:18080 --image /tmp/a4.png --requests "${N:-32}" \
    --concurrency "${C:-16}" --max-tokens "${T:-1024}" --ignore-eos --json \
    | sed "s/^{/{\"batch\": $b, \"cuda_graphs\": \"$g\", \"prefill_stage\": \"$pf\", /" | tee -a "$OUT/load.jsonl"
  curl -s localhost:18080/metrics | grep -E "^ocrctl_(gpu|resident|generated|time_to_first_token_seconds_(sum|count))" | tee "$OUT/metrics-$tag.txt"
  kill -TERM $pid; wait $pid || true
  grep -v "^\s*$" "$OUT/serve-$tag.log" | grep -v "W:onnxruntime" | head -6
done
done
done
