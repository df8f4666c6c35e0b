#!/usr/bin/env bash
# Sets up what ocrctl needs at run time: a .venv in the repository holding
#  - the ONNX Runtime CPU wheel (ocrctl finds .venv/lib/python3*/site-packages/onnxruntime/capi/
#    libonnxruntime.so.* by itself),
#  - the pypdfium2 wheel, for PDF input (ocrctl finds .venv/lib/python3*/site-packages/
#    pypdfium2_raw/libpdfium.so by itself; only the shared library is used, not the Python code).
# Idempotent. Usage: scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ORT_VERSION="${ORT_VERSION:-1.31.1}"
PDFIUM_VERSION="${PDFIUM_VERSION:-5.15.2}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
if ! .venv/bin/python -c "import onnxruntime, sys; sys.exit(onnxruntime.__version__ != '$ORT_VERSION')" 2>/dev/null; then
  .venv/bin/pip install --quiet --disable-pip-version-check "onnxruntime==$ORT_VERSION"
fi
if ! .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('pypdfium2') != '$PDFIUM_VERSION')" 2>/dev/null; then
  .venv/bin/pip install --quiet --disable-pip-version-check --no-deps "pypdfium2==$PDFIUM_VERSION"
fi
ls .venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.* >/dev/null
ls .venv/lib/python3*/site-packages/pypdfium2_raw/libpdfium.* >/dev/null
echo "ONNX Runtime $ORT_VERSION and pypdfium2 $PDFIUM_VERSION (pdfium) ready in .venv"
