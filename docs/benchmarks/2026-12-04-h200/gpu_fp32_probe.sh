#!/usr/bin/env bash
# Which attention kernel makes the merged fp32 decoder's fixture run drift from the goldens on
# CUDA (scripts/gpu/gpu_parity.sh's last FAIL line): the fixture at fp32 under ONNX Runtime's
# attention-kernel switches, each with its kernel debug lines counted. GPU machine; needs the
# parts and ocrctl.zst as scripts/gpu/gpu_env.sh says.
set -uo pipefail
. scripts/gpu/gpu_env.sh
FX=tests/fixtures/tiny-lightonocr
M=/tmp/fx32
[ -d $M ] || $BIN export --checkpoint $FX/checkpoint --out $M --precision fp32 >/dev/null
for cfg in default ORT_DISABLE_MEMORY_EFFICIENT_ATTENTION=1 ORT_DISABLE_FLASH_ATTENTION=1 \
  "ORT_DISABLE_MEMORY_EFFICIENT_ATTENTION=1 ORT_DISABLE_FLASH_ATTENTION=1"; do
  echo "== $cfg, merged fp32"
  env $([ "$cfg" = default ] || echo $cfg) ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO=1 $BIN ocr \
    --model $M --decoder merged --precision fp32 --providers cuda --strict-providers \
    --max-tokens 40 --ignore-eos --temperature 0 --top-logprobs 5 --json --quiet --batch-size 5 \
    $FX/images/* >/tmp/out.txt 2>/tmp/err.txt
  python3 scripts/gpu/check_golden.py $FX/golden/golden.json 0.001 </tmp/out.txt
  cat /tmp/out.txt /tmp/err.txt | grep -v "^{" | grep -i "attention\|kernel" | sed 's/[0-9]\{4\}-[0-9-]* [0-9:.]*//' \
    | sort | uniq -c | sort -rn | head -5
done
