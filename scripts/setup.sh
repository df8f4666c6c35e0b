#!/usr/bin/env bash
# Sets up what ocrctl needs at run time: a .venv in the repository holding
#  - the ONNX Runtime CPU wheel (ocrctl finds .venv/lib/python3*/site-packages/onnxruntime/capi/
#    libonnxruntime.so.* by itself),
#  - the pypdfium2 wheel, for PDF input (ocrctl finds .venv/lib/python3*/site-packages/
#    pypdfium2_raw/libpdfium.so by itself; only the shared library is used, not the Python code).
# Idempotent.
#
# Usage: scripts/setup.sh          run-time needs only
#        scripts/setup.sh --test   also what the test suite needs: the `openai` Python
#                                  client in .venv, Debian's chromium (apt, as root) and
#                                  playwright-core (npm ci in tests/browser)
set -euo pipefail
cd "$(dirname "$0")/.."
ORT_VERSION="${ORT_VERSION:-1.31.1}"
PDFIUM_VERSION="${PDFIUM_VERSION:-5.15.2}"
OPENAI_VERSION="${OPENAI_VERSION:-3.57.0}"
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

if [ "${1:-}" = "--test" ]; then
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
