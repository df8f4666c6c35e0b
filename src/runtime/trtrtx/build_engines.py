"""Builds TensorRT-RTX engines ahead of time for `ocrctl build-engines` (no GPU needed).

ocrctl embeds this file and runs it with the Python of its .venv, where
`scripts/setup.sh --trt-rtx` installed `tensorrt-rtx-cu13-bindings` and `-libs`. Why Python:
TensorRT-RTX's builder has a C++ and a Python API only (no C API a Rust crate could bind
without a C++ shim), and ONNX Runtime's compile API needs the plugin EP to load, which needs
the NVIDIA driver (`libcuda.so.1`) that a CI runner does not have. The Python bindings build
on a machine with no GPU and no driver.

Input (stdin, JSON): {"out_dir", "report", "compute_capabilities": ["SM86", ...], "workspace_bytes",
"builder_optimization_level", "graphs": [{"part", "source", "engine", "context_model",
"min", "opt", "max"}]} where min/opt/max are ONNX Runtime's profile-shape strings
("name:1x3x28x28,name2:..."). For each graph it writes `<out_dir>/<engine>` (a serialized
engine) and `<out_dir>/<context_model>`: an ONNX model whose only node is an `EPContext` node
(domain com.microsoft) pointing at the engine by a relative path, with the source graph's
inputs and outputs, the form ONNX Runtime's NvTensorRTRTX execution provider loads.
Output (the file `report` names, JSON, since TensorRT-RTX logs to stdout):
{"tensorrt_rtx_version", "graphs": [{"part", "engine_bytes", "build_seconds"}]}. Errors go to
stderr with the graph at fault; exit status 1.
"""

import json
import os
import sys
import time

import onnx
from onnx import helper


def shapes(spec):
    """'a:1x2,b:3x0x4' -> {'a': (1, 2), 'b': (3, 0, 4)}"""
    out = {}
    for item in filter(None, spec.split(",")):
        name, dims = item.rsplit(":", 1)
        out[name] = tuple(int(d) for d in dims.split("x"))
    return out


def build_one(trt, logger, g, plan):
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(g["source"]):
        errs = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"{g['source']}: the TensorRT-RTX ONNX parser failed: {errs}")
    config = builder.create_builder_config()
    ccs = plan.get("compute_capabilities") or []
    if ccs:
        config.num_compute_capabilities = len(ccs)
        for i, cc in enumerate(ccs):
            config.set_compute_capability(getattr(trt.ComputeCapability, cc), i)
    if plan.get("workspace_bytes"):
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(plan["workspace_bytes"]))
    if plan.get("builder_optimization_level") is not None:
        config.builder_optimization_level = int(plan["builder_optimization_level"])
    lo, opt, hi = shapes(g["min"]), shapes(g["opt"]), shapes(g["max"])
    profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        t = network.get_input(i)
        if t.name not in lo or t.name not in opt or t.name not in hi:
            raise RuntimeError(f"{g['source']}: input {t.name} has no shape range in the profile")
        profile.set_shape(t.name, lo[t.name], opt[t.name], hi[t.name])
    config.add_optimization_profile(profile)
    engine = builder.build_serialized_network(network, config)
    if engine is None:
        raise RuntimeError(f"{g['source']}: TensorRT-RTX built no engine (see the log above)")
    return bytes(engine)


def context_model(g, engine_name, version, ccs):
    src = onnx.load(g["source"], load_external_data=False)
    node = helper.make_node(
        "EPContext",
        inputs=[i.name for i in src.graph.input],
        outputs=[o.name for o in src.graph.output],
        name=f"{g['part']}_trt_rtx",
        domain="com.microsoft",
        # One engine per node; ONNX Runtime's NvTensorRTRTX EP writes 0 here too.
        main_context=0,
        embed_mode=0,
        ep_cache_context=engine_name,
        hardware_architecture=",".join(c.removeprefix("SM") for c in ccs),
        ep_sdk_version=version,
        onnx_model_filename=os.path.basename(g["source"]),
        partition_name=g["part"],
        source="NvTensorRTRTXExecutionProvider",
    )
    graph = helper.make_graph([node], f"{g['part']}_trt_rtx", list(src.graph.input), list(src.graph.output))
    opsets = [o for o in src.opset_import if o.domain not in ("com.microsoft",)]
    opsets.append(helper.make_opsetid("com.microsoft", 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="ocrctl build-engines")
    model.ir_version = src.ir_version
    return model


def main():
    plan = json.load(sys.stdin)
    import tensorrt_rtx_bindings as trt

    verbose = os.environ.get("OCRCTL_TRT_RTX_VERBOSE") == "1"
    logger = trt.Logger(trt.Logger.VERBOSE if verbose else trt.Logger.WARNING)
    out_dir = plan["out_dir"]
    os.makedirs(out_dir, exist_ok=True)
    report = {"tensorrt_rtx_version": trt.__version__, "graphs": []}
    for g in plan["graphs"]:
        t0 = time.monotonic()
        engine = build_one(trt, logger, g, plan)
        seconds = time.monotonic() - t0
        engine_path = os.path.join(out_dir, g["engine"])
        tmp = engine_path + ".partial"
        with open(tmp, "wb") as f:
            f.write(engine)
        os.replace(tmp, engine_path)
        ctx = context_model(g, g["engine"], trt.__version__, plan.get("compute_capabilities") or [])
        ctx_path = os.path.join(out_dir, g["context_model"])
        onnx.save(ctx, ctx_path + ".partial")
        os.replace(ctx_path + ".partial", ctx_path)
        report["graphs"].append({"part": g["part"], "engine_bytes": len(engine), "build_seconds": round(seconds, 3)})
        print(f"built {g['part']}: {len(engine)} bytes in {seconds:.1f} s", file=sys.stderr)
    with open(plan["report"], "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # one line naming the graph, not a traceback
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
