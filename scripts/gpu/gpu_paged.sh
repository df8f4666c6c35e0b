#!/usr/bin/env bash
# The paged decoder on the GPU machine, in one call (after the carrying recipe of
# ../shared/GPU.md; BIN, the build under test, as scripts/gpu/gpu_env.sh sets it):
#  1. ONNX Runtime's PagedAttention alone at LightOnOCR's shape (docs/benchmarks/2026-12-05-h200/gpu_paged_probe.py):
#     mixed prefill/decode calls against numpy, fp16 and fp8 caches, CUDA graph replay after
#     growth, decode and prefill time against GQA slots;
#  2. the fixture's paged decoder against its GQA decoder on CUDA (scripts/check_paged.py),
#     fp16 and int4-fp16, blocks of 16 (the CUDA kernel's least) and 128 (FlashAttention);
#  3. the dummy full-size model's whole decoder step, paged against GQA, with CUDA graphs, at
#     BATCHES (1,64,256), an A4 prompt alone and with the decode tokens in one call
#     (scripts/gpu/gpu_paged_decoder_bench.py).
# Everything goes to $R (scripts/gpu/gpu_env.sh) and $OUT/results.tgz. Knobs: STEPS ("probe check
# bench": which of the three to run), BATCHES, CTX, RUNS.
set -uo pipefail
. scripts/gpu/gpu_env.sh
results_dir
STEPS=" ${STEPS:-probe check bench} "
if [[ $STEPS == *" probe "* ]]; then
  PYTHONPATH=/opt/ortgpu python3 docs/benchmarks/2026-12-05-h200/gpu_paged_probe.py 2>&1 | tee "$R/probe.txt"
  pack_results
fi
if [[ $STEPS == *" check "* ]]; then
  FX=/tmp/fixture-paged
  rm -rf $FX
  $BIN export --checkpoint tests/fixtures/tiny-lightonocr/checkpoint --out $FX \
    --precision fp16,int4-fp16 --decoder gqa,paged >/dev/null
  for p in fp16 int4-fp16; do
    for block in 16 128; do
      echo "== fixture $p, blocks of $block" | tee -a "$R/check.txt"
      PYTHONPATH=/opt/ortgpu python3 scripts/check_paged.py $FX --precision $p --device cuda \
        --block $block 2>&1 | tee -a "$R/check.txt" | tail -1
    done
  done
  pack_results
fi
if [[ $STEPS == *" bench "* ]]; then
  D=/tmp/dummy-paged
  [ -d $D ] || $BIN export --checkpoint dummy:lightonocr-2-1b --out $D --precision fp16 \
    --decoder gqa,paged >/dev/null 2>&1 || echo "export FAILED" | tee "$R/bench.txt"
  PYTHONPATH=/opt/ortgpu python3 scripts/gpu/gpu_paged_decoder_bench.py $D "${BATCHES:-1,64,256}" \
    2>&1 | tee -a "$R/bench.txt"
  pack_results
fi
