#!/usr/bin/env python3
"""GPU time per CUDA kernel of an export's vision encoder and decoder prefill (issue 9.4).

ONNX Runtime's own profiler records each node's host-side span, which on a GPU is the launch
(asynchronous) or the launch plus a wait (CUDA_LAUNCH_BLOCKING=1), not the kernels' time.
This runs the graphs through onnxruntime-gpu's Python API inside torch.profiler, whose CUPTI
tracing records every kernel of the process, ONNX Runtime's included, with its device start
and duration. Per graph: wall ms per run, the kernels' summed ms per run, and the kernels
grouped by name, largest first.

Run on the GPU machine with the torch venv's Python and ONNX Runtime's GPU package on the path:
  PYTHONPATH=/opt/ortgpu /opt/torch/.venv/bin/python scripts/gpu/gpu_kernels.py MODEL_DIR OUT_DIR \
      [--size 1092x1540] [--precision fp16] [--runs 5] [--top 14] [--disable-optimizers LIST]
      [--decode-batch N [--context 2700]]
MODEL_DIR is an ocrctl export with the GQA decoder; the prefill's prompt is the page's image
tokens plus 28 text positions, its cache the prompt plus 1024 positions, bound on the device.
`--decode-batch N` also profiles one decode step of N rows, each `--context` positions long.
"""
import argparse
import collections
import json
import os
import time

import numpy as np
import onnxruntime as ort
import torch
from torch.profiler import ProfilerActivity, profile

SUFFIX = {"fp32": "", "fp16": "_fp16", "int4": "_q4", "int4-fp16": "_q4f16"}


def kernels(trace_path, runs):
    """Kernel events of a chrome trace, summed per name, in ms per run."""
    events = json.load(open(trace_path))["traceEvents"]
    per = collections.Counter()
    count = collections.Counter()
    for e in events:
        if e.get("cat") == "kernel":
            per[e["name"]] += e["dur"] / 1e3 / runs
            count[e["name"]] += 1
    return per, count


def report(name, wall_ms, trace_path, runs, top):
    per, count = kernels(trace_path, runs)
    total = sum(per.values())
    print(f"== {name}: wall {wall_ms:.2f} ms per run, kernels {total:.2f} ms per run "
          f"({sum(count.values()) // runs} launches per run)")
    for k, ms in per.most_common(top):
        print(f"{ms:8.3f} ms {100 * ms / total:5.1f}% x{count[k] // runs:<4} {k[:110]}")


def timed(run, runs, out, tag):
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        t = time.perf_counter()
        for _ in range(runs):
            run()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) * 1e3 / runs
    path = os.path.join(out, f"{tag}.trace.json")
    p.export_chrome_trace(path)
    return wall, path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--size", default="1092x1540")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--decode-batch", type=int, default=0,
                    help="also a decode step of this many rows (0: none)")
    ap.add_argument("--context", type=int, default=2700,
                    help="positions each decode row holds after the step")
    ap.add_argument("--disable-optimizers", default="",
                    help="ONNX Runtime transformers to leave out, as ocrctl does for an 8-bit "
                         "KV cache: GroupQueryAttentionPreNormFusion")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.cuda.init()
    w, h = (int(v) for v in a.size.split("x"))
    sfx = SUFFIX[a.precision]
    prov = [("CUDAExecutionProvider", {"device_id": 0, "use_tf32": 0})]
    opts = ort.SessionOptions()
    if a.disable_optimizers:
        opts.add_session_config_entry("optimization.disable_specified_optimizers",
                                      a.disable_optimizers)

    vis = ort.InferenceSession(f"{a.model}/onnx/vision_encoder{sfx}.onnx", opts, providers=prov)
    pix = np.random.default_rng(0).random((1, 3, h, w), dtype=np.float32)
    feats = vis.run(None, {"pixel_values": pix})[0]
    wall, path = timed(lambda: vis.run(None, {"pixel_values": pix}), a.runs, a.out, "vision")
    report(f"vision_encoder{sfx} {w}x{h}", wall, path, a.runs, a.top)

    dec = ort.InferenceSession(f"{a.model}/onnx/decoder_model_gqa{sfx}.onnx", opts, providers=prov)
    s = feats.shape[1] + 28
    run = bound_run(dec, rows=1, query=s, total=s, cap=s + 1024)
    wall, path = timed(run, a.runs, a.out, "prefill")
    report(f"decoder_model_gqa{sfx} prefill of {s} positions", wall, path, a.runs, a.top)
    if a.decode_batch:
        n, ctx = a.decode_batch, a.context
        run = bound_run(dec, rows=n, query=1, total=ctx, cap=ctx + 1)
        wall, path = timed(run, a.runs, a.out, "decode")
        report(f"decoder_model_gqa{sfx} decode step, {n} rows at {ctx} positions", wall, path,
               a.runs, a.top)


def bound_run(dec, rows, query, total, cap):
    """A run of the GQA decoder for `rows` sequences of `query` new positions each, `total`
    positions long after it, over a cache of `cap` positions allocated on the device (left
    uninitialised: the timing does not depend on its values) and bound as input and output."""
    ins = {i.name: i for i in dec.get_inputs()}
    hidden = ins["inputs_embeds"].shape[-1]
    dt = np.float16 if "16" in ins["inputs_embeds"].type else np.float32
    emb = np.random.default_rng(1).standard_normal((rows, query, hidden)).astype(dt) * 0.02
    b = dec.io_binding()
    b.bind_cpu_input("inputs_embeds", emb)
    b.bind_cpu_input("seqlens_k", np.full([rows], total - 1, np.int32))
    b.bind_cpu_input("total_sequence_length", np.array(total, np.int32))
    # numpy has no float8: ONNX's element type number (TensorProto.FLOAT8E4M3FN) instead.
    cache_type = {"tensor(float16)": np.float16, "tensor(float)": np.float32,
                  "tensor(int8)": np.int8, "tensor(float8e4m3fn)": 17}
    for n, i in ins.items():
        if n.startswith("past_key_values."):
            shape = [rows, i.shape[1], cap, i.shape[3]]
            v = ort.OrtValue.ortvalue_from_shape_and_type(shape, cache_type[i.type], "cuda", 0)
            b.bind_ortvalue_input(n, v)
            b.bind_ortvalue_output(n.replace("past_key_values", "present"), v)
    for o in dec.get_outputs():
        if not o.name.startswith("present."):
            b.bind_output(o.name, "cuda", 0)
    return lambda: dec.run_with_iobinding(b)

if __name__ == "__main__":
    main()
