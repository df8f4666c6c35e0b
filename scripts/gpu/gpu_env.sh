# Sourced by the scripts/gpu/*.sh on the GPU machine (device tool), once the carrying recipe of
# ../shared/GPU.md has left ONNX Runtime's CUDA build in parts, and zstd, in /opt/ortparts:
# unpacks ONNX Runtime into /opt/ortgpu (once per machine) and points OCRCTL_ORT_LIB at it;
# `ocrctl_bin ZST NAME` unpacks a carried ocrctl build `.ortgpu/ZST` to /opt/ortparts/NAME (once)
# and prints that path; BIN is the build under test (.ortgpu/ocrctl.zst) unless already set;
# `export_with NAME BIN` exports the dummy full-size model with a build, `results_dir` and
# `pack_results` collect a script's files, `sweep` runs bench's batch sweep (below).
mkdir -p /opt/ortgpu "${OUT:-/tmp/out}"
export OCRCTL_ORT_LIB=/opt/ortgpu/onnxruntime/capi/libonnxruntime.so.1.31.1
[ -f "$OCRCTL_ORT_LIB" ] || cat /opt/ortparts/part-0* | /opt/ortparts/zstd -dc | tar xf - -C /opt/ortgpu
ocrctl_bin() {
  local dest=/opt/ortparts/$2
  [ -x "$dest" ] || { /opt/ortparts/zstd -dcq ".ortgpu/$1" -o "$dest" && chmod +x "$dest"; }
  echo "$dest"
}
BIN=${BIN:-$(ocrctl_bin ocrctl.zst ocrctl)}
# export_with NAME BIN: the dummy full-size model exported by BIN (precision PREC, fp16 by
# default; GQA decoder) to /tmp/dummy-NAME, once per machine.
export_with() {
  [ -d /tmp/dummy-$1 ] || $2 export --checkpoint dummy:lightonocr-2-1b --out /tmp/dummy-$1 \
    --precision "${PREC:-fp16}" --decoder gqa >/dev/null 2>&1 || echo "export $1 FAILED"
}
# results_dir sets R=/tmp/gpu-res, where a script's files collect (and P, the precision: PREC
# or fp16; it records the GPU in $R/gpu.txt); pack_results packs them into
# one $OUT/results.tgz (the device tool brings back a handful of files per call; packing after
# each step keeps what a call cut short had finished).
results_dir() {
  R=/tmp/gpu-res; mkdir -p "$R"
  P=${PREC:-fp16}
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$R/gpu.txt"
}
pack_results() {
  tar czf "$OUT/results.tgz.part" -C "$R" . && mv "$OUT/results.tgz.part" "$OUT/results.tgz"
}
# sweep NAME BIN MODEL [ARGS]: bench's batch sweep of MODEL (precision P, GQA, CUDA graphs
# on, A4 pages, NEW_TOKENS (1024) new tokens, BATCHES (32,128)) into $R/sweep-NAME.{txt,json};
# prints the sweep's rows and how many rows needed full logits.
sweep() {
  local name=$1 bin=$2 model=$3; shift 3
  $bin bench --model "$model" --precision "${P:-fp16}" --decoder gqa --providers cuda \
    --strict-providers --cuda-graphs on --sizes 1092x1540 --new-tokens "${NEW_TOKENS:-1024}" \
    --runs 1 --batch-sizes "${BATCHES:-32,128}" "$@" --json-out "$R/sweep-$name.json" \
    > "$R/sweep-$name.txt" 2>&1
  grep -E "^ +(batch|[0-9]+ +[0-9]+ )|needed full|GPU memory" "$R/sweep-$name.txt"
}
