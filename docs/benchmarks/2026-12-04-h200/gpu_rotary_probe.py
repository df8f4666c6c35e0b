#!/usr/bin/env python3
"""Probe: ONNX Runtime's `com.microsoft.RotaryEmbedding` on the GPU, in the layouts the vision
encoder could hand it: is each one right on CUDA (against numpy), and what do its kernels cost?

The vision encoder rotates Q and K, `[1, S, 16·64]` at S = 8 580 patches for an A4 page, 48
times per page. ONNX Runtime's CUDA kernel launches one block per (position, head) with one
thread per channel, so 64-thread blocks at Pixtral's head size (4.1 ms per page,
docs/benchmarks/2026-12-04-h200 §1). Wider tables give it wider blocks: `group` heads per
block, interleaved pairs (channel 2i with 2i+1) so that no pair crosses a head, the tables'
rows repeated `group` times. Variants (name: heads per block, interleaved, position ids):
  today       1 head,  rotate-half, ids [1, S] into the [S, 32] table
  il-g1       1 head,  interleaved, ids [1, S]
  il-g4/8/16  4/8/16 heads, interleaved, ids [1, S] into [S, 32·group]
  il-g16-f0   16 heads, interleaved, one start position [0] (ONNX Runtime's "format 0")
  rh-f0       1 head,  rotate-half, start position [0]
Each variant's output is compared with numpy's rotation of the same inputs (in float32,
interleaved variants permuted back to the checkpoint's channel order) and its kernels timed
(CUPTI through torch.profiler, means over RUNS runs).

Usage (GPU machine): PYTHONPATH=/opt/ortgpu python3 docs/benchmarks/2026-12-04-h200/gpu_rotary_probe.py [S]
"""

import collections
import json
import os
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper
from torch.profiler import ProfilerActivity, profile

HEADS, HD = 16, 64
RUNS = int(os.environ.get("RUNS", "20"))


def graph(blocks, interleaved, width, fmt0):
    """One RotaryEmbedding node over x [1, S, HEADS·HD] with tables [S, width] as inputs."""
    node = helper.make_node(
        "RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain="com.microsoft",
        interleaved=int(interleaved), num_heads=blocks)
    f16 = TensorProto.FLOAT16
    g = helper.make_graph(
        [node], "rotary",
        [helper.make_tensor_value_info("x", f16, [1, "S", HEADS * HD]),
         helper.make_tensor_value_info("pos", TensorProto.INT64, [1] if fmt0 else [1, "S"]),
         helper.make_tensor_value_info("cos", f16, ["S", width]),
         helper.make_tensor_value_info("sin", f16, ["S", width])],
        [helper.make_tensor_value_info("y", f16, [1, "S", HEADS * HD])])
    m = helper.make_model(g, ir_version=9, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.microsoft", 1)])
    path = tempfile.mktemp(suffix=".onnx")
    onnx.save(m, path)
    return path


def reference(x, cos, sin):
    """Rotate-half per head of HD channels, angle table [S, HD/2], in float32."""
    s = x.shape[1]
    h = x.reshape(s, HEADS, HD).astype(np.float32)
    a, b = h[..., : HD // 2], h[..., HD // 2:]
    c, n = cos[:, None, :].astype(np.float32), sin[:, None, :].astype(np.float32)
    return np.concatenate([a * c - b * n, b * c + a * n], -1).reshape(1, s, HEADS * HD)


def interleave(t):
    """Within each head: channel i → 2i, channel i + HD/2 → 2i + 1 (and back: `unleave`)."""
    s = t.shape[1]
    h = t.reshape(s, HEADS, 2, HD // 2)
    return h.transpose(0, 1, 3, 2).reshape(1, s, HEADS * HD)


def unleave(t):
    s = t.shape[1]
    h = t.reshape(s, HEADS, HD // 2, 2)
    return h.transpose(0, 1, 3, 2).reshape(1, s, HEADS * HD)


def kernel_ms(run):
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(RUNS):
            run()
        torch.cuda.synchronize()
    path = tempfile.mktemp(suffix=".json")
    p.export_chrome_trace(path)
    per = collections.Counter()
    for e in json.load(open(path))["traceEvents"]:
        if e.get("cat") == "kernel":
            per[e["name"][:60]] += e["dur"] / 1e3 / RUNS
    return per


def main():
    s = int(sys.argv[1]) if len(sys.argv) > 1 else 8580
    torch.cuda.init()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, s, HEADS * HD)).astype(np.float16)
    angles = rng.random((s, HD // 2)) * 6.0
    cos, sin = np.cos(angles).astype(np.float16), np.sin(angles).astype(np.float16)
    want = reference(x, cos, sin)
    prov = [("CUDAExecutionProvider", {"device_id": 0})]
    variants = [("today", 16, False, False), ("il-g1", 16, True, False),
                ("il-g4", 4, True, False), ("il-g8", 2, True, False),
                ("il-g16", 1, True, False), ("il-g16-f0", 1, True, True),
                ("rh-f0", 16, False, True)]
    print(f"S = {s}, {HEADS} heads of {HD}, fp16; kernels: means over {RUNS} runs")
    for name, blocks, il, fmt0 in variants:
        group = HEADS // blocks
        sess = ort.InferenceSession(graph(blocks, il, HD // 2 * group, fmt0), providers=prov)
        xin = interleave(x) if il else x
        pos = np.zeros([1], np.int64) if fmt0 else np.arange(s, dtype=np.int64)[None, :]
        tc, ts = np.tile(cos, (1, group)), np.tile(sin, (1, group))
        b = sess.io_binding()
        for k, v in {"x": xin, "pos": pos, "cos": tc, "sin": ts}.items():
            b.bind_ortvalue_input(k, ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0))
        b.bind_output("y", "cuda", 0)
        sess.run_with_iobinding(b)
        got = b.copy_outputs_to_cpu()[0]
        got = unleave(got) if il else got
        err = float(np.abs(got.astype(np.float32) - want).max())
        per = kernel_ms(lambda: sess.run_with_iobinding(b))
        rot = sum(v for k, v in per.items() if "Rotary" in k)
        verdict = "ok" if err < 2e-2 else "WRONG"
        print(f"{name:10} max |err| {err:8.4f} {verdict:5}  rotary kernel {rot * 1e3:7.1f} µs"
              f"  ({', '.join(sorted(per))[:100]})")


if __name__ == "__main__":
    main()
