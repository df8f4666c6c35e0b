#!/usr/bin/env bash
# What does reading the weights into memory (issue 42 N9) cost a full-size load on the GPU
# machine? The dummy full-size model exported fp16 and int4-fp16; `bench` (CUDA, one page of
# 8 tokens) loads each RUNS times with the weights read (today) and mapped
# (OCRCTL_WEIGHTS_MAPPED=1, as before), alternating; prints load seconds and peak RSS.
cd "$(dirname "$0")/../../.." || exit 1
. scripts/gpu/gpu_env.sh
RUNS=${RUNS:-3}
for p in fp16 int4-fp16; do
  m=/tmp/load-$p
  [ -f $m/ocrctl.json ] || $BIN export --checkpoint dummy:lightonocr-2-1b --out $m \
    --precision $p >/dev/null 2>&1 || echo "export $p FAILED"
  du -sh $m | tr '\n' ' '; ls $m | tr '\n' ' '; echo
  for r in $(seq $RUNS); do
    for how in read mapped; do
      env $([ $how = mapped ] && echo OCRCTL_WEIGHTS_MAPPED=1) $BIN bench --model $m \
        --precision $p --providers cuda --strict-providers --sizes 1092x1540 --new-tokens 8 \
        --runs 1 --batch-sizes 1 --json-out /tmp/load.json > /tmp/load.txt 2>&1
      python3 - "$p" "$how" "$r" <<'PY'
import json, sys
j = json.load(open("/tmp/load.json"))
print(f"{sys.argv[1]:10} {sys.argv[2]:6} run {sys.argv[3]}: load {j['load_s']:.2f} s, peak RSS {j['peak_rss_mib']:.0f} MiB")
PY
    done
  done
done 2>&1 | tee "${OUT:-/tmp/out}/load.txt"
