#!/usr/bin/env bash
# Does a session on CUDA keep its export's .onnx_data mapped once loaded (issue 42 N9: a
# replaced file SIGBUSes whoever still maps it)? The full-size dummy export (int4-fp16) served
# on CUDA and on the CPU with the weights left to ONNX Runtime's map (OCRCTL_WEIGHTS_MAPPED=1):
# the .onnx_data mappings in /proc/PID/maps after load and after one request; then, on CUDA,
# every .onnx_data truncated and a second request (answered, or the server died).
cd "$(dirname "$0")/../../.." || exit 1
. scripts/gpu/gpu_env.sh
m=/tmp/load-int4-fp16
[ -f $m/ocrctl.json ] || $BIN export --checkpoint dummy:lightonocr-2-1b --out $m \
  --precision int4-fp16 >/dev/null 2>&1 || echo "export FAILED"
rm -rf /tmp/maps-copy && cp -r $m /tmp/maps-copy
python3 -c "from PIL import Image; Image.new('RGB',(600,800),'white').save('/tmp/page.png')"
body() { python3 - <<'PY'
import base64, json
b = base64.b64encode(open("/tmp/page.png", "rb").read()).decode()
print(json.dumps({"max_tokens": 4, "messages": [{"role": "user", "content": [
  {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b}}]}]}))
PY
}
body > /tmp/body.json
ask() { curl -s -o /dev/null -w "%{http_code}" -m 120 -H 'Content-Type: application/json' \
  --data @/tmp/body.json http://127.0.0.1:8111/v1/chat/completions; }
for prov in cuda cpu; do
  OCRCTL_WEIGHTS_MAPPED=1 $BIN serve --model /tmp/maps-copy --precision int4-fp16 --providers $prov \
    --port 8111 > /tmp/maps-$prov.log 2>&1 &
  pid=$!
  for i in $(seq 240); do curl -sf http://127.0.0.1:8111/health >/dev/null && break; sleep 0.5; done
  echo "$prov: after load $(grep -c onnx_data /proc/$pid/maps) .onnx_data mappings"
  echo "$prov: request $(ask), then $(grep -c onnx_data /proc/$pid/maps) mappings"
  grep onnx_data /proc/$pid/maps | awk '{print $6}' | sort | uniq -c
  if [ $prov = cuda ]; then
    for f in /tmp/maps-copy/onnx/*.onnx_data; do : > "$f"; done
    echo "$prov: weights truncated; request $(ask); server $(kill -0 $pid 2>/dev/null && echo alive || echo DEAD)"
  fi
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
  rm -rf /tmp/maps-copy && cp -r $m /tmp/maps-copy
done 2>&1 | tee "${OUT:-/tmp/out}/maps.txt"
tail -3 /tmp/maps-cuda.log
