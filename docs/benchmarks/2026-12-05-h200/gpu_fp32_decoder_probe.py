#!/usr/bin/env python3
"""Probe: where does the fixture's fp32 merged decoder drift on CUDA?

scripts/gpu/gpu_parity.sh finds the fp32 merged decoder on CUDA 0.0035 off the reference's top-5
log-probabilities on the `photo` image (tolerance 0.001), while the vision encoder's features on
CUDA match the reference as closely as the CPU's (docs/benchmarks/2026-12-05-h200/gpu_conv_algo_probe.py). This runs the
decoder alone on one prompt (embedded random ids around the photo's golden image features) on
the CPU provider and on CUDA (TF32 off, as ocrctl runs it):
 1. at each graph optimisation level (all, as ocrctl; basic; disabled), the largest difference
    of the logits and the cache from the CPU's, for the prompt and for 8 greedy steps after it,
    each provider on its own cache;
 2. with every node's output made a graph output (which also stops fusions across nodes), the
    first nodes, in graph order, whose output differs from the CPU's by more than 1e-5 of its
    scale: the op that drifts.

Usage (GPU machine): PYTHONPATH=/opt/ortgpu:scripts/gpu python3 docs/benchmarks/2026-12-05-h200/gpu_fp32_decoder_probe.py EXPORT_DIR
where EXPORT_DIR holds `ocrctl export --checkpoint tests/fixtures/tiny-lightonocr/checkpoint
--precision fp32 --decoder merged`. Without CUDA it compares the CPU with itself (all zeros).
"""

import os
import sys

import numpy as np
import onnx
import onnxruntime as ort

from gpu_conv_algo_probe import GOLDEN, read_safetensors

LEVELS = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
          "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
          "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}


def providers():
    if "CUDAExecutionProvider" in ort.get_available_providers():
        return [("CUDAExecutionProvider", {"use_tf32": "0"})]
    return ["CPUExecutionProvider"]


def session(model, provider, level):
    so = ort.SessionOptions()
    so.graph_optimization_level = LEVELS[level]
    so.log_severity_level = 3
    eps = providers() if provider == "cuda" else ["CPUExecutionProvider"]
    return ort.InferenceSession(model, so, providers=eps)


def prompt_embeds(onnx_dir, rng):
    """Embedded random ids with the photo's golden image features in the middle: [1, S, D]."""
    embed = ort.InferenceSession(os.path.join(onnx_dir, "embed_tokens.onnx"),
                                 providers=["CPUExecutionProvider"])
    features = read_safetensors(GOLDEN)["image_features.photo"]
    ids = rng.integers(3, 300, size=(1, 24)).astype(np.int64)
    text = embed.run(None, {"input_ids": ids})[0][0]
    return np.concatenate([text[:6], features, text[6:]])[None].astype(np.float32)


def empty_past(sess):
    past = {}
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values"):
            _, heads, _, dim = i.shape
            past[i.name] = np.zeros((1, heads, 0, dim), np.float32)
    return past


def run(sess, embeds, past, keep):
    total = embeds.shape[1] + next(iter(past.values())).shape[2]
    feeds = dict(past)
    feeds.update({"inputs_embeds": embeds, "attention_mask": np.ones((1, total), np.int64),
                  "num_logits_to_keep": np.array(keep, np.int64)})
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def generate(sess, embed_sess, embeds, steps):
    """The prompt, then `steps` greedy steps: each call's outputs."""
    past = empty_past(sess)
    calls = []
    x = embeds
    for _ in range(steps + 1):
        outs = run(sess, x, past, 1)
        calls.append(outs)
        past = {k.replace("present", "past_key_values"): v for k, v in outs.items()
                if k.startswith("present")}
        token = int(outs["logits"][0, -1].argmax())
        x = embed_sess.run(None, {"input_ids": np.array([[token]], np.int64)})[0]
    return calls


def worst(a, b):
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def node_outputs_model(path):
    """The model with every node output a graph output (float tensors only)."""
    model = onnx.load(path)
    model = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.value_info}
    have = {o.name for o in model.graph.output}
    for node in model.graph.node:
        for name in node.output:
            if name and name not in have and types.get(name) == onnx.TensorProto.FLOAT:
                model.graph.output.append(
                    onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
                have.add(name)
    return model, [(n.name, n.op_type, [o for o in n.output if o]) for n in model.graph.node]


def main():
    onnx_dir = os.path.join(sys.argv[1], "onnx")
    path = os.path.join(onnx_dir, "decoder_model_merged.onnx")
    rng = np.random.default_rng(0)
    embeds = prompt_embeds(onnx_dir, rng)
    embed_sess = ort.InferenceSession(os.path.join(onnx_dir, "embed_tokens.onnx"),
                                      providers=["CPUExecutionProvider"])
    print(f"providers {providers()}, prompt {embeds.shape[1]} positions")
    ref = generate(session(path, "cpu", "all"), embed_sess, embeds, 8)
    for level in LEVELS:
        got = generate(session(path, "cuda", level), embed_sess, embeds, 8)
        same = all(int(r["logits"][0, -1].argmax()) == int(g["logits"][0, -1].argmax())
                   for r, g in zip(ref, got))
        logits = max(worst(r["logits"], g["logits"]) for r, g in zip(ref, got))
        cache = max(worst(r[k], g[k]) for r, g in zip(ref, got) for k in r
                    if k.startswith("present"))
        print(f"cuda, optimisation {level:8}: logits max|d| {logits:.2e}, cache max|d| "
              f"{cache:.2e}, greedy ids {'equal' if same else 'DIFFER'}")
    model, nodes = node_outputs_model(path)
    data = model.SerializeToString()
    feeds_past = empty_past(session(path, "cpu", "disabled"))
    outs = {}
    for provider in ("cpu", "cuda"):
        so = ort.SessionOptions()
        so.graph_optimization_level = LEVELS["disabled"]
        so.log_severity_level = 3
        eps = providers() if provider == "cuda" else ["CPUExecutionProvider"]
        sess = ort.InferenceSession(data, so, providers=eps)
        outs[provider] = run(sess, embeds, feeds_past, 0)
    shown = 0
    for name, op, outputs in nodes:
        for o in outputs:
            if o not in outs["cpu"]:
                continue
            a, b = outs["cpu"][o], outs["cuda"][o]
            scale = float(np.max(np.abs(a))) or 1.0
            d = worst(a, b)
            if d > 1e-5 * scale and shown < 12:
                print(f"  {op:12} {name:50} {o:40} max|d| {d:.2e} (scale {scale:.2e})")
                shown += 1
    if shown == 0:
        print("  every node output within 1e-5 of its scale")


if __name__ == "__main__":
    main()
