#!/usr/bin/env python3
"""A whole decoder step, paged (`decoder_model_paged`) against GQA slots (`decoder_model_gqa`),
on an export of the dummy full-size model with both (`ocrctl export --checkpoint
dummy:lightonocr-2-1b --precision fp16 --decoder gqa,paged`), on the GPU machine.

For each batch B: B sequences of CTX cached positions each take one decode token, every input
and output bound to device memory and the step replayed from a CUDA graph (as ocrctl's GQA
steps run); median of RUNS. The GQA cache is B slots of CTX + 64 positions (ocrctl passes the
slot length as `total_sequence_length` in captured steps); the paged pool holds exactly the
blocks the B sequences need. Then, uncaptured: one A4 prompt (2 173 positions) alone through
each, and through the paged decoder together with the B decode tokens in one call (what a
continuous batch would run when a page joins). Caches are left uninitialised (timing only;
`scripts/check_paged.py --device cuda` checks values). The two caches are not held at once.

Usage: PYTHONPATH=/opt/ortgpu python3 scripts/gpu/gpu_paged_decoder_bench.py EXPORT [B,...]
Knobs: CTX (2700), RUNS (30), BLOCK (256), PROMPT (2173).
"""

import os
import statistics
import sys
import time

import numpy as np

import onnxruntime as ort

RUNS = int(os.environ.get("RUNS", "30"))
CTX = int(os.environ.get("CTX", "2700"))
BLOCK = int(os.environ.get("BLOCK", "256"))
PROMPT = int(os.environ.get("PROMPT", "2173"))
OUTPUTS = ["logits", "next_token", "top_logits", "top_ids", "logsumexp"]


def timed(sess, io, graph_id):
    """Median wall time of RUNS runs after 3, ms (replays of a capture when the session has
    CUDA graphs and `graph_id` > 0)."""
    ro = ort.RunOptions()
    if graph_id > 0:
        ro.add_run_config_entry("gpu_graph_id", str(graph_id))
    times = []
    for _ in range(RUNS + 3):
        t = time.perf_counter()
        sess.run_with_iobinding(io, ro)
        io.synchronize_outputs()
        times.append(time.perf_counter() - t)
    return statistics.median(times[3:]) * 1e3


def session(path, graphs):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    opts = {"enable_cuda_graph": "1"} if graphs else {}
    return ort.InferenceSession(path, so, providers=[("CUDAExecutionProvider", opts)])


def dev(x):
    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(x), "cuda", 0)


def empty(shape, elem):
    return ort.OrtValue.ortvalue_from_shape_and_type(shape, elem, "cuda", 0)


def kv_inputs(sess):
    """The cache inputs' names, (KV heads, head size) and the embeddings' width."""
    kv, heads, width = [], None, None
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values."):
            kv.append(i.name)
            # GQA: [B, kv_heads, max_seq, head]; paged: [blocks, block_size, kv_heads, head].
            kvh = i.shape[1] if isinstance(i.shape[1], int) else i.shape[2]
            heads = (kvh, i.shape[3])
        if i.name == "inputs_embeds":
            width = i.shape[-1]
    return kv, heads, width


def bind_common(io, caches, names):
    for name in names:
        io.bind_ortvalue_input(name, caches[name])
        io.bind_ortvalue_output("present" + name[len("past_key_values"):], caches[name])
    for o in OUTPUTS:
        io.bind_output(o, "cuda")


def gqa(path, b, rng):
    graphs = session(path, True)
    names, (kvh, hd), width = kv_inputs(graphs)
    cap = CTX + 64
    caches = {n: empty([b, kvh, cap, hd], np.float16) for n in names}
    io = graphs.io_binding()
    io.bind_ortvalue_input("inputs_embeds", dev(rng.standard_normal((b, 1, width)).astype(np.float16)))
    io.bind_ortvalue_input("seqlens_k", dev(np.full(b, CTX, np.int32)))
    io.bind_cpu_input("total_sequence_length", np.array(cap, np.int32))
    bind_common(io, caches, names)
    step = timed(graphs, io, 1)
    del io, graphs
    plain = session(path, False)
    io = plain.io_binding()
    x = dev(rng.standard_normal((1, PROMPT, width)).astype(np.float16))
    io.bind_ortvalue_input("inputs_embeds", x)
    io.bind_ortvalue_input("seqlens_k", dev(np.array([PROMPT - 1], np.int32)))
    io.bind_cpu_input("total_sequence_length", np.array(PROMPT, np.int32))
    one = {n: empty([1, kvh, cap, hd], np.float16) for n in names}
    bind_common(io, one, names)
    prompt = timed(plain, io, -1)
    return step, prompt


def paged(path, b, rng):
    graphs = session(path, True)
    names, (kvh, hd), width = kv_inputs(graphs)
    elem = np.float16
    per_seq = -(-(CTX + 1) // BLOCK)
    prompt_blocks = -(-PROMPT // BLOCK)
    blocks = b * per_seq + prompt_blocks
    caches = {n: empty([blocks, BLOCK, kvh, hd], elem) for n in names}
    table = np.arange(b * per_seq, dtype=np.int32).reshape(b, per_seq)

    def io_for(sess, embeds, news, pasts, tab):
        io = sess.io_binding()
        cu = np.concatenate([[0], np.cumsum(news)]).astype(np.int32)
        io.bind_ortvalue_input("inputs_embeds", dev(embeds))
        io.bind_ortvalue_input("cumulative_sequence_length", dev(cu))
        io.bind_ortvalue_input("past_seqlens", dev(np.array(pasts, np.int32)))
        io.bind_ortvalue_input("block_table", dev(tab))
        bounds = [max(news), max(p + n for p, n in zip(pasts, news))]
        io.bind_cpu_input("attention_metadata", np.array(bounds, np.int32))
        bind_common(io, caches, names)
        return io

    x = rng.standard_normal((1, b, width)).astype(np.float16)
    step = timed(graphs, io_for(graphs, x, [1] * b, [CTX] * b, table), 1)
    del graphs
    plain = session(path, False)
    p = rng.standard_normal((1, PROMPT, width)).astype(np.float16)
    alone_table = np.arange(b * per_seq, blocks, dtype=np.int32)[None]
    prompt = timed(plain, io_for(plain, p, [PROMPT], [0], alone_table), -1)
    # The B decode tokens and the prompt in one call (the prompt's row padded to per_seq).
    mixed_table = np.zeros((b + 1, max(per_seq, prompt_blocks)), np.int32)
    mixed_table[:b, :per_seq] = table
    mixed_table[b, :prompt_blocks] = alone_table[0]
    both = np.concatenate([x, p], 1)
    mixed = timed(plain, io_for(plain, both, [1] * b + [PROMPT], [CTX] * b + [0], mixed_table), -1)
    return step, prompt, mixed


def main():
    path = sys.argv[1]
    batches = [int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "1,64,256").split(",")]
    onnx_dir = os.path.join(path, "onnx")
    gqa_path = os.path.join(onnx_dir, "decoder_model_gqa_fp16.onnx")
    paged_path = os.path.join(onnx_dir, "decoder_model_paged_fp16.onnx")
    print("onnxruntime", ort.__version__, "CTX", CTX, "BLOCK", BLOCK, "PROMPT", PROMPT, flush=True)
    rng = np.random.default_rng(0)
    for b in batches:
        for name, f in (("gqa", gqa), ("paged", paged)):
            try:
                r = f(gqa_path if name == "gqa" else paged_path, b, rng)
            except Exception as e:  # noqa: BLE001 - a benchmark reports every failure and goes on
                print(f"B={b} {name}: FAILED {str(e).splitlines()[0][:300]}", flush=True)
                continue
            line = f"B={b} {name}: decode step {r[0]:.3f} ms (graph replay), prompt {r[1]:.3f} ms"
            if len(r) > 2:
                line += f", decode tokens + prompt in one call {r[2]:.3f} ms"
            print(line + f" (medians of {RUNS})", flush=True)


if __name__ == "__main__":
    main()
