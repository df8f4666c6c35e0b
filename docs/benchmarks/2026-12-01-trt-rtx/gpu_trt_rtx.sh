#!/usr/bin/env bash
# TensorRT-RTX on the GPU machine (issue 13): what the plugin provider does there. Carried
# beforehand into /opt/trtrtx: ep.part-* (the onnxruntime-ep-nv-tensorrt-rtx-cu13 package,
# tar + zstd, split), ort-cpu.zst (the plain ONNX Runtime 1.31.1 library: the plugin needs no
# GPU build), ocrctl.zst, fx.tar.zst (the fixture exported --target tensorrt int4-fp16 with
# `build-engines --profile 16gb` run), zstd. Prints: the GPU, /sys/class/drm, `ocrctl doctor`
# with the plugin registered normally and as `.virtual`, and `ocr` with tensorrt-rtx first
# (fallback) and alone (strict).
set -u
D=/opt/trtrtx
Z=$D/zstd
mkdir -p $D/site
[ -d $D/site/onnxruntime_ep_nv_tensorrt_rtx ] || cat $D/ep.part-* | $Z -dc | tar -C $D/site -x
[ -f $D/libonnxruntime.so.1.31.1 ] || $Z -dcq $D/ort-cpu.zst -o $D/libonnxruntime.so.1.31.1
[ -x $D/ocrctl ] || { $Z -dcq $D/ocrctl.zst -o $D/ocrctl && chmod +x $D/ocrctl; }
[ -d $D/fx ] || $Z -dc $D/fx.tar.zst | tar -C $D -x
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv
ls -d /sys/class/drm 2>&1; ls /dev/nvidia* 2>&1 | head -3
export OCRCTL_ORT_LIB=$D/libonnxruntime.so.1.31.1
export OCRCTL_TRT_RTX_EP=$D/site/onnxruntime_ep_nv_tensorrt_rtx/libonnxruntime_providers_nv_tensorrt_rtx.so
echo "== doctor"; $D/ocrctl doctor 2>&1 | head -8
echo "== doctor, registered as NvTensorRTRTX.virtual"
OCRCTL_TRT_RTX_VIRTUAL=1 $D/ocrctl doctor 2>&1 | grep -i "tensorrt-rtx"
IMG=tests/fixtures/tiny-lightonocr/images/aligned.png
echo "== ocr, profile 16gb (tensorrt-rtx first, prebuilt engines recorded)"
$D/ocrctl ocr --model $D/fx --profile 16gb --max-tokens 8 --temperature 0 $IMG 2>&1 | tail -6
echo "== ocr, tensorrt-rtx only (strict)"
$D/ocrctl ocr --model $D/fx --precision int4-fp16 --providers tensorrt-rtx --strict-providers --max-tokens 8 $IMG 2>&1 | tail -3
echo "== ocr, tensorrt-rtx only (strict), .virtual"
OCRCTL_TRT_RTX_VIRTUAL=1 $D/ocrctl ocr --model $D/fx --precision int4-fp16 --providers tensorrt-rtx --strict-providers --max-tokens 8 $IMG 2>&1 | tail -3
