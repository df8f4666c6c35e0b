#!/usr/bin/env bash
# An 8-bit KV cache (`ocrctl export --kv-cache fp8|int8`) on the GPU machine (device tool).
# Steps (STEP, in order; each adds its files to $OUT/results.tgz):
#   probe    docs/benchmarks/2026-12-03-kv-cache/gpu_kv_quant_probe.py: one GroupQueryAttention node, fp16 / int8 / fp8
#            caches with and without padded query heads (kernel choice, error, time).
#   fixture  the fixture (fp16 graphs, CUDA, greedy, 40 tokens past EOS, top-5 logprobs)
#            against the transformers goldens: the fp16 cache, then fp8, then int8 at
#            INT8_SCALE, CUDA graphs off and on (check_golden's lines: ids equal or the first
#            step where they differ, and the largest top-5 |Δlogprob|).
#   sweep    the dummy full-size model (fp16 graphs, GQA, CUDA graphs on, A4, NEW_TOKENS):
#            the fp16 cache at FP16_BATCHES, the fp8 cache at FP8_BATCHES, in one call.
#   diagnose the fp8 sweep (FP8_BATCHES, 1,256 here) watched: bench's progress lines, the
#            GPU's utilization every 10 s, and past WATCH_S (240) seconds each thread's wait
#            channel before it is stopped (docs/benchmarks/2026-12-03-kv-cache/).
#   graphs   the probe's node with its decode steps in a CUDA graph, and the fp8 export's
#            batch-256 steps with CUDA graphs off and on (NEW_TOKENS 64).
#   profile  ONNX Runtime's profile of batch-64 decode steps, fp8 cache against fp16.
#   decoder  the exported decoders' decode steps timed outside ocrctl (fp8 against fp16).
#   bisect   the fp8 decoder's first attention node alone in variants, and the decoder with
#            ONNX Runtime's basic optimizations only (batch 64).
#   check    both decoders' batch-64 steps with and without ONNX Runtime's query/key-norm
#            fusion into the attention node.
#   race     the fixture RUNS (8) times per cache (int8, fp8, fp16), CUDA graphs off/on,
#            vision stage on/off, under scripts/gpu/capture_shim.c (every stream capture and
#            failing device synchronisation logged with thread and library): which thread
#            captures when a page fails with "operation not permitted when stream is capturing".
#            Knobs: RACE_CACHES (int8 fp8 auto), RACE_GRAPHS (off on), RACE_VISION (on off).
#            The shim: .ortgpu/capture_shim.so carried (cc -shared -fPIC -O1 -o
#            .ortgpu/capture_shim.so scripts/gpu/capture_shim.c -ldl), else built there with cc.
#   baseline the fp8 cache against the transformers reference in the same call
#            (scripts/gpu/bench_transformers.py: bf16 SDPA, random weights, the same A4 page):
#            batches 1 and 8, TF_TOKENS (256) new tokens.
#   warmup   `serve` with the dummy fp16-cache model, without and with --warm-up 1092x1540:
#            the first three one-token A4 requests' latency after /health says ready.
# Needs ONNX Runtime's GPU parts and .ortgpu/ocrctl.zst, carried as for scripts/gpu/gpu_ab.sh.
# Knobs: STEP (probe fixture sweep; diagnose on request), INT8_SCALE (0.1), FP16_BATCHES (1,256),
# FP8_BATCHES (1,128,256,512), NEW_TOKENS (1024).
set -uo pipefail
OUT=${OUT:-/tmp/out}
. scripts/gpu/gpu_env.sh
results_dir
FX=tests/fixtures/tiny-lightonocr
# The dummy full-size model with an fp8 cache in /tmp/dummy-fp8, once per machine.
export_fp8() {
  [ -d /tmp/dummy-fp8 ] || $BIN export --checkpoint dummy:lightonocr-2-1b --out /tmp/dummy-fp8 \
    --precision fp16 --decoder gqa --kv-cache fp8 >/dev/null 2>&1 || echo "export fp8 FAILED"
}
for step in ${STEP:-probe fixture sweep}; do
  echo "=== $step"
  case $step in
  probe)
    PYTHONPATH=/opt/ortgpu python3 docs/benchmarks/2026-12-03-kv-cache/gpu_kv_quant_probe.py 1,128,256 2>&1 \
      | grep -v Warning | tee "$R/probe.txt"
    ;;
  fixture)
    for kv in auto fp8 "int8 --kv-scale ${INT8_SCALE:-0.1}"; do
      name=${kv%% *}
      rm -rf /tmp/fixture-kv-$name
      # shellcheck disable=SC2086
      $BIN export --checkpoint $FX/checkpoint --out /tmp/fixture-kv-$name --precision fp16 \
        --decoder gqa --kv-cache $kv >/dev/null || echo "export $name FAILED"
      for graphs in off on; do
        echo "== cache $name, CUDA graphs $graphs" | tee -a "$R/fixture.txt"
        $BIN ocr --model /tmp/fixture-kv-$name --decoder gqa --precision fp16 --providers cuda \
          --strict-providers --cuda-graphs $graphs --max-tokens 40 --ignore-eos \
          --temperature 0 --top-logprobs 5 --json --quiet --batch-size 5 $FX/images/* \
          2>>"$R/fixture-$name.log" \
          | python3 scripts/gpu/check_golden.py $FX/golden/golden.json 0.05 2>&1 \
          | tee -a "$R/fixture.txt"
      done
    done
    ;;
  diagnose)
    # The fp8 sweep under a watch: bench logs each phase as it ends; every 10 s the GPU's
    # utilization and memory; past WATCH_S (240) seconds the threads' kernel wait channels
    # (a host-side wait reads futex_wait with an idle GPU; a spinning kernel keeps the GPU
    # at 100 %), then the run is stopped.
    t0=$(date +%s); export_fp8; echo "fp8 export: $(( $(date +%s) - t0 )) s"
    t0=$(date +%s)
    BATCHES=${FP8_BATCHES:-1,256} sweep fp8-cache "$BIN" /tmp/dummy-fp8 &
    wpid=$!
    while kill -0 $wpid 2>/dev/null; do
      sleep 10
      el=$(( $(date +%s) - t0 ))
      echo "$el s: $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader)" \
        >> "$R/diagnose-gpu.txt"
      if [ $el -gt "${WATCH_S:-240}" ]; then
        pid=$(pgrep -f "dummy-fp8 --precision" | head -1)
        for t in /proc/$pid/task/*; do
          echo "$(cat $t/comm) $(cat $t/wchan) $(cut -d' ' -f3 $t/stat)"
        done | sort | uniq -c > "$R/diagnose-threads.txt"
        kill $pid; echo "stopped after $el s" >> "$R/diagnose-gpu.txt"
        break
      fi
    done
    wait $wpid
    echo "fp8 sweep: $(( $(date +%s) - t0 )) s"; tail -3 "$R/diagnose-gpu.txt"
    cat "$R/diagnose-threads.txt" 2>/dev/null
    grep "bench " "$R/sweep-fp8-cache.txt"
    ;;
  graphs)
    # Does a CUDA graph capture change the attention kernel of an 8-bit cache? The probe's
    # node with its decode steps captured (GRAPH=1), then the fp8 export's short sweep at
    # batch 256 with CUDA graphs off and on (NEW_TOKENS 64 here).
    GRAPH=1 CTX=2173 PYTHONPATH=/opt/ortgpu python3 docs/benchmarks/2026-12-03-kv-cache/gpu_kv_quant_probe.py 1,256 2>&1 \
      | grep -v Warning | tee "$R/probe-graph.txt"
    export_fp8
    for g in off on; do
      $BIN bench --model /tmp/dummy-fp8 --precision fp16 --decoder gqa --providers cuda \
        --strict-providers --cuda-graphs $g --sizes 1092x1540 --new-tokens "${NEW_TOKENS:-64}" \
        --runs 1 --batch-sizes 256 > "$R/graphs-$g.txt" 2>&1
      echo "graphs $g: $(grep 'bench batch' "$R/graphs-$g.txt")"
    done
    ;;
  profile)
    # Where a batch-64 decode step's time goes, fp8 cache against fp16: ONNX Runtime's
    # profiler with launch blocking (node times are then kernel times), CUDA graphs off.
    export_fp8
    export_with b "$BIN"
    for m in fp8 b; do
      rm -rf /tmp/prof-$m; mkdir -p /tmp/prof-$m
      CUDA_LAUNCH_BLOCKING=1 OCRCTL_ORT_PROFILE=/tmp/prof-$m/ $BIN bench --model /tmp/dummy-$m \
        --precision fp16 --decoder gqa --providers cuda --strict-providers --cuda-graphs off \
        --vision-stage off --sizes 1092x1540 --new-tokens 16 --runs 1 --batch-sizes 64 \
        > "$R/profile-$m.txt" 2>&1
      python3 scripts/ort_profile_summary.py /tmp/prof-$m/decoder*.json --decode-rows 64 \
        --top 15 2>&1 | tee "$R/profile-$m-decode64.txt"
    done
    ;;
  decoder)
    # The exported decoders' decode steps outside ocrctl (docs/benchmarks/2026-12-03-kv-cache/gpu_kv_decoder_probe.py),
    # fp8 cache against fp16, to tell a slow graph from a slow binding.
    export_fp8
    export_with b "$BIN"
    PYTHONPATH=/opt/ortgpu python3 docs/benchmarks/2026-12-03-kv-cache/gpu_kv_decoder_probe.py 1,64,256 /tmp/dummy-fp8 \
      /tmp/dummy-b 2>&1 | grep -v Warning | tee "$R/decoder-probe.txt"
    ;;
  check)
    # ONNX Runtime's query/key-norm fusion into the attention node (left out for 8-bit
    # caches by ocrctl, see KV8_DISABLED_OPTIMIZERS): both decoders' batch-64 steps with and
    # without it.
    export_fp8
    export_with b "$BIN"
    for m in fp8 b; do
      for off in "" GroupQueryAttentionPreNormFusion; do
        echo "${off:-all optimizations}: $(DISABLE=$off PYTHONPATH=/opt/ortgpu python3 \
          docs/benchmarks/2026-12-03-kv-cache/gpu_kv_decoder_probe.py 64 /tmp/dummy-$m 2>&1 | grep -v Warning | tail -1)"
      done
    done | tee "$R/check.txt"
    ;;
  bisect)
    # The exported fp8 decoder's first attention node alone, in variants
    # (docs/benchmarks/2026-12-03-kv-cache/gpu_kv_node_bisect.py), and the whole decoder with basic optimizations only.
    export_fp8
    PYTHONPATH=/opt/ortgpu python3 docs/benchmarks/2026-12-03-kv-cache/gpu_kv_node_bisect.py 64 /tmp/dummy-fp8 2>&1 \
      | grep -v Warning | tee "$R/bisect.txt"
    OPT=basic PYTHONPATH=/opt/ortgpu python3 docs/benchmarks/2026-12-03-kv-cache/gpu_kv_decoder_probe.py 64 /tmp/dummy-fp8 \
      2>&1 | grep -v Warning | tee -a "$R/bisect.txt"
    ;;
  race)
    shim=/opt/ortparts/capture_shim.so
    cp .ortgpu/capture_shim.so $shim 2>/dev/null || cc -shared -fPIC -O1 -o $shim \
      scripts/gpu/capture_shim.c -ldl
    for name in ${RACE_CACHES:-int8 fp8 auto}; do
      kv=$name; [ "$name" = int8 ] && kv="int8 --kv-scale ${INT8_SCALE:-0.1}"
      # shellcheck disable=SC2086
      [ -d /tmp/fixture-kv-$name ] || $BIN export --checkpoint $FX/checkpoint \
        --out /tmp/fixture-kv-$name --precision fp16 --decoder gqa --kv-cache $kv >/dev/null
      for graphs in ${RACE_GRAPHS:-off on}; do
        for vs in ${RACE_VISION:-on off}; do
          failed=0
          for i in $(seq "${RUNS:-8}"); do
            log=$R/race-$name-g$graphs-v$vs-$i.log
            LD_PRELOAD=$shim $BIN ocr --model /tmp/fixture-kv-$name --decoder gqa \
              --precision fp16 --providers cuda --strict-providers --cuda-graphs $graphs \
              --vision-stage $vs --max-tokens 40 --ignore-eos --temperature 0 --json --quiet \
              --batch-size 5 $FX/images/* >/dev/null 2>"$log"
            if grep -q "^error" "$log"; then failed=$((failed + 1)); else rm "$log"; fi
          done
          echo "cache $name, graphs $graphs, vision stage $vs: $failed of ${RUNS:-8} runs lost a page" \
            | tee -a "$R/race.txt"
        done
      done
    done
    for f in "$R"/race-*.log; do
      [ -f "$f" ] || continue
      echo "== $f"; grep -E "capture_shim|^error" "$f" | tail -12
    done | tee -a "$R/race.txt"
    ;;
  baseline)
    export_fp8
    $BIN bench --model /tmp/dummy-fp8 --precision fp16 --decoder gqa --providers cuda \
      --strict-providers --cuda-graphs on --sizes 1092x1540 --new-tokens "${TF_TOKENS:-256}" \
      --runs 1 --batch-sizes 1,8 --json-out "$R/baseline-fp8.json" > "$R/baseline-fp8.txt" 2>&1
    grep -E "^ +(batch|[0-9]+ +[0-9]+ )" "$R/baseline-fp8.txt"
    python3 scripts/gpu/bench_transformers.py --size 1092x1540 --new-tokens "${TF_TOKENS:-256}" \
      --batches 1,8 > "$R/baseline-transformers.json" 2> "$R/baseline-transformers.err"
    tail -2 "$R/baseline-transformers.err"; cat "$R/baseline-transformers.json"
    ;;
  warmup)
    export_with b "$BIN"
    python3 -c "from PIL import Image, ImageDraw; im = Image.new('RGB', (1092, 1540), 'white')
d = ImageDraw.Draw(im)
for y in range(60, 1500, 40): d.rectangle([60, y, 1030, y + 12], fill='black')
im.save('/tmp/a4.png')"
    for w in "" 1092x1540; do
      [ -n "$w" ] && export OCRCTL_WARM_UP=$w
      $BIN serve --model /tmp/dummy-b --precision fp16 --decoder gqa \
        --providers cuda --cuda-graphs on --port 18080 2>"$R/warmup-${w:-none}.log" &
      pid=$!
      t0=$(date +%s%N)
      until curl -sf localhost:18080/health >/dev/null; do sleep 0.2; kill -0 $pid || break; done
      echo "warm-up '${w:-none}': ready after $(( ($(date +%s%N) - t0) / 1000000 )) ms" \
        | tee -a "$R/warmup.txt"
      for n in first second third; do
        echo "$n request: $(python3 scripts/load.py --url http://127.0.0.1:18080 \
          --image /tmp/a4.png --requests 1 --concurrency 1 --max-tokens 1 --json)" \
          | tee -a "$R/warmup.txt"
      done
      kill -TERM $pid; wait $pid
    done
    ;;
  sweep)
    export_with b "$BIN"
    export_fp8
    BATCHES=${FP8_BATCHES:-1,128,256,512} sweep fp8-cache "$BIN" /tmp/dummy-fp8
    pack_results
    BATCHES=${FP16_BATCHES:-1,256} sweep fp16-cache "$BIN" /tmp/dummy-b
    ;;
  esac
  pack_results
done
