"""Probe: does ONNX Runtime's CUDA GroupQueryAttention (the wheel on the GPU machine) take an
int8 or fp8 KV cache for LightOnOCR's attention shape, how close is its output to the fp16
cache's, and what does a decode step's attention cost at large batches?

LightOnOCR's decoder has 16 query heads over 8 KV heads (group 2, head 128). GQA's int8/fp8
decode kernel (XQA) takes groups of 4, 8, 16 or 32 query heads only, so the quantized runs pad
the queries to 32 heads (group 4): query head j of the model sits at (j // 2) * 4 + j % 2 and
the padding heads are zeros, whose outputs are dropped. A decode step's attention reads the
cache (bound by memory); the padding heads only add arithmetic.

For each configuration: a prompt of CTX tokens per row (B rows, first prompt, timed: median of
PREFILL_RUNS after the first;
cache written), then decode steps of one token per row at position CTX, timed (median of
RUNS), and the decode output compared with the fp16-cache run on the same inputs.

GRAPH=1 runs the decode steps as a captured CUDA graph (`enable_cuda_graph`, the prompt runs
uncaptured with gpu_graph_id -1 and the steps with id 1, as ocrctl does): the timed runs are
replays of the third run's capture, which shows the kernel chosen while capturing.

Usage (GPU machine, after scripts/gpu/gpu_env.sh): PYTHONPATH=/opt/ortgpu python3
docs/benchmarks/2026-12-03-kv-cache/gpu_kv_quant_probe.py [B,...] -- prints one line per configuration.
"""

import statistics
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper

import onnxruntime as ort

HQ, HKV, D = 16, 8, 128
CTX = int(__import__("os").environ.get("CTX", "2700"))
RUNS = int(__import__("os").environ.get("RUNS", "20"))
# Prompt runs timed (the first, which plans kernels, is left out of the median).
PREFILL_RUNS = int(__import__("os").environ.get("PREFILL_RUNS", "6"))
# The cache's capacity, and the total_sequence_length a decode step passes: CTX + 1 by default;
# DECODE_TOTAL=max passes MAXLEN, as ocrctl's decode steps do (fixed for CUDA graphs).
MAXLEN = int(__import__("os").environ.get("MAXLEN", CTX + 64))
DECODE_TOTAL = __import__("os").environ.get("DECODE_TOTAL", "")
# PROBE_DEVICE=cpu checks the script itself on a machine without a GPU.
DEV = __import__("os").environ.get("PROBE_DEVICE", "cuda")
EP = "CUDAExecutionProvider" if DEV == "cuda" else "CPUExecutionProvider"
GRAPH = DEV == "cuda" and __import__("os").environ.get("GRAPH") == "1"


def run_options(graph_id):
    """Run options for a captured (graph_id > 0) or an uncaptured run (-1) under GRAPH=1."""
    ro = ort.RunOptions()
    if GRAPH:
        ro.add_run_config_entry("gpu_graph_id", str(graph_id))
    return ro

CACHE_TYPES = {"fp16": TensorProto.FLOAT16, "int8": TensorProto.INT8,
               "fp8": TensorProto.FLOAT8E4M3FN}


def gqa_model(hq, cache, scale):
    """One GroupQueryAttention node: fp16 activations, a `cache` KV cache, RoPE on."""
    ct = CACHE_TYPES[cache]
    inputs = [
        helper.make_tensor_value_info("query", TensorProto.FLOAT16, ["B", "S", hq * D]),
        helper.make_tensor_value_info("key", TensorProto.FLOAT16, ["B", "S", HKV * D]),
        helper.make_tensor_value_info("value", TensorProto.FLOAT16, ["B", "S", HKV * D]),
        helper.make_tensor_value_info("past_key", ct, ["B", HKV, MAXLEN, D]),
        helper.make_tensor_value_info("past_value", ct, ["B", HKV, MAXLEN, D]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
        helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
    ]
    inv = 1.0 / (1e6 ** (np.arange(0, D, 2, dtype=np.float64) / D))
    ang = np.arange(MAXLEN)[:, None] * inv[None, :]
    inits = [
        helper.make_tensor("cos_cache", TensorProto.FLOAT16, [MAXLEN, D // 2],
                           np.cos(ang).astype(np.float16).tobytes(), raw=True),
        helper.make_tensor("sin_cache", TensorProto.FLOAT16, [MAXLEN, D // 2],
                           np.sin(ang).astype(np.float16).tobytes(), raw=True),
    ]
    names = ["query", "key", "value", "past_key", "past_value", "seqlens_k",
             "total_sequence_length", "cos_cache", "sin_cache"]
    attrs = dict(num_heads=hq, kv_num_heads=HKV, do_rotary=1, domain="com.microsoft")
    if cache != "fp16":
        inits.append(helper.make_tensor("kv_scale", TensorProto.FLOAT, [1], [scale]))
        # position_ids, attention_bias, head_sink absent; k_scale and v_scale one tensor
        # (XQA wants the same pointer for both).
        names += ["", "", "", "kv_scale", "kv_scale"]
        attrs.update(k_quant_type="PER_TENSOR", v_quant_type="PER_TENSOR",
                     kv_cache_bit_width=8)
    node = helper.make_node("GroupQueryAttention", names,
                            ["output", "present_key", "present_value"], **attrs)
    outputs = [
        helper.make_tensor_value_info("output", TensorProto.FLOAT16, ["B", "S", hq * D]),
        helper.make_tensor_value_info("present_key", ct, ["B", HKV, MAXLEN, D]),
        helper.make_tensor_value_info("present_value", ct, ["B", HKV, MAXLEN, D]),
    ]
    graph = helper.make_graph([node], "gqa", inputs, outputs, inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 9
    return m.SerializeToString()


def pad_heads(x, hq):
    """[B, S, 16*D] → [B, S, hq*D], query head j at (j // 2) * (hq // 8) + j % 2."""
    if hq == HQ:
        return x
    b, s, _ = x.shape
    g = hq // HKV
    out = np.zeros((b, s, hq, D), np.float16)
    src = x.reshape(b, s, HQ, D)
    for j in range(HQ):
        out[:, :, (j // 2) * g + j % 2] = src[:, :, j]
    return out.reshape(b, s, hq * D)


def unpad_heads(y, hq):
    if hq == HQ:
        return y
    b, s, _ = y.shape
    g = hq // HKV
    src = y.reshape(b, s, hq, D)
    return np.stack([src[:, :, (j // 2) * g + j % 2] for j in range(HQ)], 2).reshape(b, s, -1)


def run(b, hq, cache, scale, data):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    ep = (EP, {"enable_cuda_graph": "1"}) if GRAPH else EP
    sess = ort.InferenceSession(gqa_model(hq, cache, scale), so, providers=[ep])
    ct = {"fp16": np.float16, "int8": np.int8}.get(cache)
    shape = [b, HKV, MAXLEN, D]
    if ct is None:
        kc = ort.OrtValue.ortvalue_from_shape_and_type(shape, TensorProto.FLOAT8E4M3FN, DEV, 0)
        vc = ort.OrtValue.ortvalue_from_shape_and_type(shape, TensorProto.FLOAT8E4M3FN, DEV, 0)
    else:
        kc = ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, ct), DEV, 0)
        vc = ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, ct), DEV, 0)

    def bind(q, k, v, seqlens, total):
        # Inputs uploaded once, so that the timed runs are the kernel's work.
        dev = lambda x: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(x), DEV, 0)
        io = sess.io_binding()
        io.bind_ortvalue_input("query", dev(pad_heads(q, hq)))
        io.bind_ortvalue_input("key", dev(k))
        io.bind_ortvalue_input("value", dev(v))
        io.bind_ortvalue_input("past_key", kc)
        io.bind_ortvalue_input("past_value", vc)
        io.bind_ortvalue_input("seqlens_k", dev(seqlens))
        io.bind_cpu_input("total_sequence_length", np.array(total, np.int32))
        io.bind_output("output", DEV)
        io.bind_ortvalue_output("present_key", kc)
        io.bind_ortvalue_output("present_value", vc)
        return io

    pq, pk, pv, dq, dk, dv = data
    io = bind(pq, pk, pv, np.full(b, CTX - 1, np.int32), CTX)
    ptimes = []
    for _ in range(PREFILL_RUNS):
        t = time.perf_counter()
        sess.run_with_iobinding(io, run_options(-1))
        io.synchronize_outputs()
        ptimes.append(time.perf_counter() - t)
    prefill = unpad_heads(io.copy_outputs_to_cpu()[0], hq)
    io = bind(dq, dk, dv, np.full(b, CTX, np.int32), MAXLEN if DECODE_TOTAL == "max" else CTX + 1)
    times = []
    for _ in range(RUNS + 3):
        t = time.perf_counter()
        sess.run_with_iobinding(io, run_options(1))
        io.synchronize_outputs()
        times.append(time.perf_counter() - t)
    decode = unpad_heads(io.copy_outputs_to_cpu()[0], hq)
    return prefill, decode, statistics.median(times[3:]) * 1e3, \
        statistics.median(ptimes[1:] or ptimes) * 1e3


def main():
    batches = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "1,128,256").split(",")]
    print("ort", ort.__version__, ort.get_device(), "CTX", CTX, "MAXLEN", MAXLEN,
          "decode total", DECODE_TOTAL or "CTX+1", "CUDA graph" if GRAPH else "")
    rng = np.random.default_rng(0)
    for b in batches:
        # Unit-scale keys and values; 8 random rows tiled to B (rows are independent, and
        # drawing B x CTX x 4096 numbers would take longer than the runs).
        def draw(s, w):
            x = rng.standard_normal((min(b, 8), s, w), np.float32).astype(np.float16)
            return np.ascontiguousarray(np.tile(x, (-(-b // x.shape[0]), 1, 1))[:b])
        pq, pk, pv = draw(CTX, HQ * D), draw(CTX, HKV * D), draw(CTX, HKV * D)
        dq, dk, dv = draw(1, HQ * D), draw(1, HKV * D), draw(1, HKV * D)
        data = (pq, pk, pv, dq, dk, dv)
        ref = None
        for hq, cache, scale in [(16, "fp16", 1.0), (32, "fp16", 1.0), (32, "int8", 5.0 / 127),
                                 (32, "fp8", 1.0), (16, "int8", 5.0 / 127), (16, "fp8", 1.0)]:
            try:
                pre, dec, ms, pms = run(b, hq, cache, scale, data)
            except Exception as e:  # noqa: BLE001 - a probe reports every failure and goes on
                print(f"B={b} heads={hq} cache={cache}: FAILED {str(e).splitlines()[0][:300]}")
                continue
            if ref is None:
                ref = (pre, dec)
            dp = np.abs(pre.astype(np.float32) - ref[0].astype(np.float32)).max()
            dd = np.abs(dec.astype(np.float32) - ref[1].astype(np.float32))
            rel = dd.max() / np.abs(ref[1].astype(np.float32)).max()
            print(f"B={b} heads={hq} cache={cache}: decode attention {ms:.3f} ms "
                  f"(median of {RUNS}), prefill {pms:.3f} ms, max|d| {dp:.4f}, decode max|d| {dd.max():.4f} "
                  f"mean|d| {dd.mean():.5f} rel {rel:.4f}", flush=True)


if __name__ == "__main__":
    main()
