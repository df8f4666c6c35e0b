"""Probe: the first GroupQueryAttention node of an exported GQA decoder, alone, in variants —
to find what makes the exported node slower than docs/benchmarks/2026-12-03-kv-cache/gpu_kv_quant_probe.py's own node.

The node is copied with its attributes and initializers (RoPE tables, KV scale) into a one-node
model whose query/key/value are inputs; variants: as exported; without the `scale` attribute;
with RoPE tables cut to MAXLEN rows; with a fresh scale initializer per input. Each is timed
over decode steps at batch B (seqlens_k = CTX, total CTX + 1, zero cache) as the probes do.

Usage (GPU machine): PYTHONPATH=/opt/ortgpu python3 docs/benchmarks/2026-12-03-kv-cache/gpu_kv_node_bisect.py B MODEL_DIR
"""

import glob
import os
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper

import onnxruntime as ort

# The cache's size, the runs and the device are the decoder probe's (same environment knobs).
from gpu_kv_decoder_probe import CTX, DEV, EP, MAXLEN, timed


def one_node(model, variant):
    g = model.graph
    node = next(n for n in g.node if n.op_type == "GroupQueryAttention")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}
    if variant == "no-scale-attr":
        attrs.pop("scale", None)
    inits = {i.name: i for i in g.initializer}
    ins = {i.name: i for i in g.input}
    nh, kvh = attrs["num_heads"], attrs["kv_num_heads"]
    past = ins[node.input[3]]
    ct = past.type.tensor_type.elem_type
    hd = past.type.tensor_type.shape.dim[3].dim_value
    names = list(node.input)
    names[0], names[1], names[2] = "query", "key", "value"
    names[3], names[4] = "past_key", "past_value"
    names[5], names[6] = "seqlens_k", "total_sequence_length"
    new_inits = []
    for i, n in enumerate(names):
        if n in inits:
            t = inits[n]
            if variant == "short-rope" and i in (7, 8):
                a = numpy_helper.to_array(t, base_dir=MODEL_DIR_ONNX)[:MAXLEN]
                t = numpy_helper.from_array(a, n)
            if variant == "two-scales" and i == 13:
                t = onnx.TensorProto(); t.CopyFrom(inits[n]); t.name = n + "_v"
                names[13] = t.name
            new_inits.append(t)
    # Initializers stored outside the file: load their data.
    for t in new_inits:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            a = numpy_helper.to_array(t, base_dir=MODEL_DIR_ONNX)
            t.CopyFrom(numpy_helper.from_array(a, t.name))
    new_inits = list({t.name: t for t in new_inits}.values())
    vi = helper.make_tensor_value_info
    inputs = [
        vi("query", onnx.TensorProto.FLOAT16, ["B", 1, nh * hd]),
        vi("key", onnx.TensorProto.FLOAT16, ["B", 1, kvh * hd]),
        vi("value", onnx.TensorProto.FLOAT16, ["B", 1, kvh * hd]),
        vi("past_key", ct, ["B", kvh, "M", hd]),
        vi("past_value", ct, ["B", kvh, "M", hd]),
        vi("seqlens_k", onnx.TensorProto.INT32, ["B"]),
        vi("total_sequence_length", onnx.TensorProto.INT32, []),
    ]
    outputs = [vi("output", onnx.TensorProto.FLOAT16, ["B", 1, nh * hd]),
               vi("present_key", ct, ["B", kvh, "M", hd]),
               vi("present_value", ct, ["B", kvh, "M", hd])]
    n = helper.make_node("GroupQueryAttention", names, ["output", "present_key", "present_value"],
                         domain="com.microsoft", **attrs)
    m = helper.make_model(helper.make_graph([n], "gqa", inputs, outputs, new_inits),
                          opset_imports=[helper.make_opsetid("", 17),
                                         helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 9
    return m.SerializeToString(), nh, kvh, hd, ct


def time_it(blob, b, nh, kvh, hd, ct):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(blob, so, providers=[EP])
    rng = np.random.default_rng(0)
    dev = lambda x: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(x), DEV, 0)
    kc = ort.OrtValue.ortvalue_from_shape_and_type([b, kvh, MAXLEN, hd], ct, DEV, 0)
    vc = ort.OrtValue.ortvalue_from_shape_and_type([b, kvh, MAXLEN, hd], ct, DEV, 0)
    io = sess.io_binding()
    io.bind_ortvalue_input("query", dev(rng.standard_normal((b, 1, nh * hd)).astype(np.float16)))
    io.bind_ortvalue_input("key", dev(rng.standard_normal((b, 1, kvh * hd)).astype(np.float16)))
    io.bind_ortvalue_input("value", dev(rng.standard_normal((b, 1, kvh * hd)).astype(np.float16)))
    io.bind_ortvalue_input("past_key", kc)
    io.bind_ortvalue_input("past_value", vc)
    io.bind_ortvalue_input("seqlens_k", dev(np.full(b, CTX, np.int32)))
    io.bind_cpu_input("total_sequence_length", np.array(CTX + 1, np.int32))
    io.bind_output("output", DEV)
    io.bind_ortvalue_output("present_key", kc)
    io.bind_ortvalue_output("present_value", vc)
    return timed(sess, io)


def main():
    global MODEL_DIR_ONNX
    b = int(sys.argv[1])
    MODEL_DIR_ONNX = os.path.join(sys.argv[2], "onnx")
    path = sorted(glob.glob(os.path.join(MODEL_DIR_ONNX, "decoder_model_gqa_*.onnx")))[0]
    model = onnx.load(path, load_external_data=False)
    for variant in ["as-exported", "no-scale-attr", "short-rope", "two-scales"]:
        try:
            blob, nh, kvh, hd, ct = one_node(model, variant)
            print(f"B={b} {variant}: {time_it(blob, b, nh, kvh, hd, ct):.3f} ms", flush=True)
        except Exception as e:  # noqa: BLE001 - a probe reports every failure and goes on
            print(f"B={b} {variant}: FAILED {str(e).splitlines()[0][:300]}", flush=True)


if __name__ == "__main__":
    main()
