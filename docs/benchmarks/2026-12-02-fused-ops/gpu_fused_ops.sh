#!/usr/bin/env bash
# Fused ops A/B on the GPU machine, one call (issue 9.4): binary A (before) and binary B (after)
# each export the dummy full-size model and are benchmarked alternately on the same GPU in the
# same call; the fixture's CUDA parity is checked with B's export (scripts/gpu/check_golden.py, as
# scripts/gpu/gpu_parity.sh); a launch-blocking ONNX Runtime profile of B's vision encoder and
# decode step counts nodes and time per operator. Results to $OUT.
# Carry ONNX Runtime's GPU parts as for docs/benchmarks/2026-12-01-cudagraphs/gpu_graphs.sh, with .ortgpu/ocrctl-a.zst (A)
# and .ortgpu/ocrctl.zst (B).
# Knobs: SIZES (1092x1540,1540x1540), BATCHES (1,32,128), NEW_TOKENS (512), ROUNDS (2).
set -uo pipefail
OUT=${OUT:-/tmp/out}
. scripts/gpu/gpu_env.sh
A=$(ocrctl_bin ocrctl-a.zst ocrctl-a)
B=$(ocrctl_bin ocrctl.zst ocrctl-b)
FX=tests/fixtures/tiny-lightonocr
rm -rf /tmp/fixture-b
$B export --checkpoint $FX/checkpoint --out /tmp/fixture-b --precision fp16 >/dev/null
for g in off on; do
  echo "== fixture parity, B, gqa fp16, CUDA graphs $g"
  $B ocr --model /tmp/fixture-b --decoder gqa --precision fp16 --providers cuda --strict-providers \
    --cuda-graphs $g --max-tokens 40 --ignore-eos --temperature 0 --top-logprobs 5 \
    --json --quiet --batch-size 3 $FX/images/* 2>"$OUT/fixture-$g.log" | tee "$OUT/fixture-$g.jsonl" \
    | python3 scripts/gpu/check_golden.py $FX/golden/golden.json 0.05 || echo "PARITY FAILED (graphs $g)"
done
for v in a b; do
  [ -d /tmp/dummy-$v ] || /opt/ortparts/ocrctl-$v export --checkpoint dummy:lightonocr-2-1b \
    --out /tmp/dummy-$v --precision fp16 --decoder gqa 2>&1 | tail -1
  python3 - /tmp/dummy-$v/ocrctl.json $v <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
for prec, parts in m["graphs"].items():
    for name, g in parts.items():
        ops = g.get("op_counts") or {}
        print(sys.argv[2], prec, name, sum(ops.values()), "nodes:",
              ", ".join(f"{k.split('.')[-1]} {n}" for k, n in sorted(ops.items(), key=lambda kv: -kv[1])[:9]))
PY
done
for round in $(seq 1 "${ROUNDS:-2}"); do
  for v in a b; do
    echo "== bench $v, round $round"
    /opt/ortparts/ocrctl-$v bench --model /tmp/dummy-$v --precision fp16 --decoder gqa --providers cuda \
      --strict-providers --cuda-graphs on --vision-stage on --sizes "${SIZES:-1092x1540,1540x1540}" \
      --new-tokens "${NEW_TOKENS:-512}" --runs 3 --batch-sizes "${BATCHES:-1,32,128}" \
      --json-out "$OUT/bench-$v-$round.json" 2>&1 | tee "$OUT/bench-$v-$round.txt" | tail -14
  done
done
rm -rf /tmp/prof && mkdir -p /tmp/prof
echo "== B profile, launch-blocking"
CUDA_LAUNCH_BLOCKING=1 OCRCTL_ORT_PROFILE=/tmp/prof/ $B bench --model /tmp/dummy-b --precision fp16 \
  --decoder gqa --providers cuda --strict-providers --cuda-graphs off --vision-stage off \
  --sizes 1092x1540 --new-tokens 32 --runs 3 --batch-sizes 1 2>&1 | grep -A2 "vision ms"
python3 scripts/ort_profile_summary.py /tmp/prof/vision_encoder*.json --top 14 --skip-runs 1 | tee "$OUT/vision-blocking.txt"
python3 scripts/ort_profile_summary.py /tmp/prof/decoder*.json --top 14 --skip-runs 4 --runs-under-ms 15 | tee "$OUT/decoder-blocking.txt"
