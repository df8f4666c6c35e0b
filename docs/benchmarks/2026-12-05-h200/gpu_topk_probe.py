#!/usr/bin/env python3
"""Probe: the sampling candidates' TopK (64 of 151 936 logits a row) in stages of small slices.

A decode step at batch 256 spends 1.75 ms in ONNX Runtime's `RadixTopK` (13 % of an fp8-cache
step, docs/benchmarks/2026-12-04-h200/ §8): one block a row, several passes over 151 936
values. ONNX Runtime's CUDA TopK sorts a row in shared memory (`BitonicTopK`) when the row has
at most 256 values. So: cut each row into slices of 256, take the 64 best of each slice,
then of each 256 of those survivors, and so on until one slice is left. Under TopK's order
(larger first, lower index first among equals) the best 64 of the survivors are the best 64 of
the row, so the staged graph gives the same values and ids as one TopK wherever each stage
keeps that order.

Prints, per batch: one TopK against the staged graph (median ms over RUNS, every tensor on the
device), and whether their values and ids are equal, on random logits and on logits with many
ties (rounded to steps of 1/8). On the CPU (no CUDA) it checks equality only.

Usage: PYTHONPATH=/opt/ortgpu python3 docs/benchmarks/2026-12-05-h200/gpu_topk_probe.py [BATCHES=1,64,256]
Knobs: VOCAB (151936), K (64), SLICES (256,1024,8192: one staged graph each), RUNS (50).
"""

import os
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

VOCAB = int(os.environ.get("VOCAB", "151936"))
K = int(os.environ.get("K", "64"))
SLICES = [int(v) for v in os.environ.get("SLICES", "256,1024,8192").split(",")]
RUNS = int(os.environ.get("RUNS", "50"))


def single():
    nodes = [helper.make_node("TopK", ["x", "k"], ["values", "ids"], axis=-1)]
    return model(nodes, [numpy_helper.from_array(np.array([K], np.int64), "k")])


def staged(slice_width):
    """TopK in stages of `slice_width`-wide slices; the ids of each stage gathered back to the row's."""
    nodes, inits = [], [numpy_helper.from_array(np.array([K], np.int64), "k")]
    c = lambda name, arr: inits.append(numpy_helper.from_array(np.asarray(arr), name))  # noqa: E731
    vals, ids, width, stage = "x", None, VOCAB, 0
    while width > slice_width:
        n = -(-width // slice_width)
        p = f"s{stage}"
        c(f"{p}_pad", np.array([0, 0, 0, n * slice_width - width], np.int64))
        c(f"{p}_shape", np.array([-1, slice_width], np.int64))
        c(f"{p}_back", np.array([-1, n * K], np.int64))
        c(f"{p}_offsets", (np.arange(n, dtype=np.int64) * slice_width).reshape(n, 1))
        c(f"{p}_rows", np.array([-1, n, K], np.int64))
        c(f"{p}_low", np.array(np.finfo(np.float32).min, np.float32))
        nodes += [
            helper.make_node("Pad", [vals, f"{p}_pad", f"{p}_low"], [f"{p}_padded"]),
            helper.make_node("Reshape", [f"{p}_padded", f"{p}_shape"], [f"{p}_slices"]),
            helper.make_node("TopK", [f"{p}_slices", "k"], [f"{p}_v", f"{p}_i"], axis=-1),
            helper.make_node("Reshape", [f"{p}_i", f"{p}_rows"], [f"{p}_i3"]),
            helper.make_node("Add", [f"{p}_i3", f"{p}_offsets"], [f"{p}_at3"]),
            helper.make_node("Reshape", [f"{p}_at3", f"{p}_back"], [f"{p}_at"]),
            helper.make_node("Reshape", [f"{p}_v", f"{p}_back"], [f"{p}_vals"]),
        ]
        if ids is None:
            ids = f"{p}_at"
        else:
            nodes.append(helper.make_node("GatherElements", [ids, f"{p}_at"], [f"{p}_ids"], axis=1))
            ids = f"{p}_ids"
        vals, width, stage = f"{p}_vals", n * K, stage + 1
    nodes.append(helper.make_node("TopK", [vals, "k"], ["values", "last"], axis=-1))
    nodes.append(helper.make_node("GatherElements", [ids, "last"], ["ids"], axis=1))
    return model(nodes, inits)


def model(nodes, inits):
    g = helper.make_graph(
        nodes, "topk",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", VOCAB])],
        [helper.make_tensor_value_info("values", TensorProto.FLOAT, ["B", K]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, ["B", K])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.checker.check_model(m)
    return m.SerializeToString()


def cuda():
    return "CUDAExecutionProvider" in ort.get_available_providers()


def timed(sess, x):
    """Median ms of RUNS runs after 3, input and outputs on the device."""
    io = sess.io_binding()
    io.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0))
    io.bind_output("values", "cuda")
    io.bind_output("ids", "cuda")
    times = []
    for i in range(RUNS + 3):
        io.synchronize_inputs()
        t = time.perf_counter()
        sess.run_with_iobinding(io)
        io.synchronize_outputs()
        if i >= 3:
            times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times))


def main():
    batches = [int(b) for b in (sys.argv[1] if len(sys.argv) > 1 else "1,64,256").split(",")]
    eps = ["CUDAExecutionProvider"] if cuda() else ["CPUExecutionProvider"]
    so = ort.SessionOptions()
    so.log_severity_level = 3
    one = ort.InferenceSession(single(), so, providers=eps)
    staged_graphs = {w: staged(w) for w in SLICES}
    many = {w: ort.InferenceSession(g, so, providers=eps) for w, g in staged_graphs.items()}
    stages = {w: sum(n.op_type == "TopK" for n in onnx.load_from_string(g).graph.node)
              for w, g in staged_graphs.items()}
    print(f"onnxruntime {ort.__version__} on {eps[0]}, vocab {VOCAB}, k {K}; TopK stages per "
          f"slice width: {stages}", flush=True)
    rng = np.random.default_rng(0)
    for b in batches:
        x = (rng.standard_normal((b, VOCAB)) * 3).astype(np.float32)
        ties = np.round(x * 8) / 8
        a = {name: one.run(None, {"x": d}) for name, d in (("random", x), ("ties", ties))}
        line = f"B={b}:"
        if cuda():
            line += f" one TopK {timed(one, x):.3f} ms;"
        for w, sess in many.items():
            line += f" slices of {w}:"
            for name, data in (("random", x), ("ties", ties)):
                s = sess.run(None, {"x": data})
                line += (f" {name} values {'equal' if np.array_equal(a[name][0], s[0]) else 'DIFFER'}"
                         f" ids {'equal' if np.array_equal(a[name][1], s[1]) else 'DIFFER'},")
            if cuda():
                line += f" {timed(sess, x):.3f} ms;"
        print(line, flush=True)


if __name__ == "__main__":
    main()
