#!/usr/bin/env bash
# Sets up what ocrctl needs at run time: a .venv in the repository holding
#  - the ONNX Runtime CPU wheel (ocrctl finds .venv/lib/python3*/site-packages/onnxruntime/capi/
#    libonnxruntime.so.* by itself),
#  - the pypdfium2 wheel, for PDF input (ocrctl finds .venv/lib/python3*/site-packages/
#    pypdfium2_raw/libpdfium.so by itself; only the shared library is used, not the Python code).
# Idempotent.
#
# Usage: scripts/setup.sh          run-time needs only
#        scripts/setup.sh --gpu    for an NVIDIA GPU: `onnxruntime-gpu` (CUDA 13 build, same
#                                  version; it runs on the CPU too) instead of `onnxruntime`,
#                                  with the CUDA 13 runtime, cuBLAS, cuRAND, cuFFT, NVRTC and
#                                  cuDNN 9 wheels (~1.5 GB); ocrctl loads those libraries from
#                                  .venv itself. Needs the NVIDIA driver (libcuda.so.1).
#                                  Also the TensorRT-RTX plugin provider
#                                  (onnxruntime-ep-nv-tensorrt-rtx-cu13, ~146 MB: the
#                                  `tensorrt-rtx` provider for GeForce RTX / RTX workstation
#                                  cards, sm86+).
#        scripts/setup.sh --trt-rtx  TensorRT-RTX's builder (tensorrt-rtx-cu13-libs and
#                                  -bindings, ~96 MB) for `ocrctl build-engines`; no GPU needed
#        scripts/setup.sh --test   also what the test suite needs: the `openai` Python
#                                  client in .venv, Debian's chromium (apt, as root) and
#                                  playwright-core (npm ci in tests/browser)
# Flags combine (`--gpu --test --trt-rtx`).
set -euo pipefail
cd "$(dirname "$0")/.."
GPU=0 TEST=0 TRTRTX=0
for a in "$@"; do
  case "$a" in
    --gpu) GPU=1 ;;
    --test) TEST=1 ;;
    --trt-rtx) TRTRTX=1 ;;
    *) echo "error: unknown option $a (use --gpu, --test, --trt-rtx)" >&2; exit 2 ;;
  esac
done
ORT_VERSION="${ORT_VERSION:-1.31.1}"
PDFIUM_VERSION="${PDFIUM_VERSION:-5.15.2}"
OPENAI_VERSION="${OPENAI_VERSION:-3.57.0}"
TRT_RTX_VERSION="${TRT_RTX_VERSION:-1.7.1.116}"
TRT_RTX_EP_VERSION="${TRT_RTX_EP_VERSION:-0.5.0}"
ONNX_VERSION="${ONNX_VERSION:-1.23.2}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
PIP=(.venv/bin/pip install --quiet --disable-pip-version-check)
# Version of an installed distribution, empty when absent.
dist_version() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || true; }
if [ "$GPU" = 1 ]; then
  # Both wheels install the same `onnxruntime` package: the CPU one goes first.
  if [ -n "$(dist_version onnxruntime)" ]; then
    .venv/bin/pip uninstall --quiet -y onnxruntime
  fi
  if [ "$(dist_version onnxruntime-gpu)" != "$ORT_VERSION" ] || [ -z "$(dist_version nvidia-cublas)" ]; then
    # The `cuda` extra has no cuBLAS (the provider links it): named here.
    "${PIP[@]}" "onnxruntime-gpu[cuda,cudnn]==$ORT_VERSION" "nvidia-cublas~=13.0"
  fi
  ls .venv/lib/python3*/site-packages/nvidia/cu13/lib/libcublasLt.so.13 >/dev/null
  ls .venv/lib/python3*/site-packages/nvidia/cudnn/lib/libcudnn.so.9 >/dev/null
  if [ "$(dist_version onnxruntime-ep-nv-tensorrt-rtx-cu13)" != "$TRT_RTX_EP_VERSION" ]; then
    # --no-deps: the plugin bundles TensorRT-RTX and cudart; its `onnxruntime` requirement is
    # met by onnxruntime-gpu (same package, other distribution name).
    "${PIP[@]}" --no-deps "onnxruntime-ep-nv-tensorrt-rtx-cu13==$TRT_RTX_EP_VERSION"
  fi
  ls .venv/lib/python3*/site-packages/onnxruntime_ep_nv_tensorrt_rtx/libonnxruntime_providers_nv_tensorrt_rtx.so >/dev/null
elif [ "$(dist_version onnxruntime-gpu)" != "$ORT_VERSION" ] && [ "$(dist_version onnxruntime)" != "$ORT_VERSION" ]; then
  # (an onnxruntime-gpu of the right version, from --gpu, serves the CPU as well)
  "${PIP[@]}" "onnxruntime==$ORT_VERSION"
fi
if ! .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('pypdfium2') != '$PDFIUM_VERSION')" 2>/dev/null; then
  .venv/bin/pip install --quiet --disable-pip-version-check --no-deps "pypdfium2==$PDFIUM_VERSION"
fi
ls .venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.* >/dev/null
ls .venv/lib/python3*/site-packages/pypdfium2_raw/libpdfium.* >/dev/null
echo "ONNX Runtime $ORT_VERSION$([ -n "$(dist_version onnxruntime-gpu)" ] && echo " (GPU build, CUDA 13)") and pypdfium2 $PDFIUM_VERSION (pdfium) ready in .venv"
if [ "$GPU" = 1 ]; then
  echo "check that CUDA starts: ocrctl doctor"
fi

if [ "$TRTRTX" = 1 ]; then
  if [ "$(dist_version tensorrt-rtx-cu13-bindings)" != "$TRT_RTX_VERSION" ] || [ "$(dist_version tensorrt-rtx-cu13-libs)" != "$TRT_RTX_VERSION" ]; then
    "${PIP[@]}" --no-deps "tensorrt-rtx-cu13-libs==$TRT_RTX_VERSION" "tensorrt-rtx-cu13-bindings==$TRT_RTX_VERSION"
  fi
  echo "TensorRT-RTX builder $(.venv/bin/python -c 'import tensorrt_rtx_bindings as t; print(t.__version__)') ready in .venv (ocrctl build-engines)"
fi

# The onnx package: the TensorRT-RTX builder writes EPContext models with it, and the paged
# decoder's CPU check (scripts/check_paged.py, tests/paged.rs) runs graphs with onnx.reference.
if [ "$TRTRTX" = 1 ] || [ "$TEST" = 1 ]; then
  if [ "$(dist_version onnx)" != "$ONNX_VERSION" ]; then
    "${PIP[@]}" "onnx==$ONNX_VERSION"
  fi
fi

if [ "$TEST" = 1 ]; then
  if ! .venv/bin/python -c "import openai" 2>/dev/null; then
    .venv/bin/pip install --quiet --disable-pip-version-check "openai==$OPENAI_VERSION"
  fi
  if ! command -v chromium >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      # A fresh machine may have no package lists yet.
      apt-get update -q >/dev/null
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null
    else
      echo "error: the browser test needs Debian's chromium: sudo apt-get install chromium" >&2
      exit 1
    fi
  fi
  if [ ! -d tests/browser/node_modules/playwright-core ]; then
    (cd tests/browser && npm ci --no-audit --no-fund --silent)
  fi
  echo "test tools ready: openai $(.venv/bin/python -c 'import openai; print(openai.__version__)'), $(chromium --version), playwright-core"
fi
