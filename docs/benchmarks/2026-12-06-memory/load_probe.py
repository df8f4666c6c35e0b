#!/usr/bin/env python3
"""Load time and memory of one ONNX Runtime session whose weight is a large external file,
loaded from the file (ONNX Runtime memory-maps it) or from memory (what `ocrctl` does since
issue 42 N9: the file read into a buffer, `AddExternalInitializersFromFilesInMemory`).

The graph is `y = x · w`, `w` an fp32 `[R, R]` weight of `--mib` MiB at offset 0 of
`w.onnx_data` (page-aligned, so ONNX Runtime may map it). Each mode runs in a fresh process:
seconds to build the session, its peak RSS (VmHWM) and RSS after one run, anonymous and
file-backed. Needs numpy, onnx and onnxruntime (the repository's .venv).

    .venv/bin/python load_probe.py --mib 1024 --runs 3
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) // 1024
    return 0


def write_graph(d, mib):
    import onnx
    from onnx import TensorProto, helper
    r = int((mib * 2**20 / 4) ** 0.5)
    with open(os.path.join(d, "w.onnx_data"), "wb") as f:
        row = (b"\x00\x00\x80\x3f" * r)  # 1.0f
        for _ in range(r):
            f.write(row)
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[r, r])
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "w.onnx_data"), ("offset", "0"), ("length", str(4 * r * r))):
        e = w.external_data.add()
        e.key, e.value = k, v
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, r])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, r])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save_model(m, os.path.join(d, "w.onnx"))
    return r


def child(d, mode, r):
    import numpy as np
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    t = time.perf_counter()
    if mode == "memory":
        with open(os.path.join(d, "w.onnx_data"), "rb") as f:
            buf = f.read()
        so.add_external_initializers_from_files_in_memory(["w.onnx_data"], [buf], [len(buf)])
    s = ort.InferenceSession(os.path.join(d, "w.onnx"), so, providers=["CPUExecutionProvider"])
    buf = None
    load_s = time.perf_counter() - t
    peak_load = status("VmHWM")
    y = s.run(None, {"x": np.ones((1, r), np.float32)})[0]
    assert float(y[0, 0]) == float(r), y[0, 0]
    print(json.dumps({"mode": mode, "load_s": round(load_s, 2), "peak_load_mib": peak_load,
                      "rss_after_run_mib": status("VmRSS"),
                      "anon_mib": status("RssAnon"), "file_mib": status("RssFile")}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--child", nargs=3)
    a = p.parse_args()
    if a.child:
        return child(a.child[0], a.child[1], int(a.child[2]))
    with tempfile.TemporaryDirectory() as d:
        r = write_graph(d, a.mib)
        for _ in range(a.runs):
            for mode in ("file", "memory"):
                subprocess.run([sys.executable, __file__, "--child", d, mode, str(r)], check=True)


if __name__ == "__main__":
    main()
