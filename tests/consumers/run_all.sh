#!/usr/bin/env bash
# Runs every consumer check of issue 16 on one export folder, unchanged:
#   onnx.checker full check, transformers.js (fp32 fp16 q4 q4f16), fast-lightonocr (default fp16 q4).
#   tests/consumers/run_all.sh EXPORT_DIR        (PY: the venv python of requirements.txt)
# Prints each tool's JSON lines, then one summary line per check; exit status 1 if any failed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
export_dir=$(realpath "$1")
py=${PY:-python3}
fail=0
check() { local name=$1; shift; if "$@"; then echo "PASS $name"; else echo "FAIL $name"; fail=1; fi; }
check onnx.checker "$py" "$here/onnx_check.py" "$export_dir"
for d in fp32 fp16 q4 q4f16; do
  check "transformers.js $d" bash -c 'cd "$0/js" && node run.mjs "$1" "$2"' "$here" "$export_dir" "$d"
done
check fast-lightonocr "$py" "$here/fast_lightonocr_run.py" "$export_dir"
exit $fail
