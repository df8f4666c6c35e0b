"""Probe: an exported GQA decoder's decode step timed outside ocrctl (ONNX Runtime's Python API
on the GPU machine), to tell a slow graph from a slow binding.

For each model directory given: the decoder graph (decoder_model_gqa_*.onnx) in a CUDA session,
every past_key_values.* input and its present.* output bound to one device buffer of
[B, kv heads, MAXLEN, head] in the graph's cache type (as ocrctl binds them), seqlens_k = CTX
for every row, total_sequence_length CTX + 1, random input embeddings; prints the median of
RUNS decode steps per batch size. The cache's contents are zeros: a step's time does not
depend on them.

Usage (GPU machine, after scripts/gpu/gpu_env.sh): PYTHONPATH=/opt/ortgpu python3
docs/benchmarks/2026-12-03-kv-cache/gpu_kv_decoder_probe.py B[,B...] MODEL_DIR [MODEL_DIR...]
(OPT=basic|extended: ONNX Runtime's optimization level; DISABLE=A,B: optimizers left out; PROBE_DEVICE=cpu runs it on the CPU provider, to check the script itself.)
"""

import glob
import os
import statistics
import sys
import time

import numpy as np
import onnx

import onnxruntime as ort

CTX = int(os.environ.get("CTX", "2173"))
MAXLEN = int(os.environ.get("MAXLEN", CTX + 64))
RUNS = int(os.environ.get("RUNS", "10"))
DEV = os.environ.get("PROBE_DEVICE", "cuda")
EP = "CUDAExecutionProvider" if DEV == "cuda" else "CPUExecutionProvider"


def probe(model_dir, batches):
    path = sorted(glob.glob(os.path.join(model_dir, "onnx", "decoder_model_gqa_*.onnx")))[0]
    graph = onnx.load(path, load_external_data=False).graph
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if os.environ.get("OPT") == "basic":
        # ONNX Runtime's basic graph optimizations only (no fusions, no layout changes).
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    if os.environ.get("OPT") == "extended":
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    off = [x for x in os.environ.get("DISABLE", "").split(",") if x]
    sess = ort.InferenceSession(path, so, providers=[EP], disabled_optimizers=off or None)
    ins = {i.name: i for i in graph.input}
    hidden = ins["inputs_embeds"].type.tensor_type.shape.dim[2].dim_value
    past = [n for n in ins if n.startswith("past_key_values.")]
    ct = ins[past[0]].type.tensor_type.elem_type
    dims = ins[past[0]].type.tensor_type.shape.dim
    kvh, hd = dims[1].dim_value, dims[3].dim_value
    rng = np.random.default_rng(0)
    for b in batches:
        shape = [b, kvh, MAXLEN, hd]
        caches = {n: ort.OrtValue.ortvalue_from_shape_and_type(shape, ct, DEV, 0) for n in past}
        dev = lambda x: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(x), DEV, 0)
        io = sess.io_binding()
        io.bind_ortvalue_input("inputs_embeds",
                               dev(rng.standard_normal((b, 1, hidden)).astype(np.float16)))
        io.bind_ortvalue_input("seqlens_k", dev(np.full(b, CTX, np.int32)))
        io.bind_cpu_input("total_sequence_length", np.array(CTX + 1, np.int32))
        for n, v in caches.items():
            io.bind_ortvalue_input(n, v)
            io.bind_ortvalue_output(n.replace("past_key_values.", "present."), v)
        for o in sess.get_outputs():
            if not o.name.startswith("present."):
                io.bind_output(o.name, DEV)
        print(f"{model_dir} cache type {ct} B={b}: decode step {timed(sess, io):.2f} ms "
              f"(median of {RUNS})", flush=True)


def timed(sess, io):
    """The median of RUNS runs of `io`, after two untimed ones, in milliseconds."""
    times = []
    for _ in range(RUNS + 2):
        t = time.perf_counter()
        sess.run_with_iobinding(io)
        io.synchronize_outputs()
        times.append(time.perf_counter() - t)
    return statistics.median(times[2:]) * 1e3


def main():
    batches = [int(x) for x in sys.argv[1].split(",")]
    for d in sys.argv[2:]:
        probe(d, batches)


if __name__ == "__main__":
    main()
