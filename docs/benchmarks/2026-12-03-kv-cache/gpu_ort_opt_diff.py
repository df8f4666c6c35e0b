"""What ONNX Runtime's graph optimizations change in a graph on the GPU machine: the graph
optimized at two levels (basic and extended, CUDA provider), then the node counts per op type
that differ and the first GroupQueryAttention node of each (inputs, attributes, producers).

Usage (GPU machine): PYTHONPATH=/opt/ortgpu python3 docs/benchmarks/2026-12-03-kv-cache/gpu_ort_opt_diff.py MODEL.onnx
(PROBE_DEVICE=cpu for the CPU provider.)
"""

import collections
import os
import sys

import onnx

import onnxruntime as ort

DEV = os.environ.get("PROBE_DEVICE", "cuda")
EP = "CUDAExecutionProvider" if DEV == "cuda" else "CPUExecutionProvider"


def optimized(path, level, tag):
    out = f"/tmp/opt-{tag}.onnx"
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = level
    so.optimized_model_filepath = out
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                f"opt-{tag}.bin")
    so.add_session_config_entry(
        "session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    ort.InferenceSession(path, so, providers=[EP])
    return onnx.load(out, load_external_data=False)


def gqa(m):
    prod = {o: n for n in m.graph.node for o in n.output}
    n = next(n for n in m.graph.node if n.op_type == "GroupQueryAttention")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
    src = [(i, "absent" if not i else prod[i].op_type if i in prod else "input/initializer")
           for i in n.input]
    return f"{n.domain} {attrs}\n    inputs {src}\n    outputs {list(n.output)}"


def main():
    path = sys.argv[1]
    g = ort.GraphOptimizationLevel
    a = optimized(path, g.ORT_ENABLE_BASIC, "basic")
    b = optimized(path, g.ORT_ENABLE_EXTENDED, "extended")
    ca = collections.Counter(n.op_type for n in a.graph.node)
    cb = collections.Counter(n.op_type for n in b.graph.node)
    for op in sorted(set(ca) | set(cb)):
        if ca[op] != cb[op]:
            print(f"{op}: basic {ca[op]}, extended {cb[op]}")
    print("basic GQA:", gqa(a))
    print("extended GQA:", gqa(b))


if __name__ == "__main__":
    main()
