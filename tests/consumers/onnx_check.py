"""Runs onnx.checker.check_model(path, full_check=True) on every .onnx of an export (issue 16).

    python onnx_check.py EXPORT_DIR

Prints one JSON line per graph: {file, ok, error}; exit status 0 iff every graph passes.
"""

import json
import sys
from pathlib import Path

import onnx


def main():
    ok = True
    for path in sorted(Path(sys.argv[1]).glob("onnx/*.onnx")):
        try:
            # A path (not a loaded proto) lets the checker resolve the .onnx_data files.
            onnx.checker.check_model(str(path), full_check=True)
            print(json.dumps({"file": path.name, "ok": True}))
        except Exception as e:  # noqa: BLE001 - the error text is the result
            ok = False
            msg = str(e).strip().splitlines()
            print(json.dumps({"file": path.name, "ok": False, "error": f"{type(e).__name__}: {msg[0] if msg else ''}",
                              "detail": "\n".join(msg[1:4])}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
