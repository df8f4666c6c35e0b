#!/usr/bin/env bash
# The tiny fixture on the GPU (CUDA provider) against the transformers goldens, for each decoder
# and 16/32-bit precision the CUDA kernels run: greedy ids exact and top-5 log-probabilities
# within the parity tests' tolerances (scripts/gpu/check_golden.py). The GQA decoder runs CUDA's
# GroupQueryAttention kernels (fp16 only on CUDA), which CI's CPU runs cannot check.
# Needs ONNX Runtime's GPU parts and ocrctl in /opt/ortparts, as for scripts/gpu/gpu_compare.sh.
# Greedy (`--temperature 0`): `ocr` otherwise samples as the checkpoint's generation_config.json
# says (the fixture's, like LightOnOCR's: temperature 0.2), which picks the second token at
# the fixture's near-ties now and then. The images are the reference's own
# (scripts/gpu/golden_images.py: the JPEG as Pillow decoded it, since ocrctl's decode differs by up
# to 4 levels, which alone moves the photo's log-probabilities by 0.0035, on the CPU too).
# Knobs: BIN (/opt/ortparts/ocrctl).
set -euo pipefail
. scripts/gpu/gpu_env.sh
FX=tests/fixtures/tiny-lightonocr
M=/tmp/fixture-export
rm -rf $M
$BIN export --checkpoint $FX/checkpoint --out $M --precision fp32,fp16 >/dev/null
python3 scripts/gpu/golden_images.py /tmp/golden-images >/dev/null
status=0
# The fields: decoder, precision, tolerance, top-5 log-probabilities asked for (logits to the
# host) or not (greedy ids chosen on the GPU by the GQA graph's argmax), CUDA graphs for the
# decode steps (GQA only) off or on, and the prefill stage (GQA only; off when not given).
for run in "gqa fp16 0.05 5 off" "gqa fp16 0.05 0 off" "gqa fp16 0.05 5 on" "gqa fp16 0.05 0 on" \
  "gqa fp16 0.05 5 on on" "merged fp16 0.05 5 off" "merged fp32 0.001 5 off"; do
  set -- $run
  echo "== $1 decoder, $2, CUDA (tolerance $3, top-logprobs $4, CUDA graphs $5, prefill stage ${6:-off})"
  $BIN ocr --model $M --decoder "$1" --precision "$2" --providers cuda --strict-providers \
    --cuda-graphs "$5" --prefill-stage "${6:-off}" --max-tokens 40 --ignore-eos --temperature 0 --top-logprobs "$4" --json \
    --quiet --batch-size 5 /tmp/golden-images/* 2>/dev/null \
    | python3 scripts/gpu/check_golden.py $FX/golden/golden.json "$3" || status=1
done
exit $status
