"""Copies an ocrctl export and applies, by hand, the changes issue 16 asks ocrctl to make itself,
so the consumers (transformers.js, fast-lightonocr) and onnx.checker accept the copy. Each change
is one named step; the harness applies them cumulatively to record which consumer error each
one removes. This is a measuring tool, not a supported converter.

    python adapt_export.py SRC DST [--steps a,b,...] [--fp16-boundary float32|native] [--norm rms|contrib|keep]

Steps (default: all, in this order):
  preprocessor   preprocessor_config.json: + "processor_class": "PixtralProcessor"
  config         config.json: hub `mistral3` -> transformers `lighton_ocr` (image_token_index,
                 architectures, text_config bos/eos/pad, tie_word_embeddings, transformers.js_config)
  vision_rank3   vision_encoder*: image_features [N, H] -> [1, N, H] (Unsqueeze axis 0)
  pixel_f32      vision_encoder_fp16/_q4f16: pixel_values float16 -> float32 (Cast inside)
  no_position_ids decoder_model_merged*: drop the position_ids input, computed inside from
                 attention_mask (cumsum - 1, last sequence_length columns, clipped at 0)
  fp16_boundary  with --fp16-boundary float32: *_fp16/_q4f16 graphs take and return float32
                 inputs_embeds / image_features / past_key_values / present (Casts inside)
  norm           SimplifiedLayerNormalization (default domain) -> RMSNormalization (opset 23,
                 IR 11) with --norm rms; --norm contrib moves it to com.microsoft instead, which
                 passes the checker but ONNX Runtime 1.30/1.31 refuses to load ("not a registered
                 function/op")
  special_tokens special_tokens_map.json written from tokenizer_config.json
ocrctl.json is dropped from the copy (its digests no longer hold).
Opt-in (not in the default list, not a change for ocrctl):
  fl_tiny_hidden config.json vision_config.hidden_size := text_config.hidden_size. fast-lightonocr
                 0.1.4 checks image_features' last dim against vision_config.hidden_size (1024 =
                 1024 in the real model; 64 != 96 in the tiny fixture), a bug of its own.
  pixtral_tokens processor_config.json image_break_token/image_end_token back to the hub's
                 "<|vision_pad|>"/"<|vision_end|>": fast-lightonocr 0.1.4 looks both up as tokens
                 and always inserts them (Pixtral's prompt layout, not LightOnOCR's).
"""

import argparse
import json
import shutil
from pathlib import Path

import onnx
from onnx import TensorProto, helper

ALL_STEPS = ["preprocessor", "config", "vision_rank3", "pixel_f32", "no_position_ids",
             "fp16_boundary", "norm", "special_tokens"]


def load(path):
    return onnx.load(str(path))


def save(model, path):
    data = path.name + "_data"
    (path.parent / data).unlink(missing_ok=True)
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=data, size_threshold=1024)


def prepend(graph, nodes):
    rest = list(graph.node)
    del graph.node[:]
    graph.node.extend(list(nodes) + rest)


def value_info(graph, name, inputs=True):
    for v in graph.input if inputs else graph.output:
        if v.name == name:
            return v
    return None


def cast_input(graph, name):
    """Graph input `name` becomes float32; a Cast back to its old type feeds the old consumers."""
    v = value_info(graph, name)
    old = v.type.tensor_type.elem_type
    if old == TensorProto.FLOAT:
        return
    inner = name + "__orig"
    for n in graph.node:
        for i, x in enumerate(n.input):
            if x == name:
                n.input[i] = inner
    v.type.tensor_type.elem_type = TensorProto.FLOAT
    prepend(graph, [helper.make_node("Cast", [name], [inner], to=old, name="cast_in_" + name)])


def cast_output(graph, name):
    """Graph output `name` becomes float32 (Cast after its producer)."""
    v = value_info(graph, name, inputs=False)
    if v.type.tensor_type.elem_type == TensorProto.FLOAT:
        return
    inner = name + "__orig"
    for n in graph.node:
        for i, x in enumerate(n.output):
            if x == name:
                n.output[i] = inner
    v.type.tensor_type.elem_type = TensorProto.FLOAT
    graph.node.append(helper.make_node("Cast", [inner], [name], to=TensorProto.FLOAT, name="cast_out_" + name))


def unsqueeze_output(graph, name):
    v = value_info(graph, name, inputs=False)
    dims = v.type.tensor_type.shape.dim
    if len(dims) == 3:
        return
    inner = name + "__rank2"
    for n in graph.node:
        for i, x in enumerate(n.output):
            if x == name:
                n.output[i] = inner
    graph.initializer.append(helper.make_tensor("unsq_axes_0", TensorProto.INT64, [1], [0]))
    graph.node.append(helper.make_node("Unsqueeze", [inner, "unsq_axes_0"], [name], name="unsqueeze_" + name))
    new = dims[:]
    del dims[:]
    dims.add().dim_value = 1
    for d in new:
        dims.add().CopyFrom(d)


def drop_position_ids(graph):
    if value_info(graph, "position_ids") is None:
        return
    graph.input.remove(value_info(graph, "position_ids"))
    c = lambda n, v: helper.make_tensor(n, TensorProto.INT64, [len(v)] if isinstance(v, list) else [], v if isinstance(v, list) else [v])
    graph.initializer.extend([c("pid_axis1", 1), c("pid_one", 1), c("pid_zero", 0), c("pid_1", [1]),
                              c("pid_2", [2]), c("pid_max", [2**62]), c("pid_axes", [1])])
    prepend(graph, [
        helper.make_node("CumSum", ["attention_mask", "pid_axis1"], ["pid_cum"]),
        helper.make_node("Sub", ["pid_cum", "pid_one"], ["pid_all"]),
        helper.make_node("Max", ["pid_all", "pid_zero"], ["pid_clip"]),
        helper.make_node("Shape", ["inputs_embeds"], ["pid_shape"]),
        helper.make_node("Slice", ["pid_shape", "pid_1", "pid_2"], ["pid_seq"]),
        helper.make_node("Neg", ["pid_seq"], ["pid_start"]),
        helper.make_node("Slice", ["pid_clip", "pid_start", "pid_max", "pid_axes"], ["position_ids"]),
    ])


def replace_norm(model, how):
    opset = {o.domain: o for o in model.opset_import}
    for n in model.graph.node:
        if n.op_type == "SimplifiedLayerNormalization" and n.domain in ("", "ai.onnx"):
            if how == "rms":
                n.op_type = "RMSNormalization"
            else:
                n.domain = "com.microsoft"
    if how == "rms":
        opset[""].version = max(opset[""].version, 23)
        model.ir_version = max(model.ir_version, 11)
    elif "com.microsoft" not in opset:
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))


def hub_to_transformers_config(cfg, kv16):
    out = dict(cfg)
    out["model_type"] = "lighton_ocr"
    out["architectures"] = ["LightOnOcrForConditionalGeneration"]
    out["image_token_index"] = out.pop("image_token_id")
    text = dict(out["text_config"])
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        text.setdefault(k, None)
    out["text_config"] = text
    out["tie_word_embeddings"] = text.get("tie_word_embeddings", True)
    out["transformers.js_config"] = {
        "use_external_data_format": True,
        # What the _fp16/_q4f16 decoders' past_key_values really are (transformers.js 4.3.2 reads
        # the graph's input types instead; its v3 and other readers use this).
        "kv_cache_dtype": {"fp16": kv16, "q4f16": kv16},
    }
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--steps", default=",".join(ALL_STEPS))
    ap.add_argument("--fp16-boundary", choices=["float32", "native"], default="float32")
    ap.add_argument("--norm", choices=["rms", "contrib", "keep"], default="rms")
    a = ap.parse_args()
    steps = [s for s in a.steps.split(",") if s]
    src, dst = Path(a.src), Path(a.dst)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    (dst / "ocrctl.json").unlink()  # its sha256 digests no longer hold

    def edit_json(name, fn):
        p = dst / name
        p.write_text(json.dumps(fn(json.loads(p.read_text())), indent=2) + "\n")

    if "preprocessor" in steps:
        edit_json("preprocessor_config.json", lambda c: {**c, "processor_class": "PixtralProcessor"})
    if "config" in steps:
        kv16 = "float32" if "fp16_boundary" in steps and a.fp16_boundary == "float32" else "float16"
        edit_json("config.json", lambda c: hub_to_transformers_config(c, kv16))
    if "fl_tiny_hidden" in steps:
        edit_json("config.json", lambda c: {**c, "vision_config": {
            **c["vision_config"], "hidden_size": c["text_config"]["hidden_size"]}})
    if "pixtral_tokens" in steps:
        edit_json("processor_config.json", lambda c: {
            **c, "image_break_token": "<|vision_pad|>", "image_end_token": "<|vision_end|>"})
    if "special_tokens" in steps:
        t = json.loads((dst / "tokenizer_config.json").read_text())
        m = {k: t[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if t.get(k)}
        (dst / "special_tokens_map.json").write_text(json.dumps(m, indent=2) + "\n")

    for path in sorted((dst / "onnx").glob("*.onnx")):
        model = load(path)
        g = model.graph
        half = path.stem.endswith(("_fp16", "_q4f16"))
        if path.stem.startswith("vision_encoder"):
            if "vision_rank3" in steps:
                unsqueeze_output(g, "image_features")
            if "pixel_f32" in steps:
                cast_input(g, "pixel_values")
            if "fp16_boundary" in steps and half and a.fp16_boundary == "float32":
                cast_output(g, "image_features")
        if path.stem.startswith("embed_tokens"):
            if "fp16_boundary" in steps and half and a.fp16_boundary == "float32":
                cast_output(g, "inputs_embeds")
        if path.stem.startswith("decoder_model_merged"):
            if "no_position_ids" in steps:
                drop_position_ids(g)
            if "fp16_boundary" in steps and half and a.fp16_boundary == "float32":
                for v in list(g.input):
                    if v.name == "inputs_embeds" or v.name.startswith("past_key_values."):
                        cast_input(g, v.name)
                for v in list(g.output):
                    if v.name.startswith("present."):
                        cast_output(g, v.name)
        if "norm" in steps and a.norm != "keep":
            replace_norm(model, a.norm)
        save(model, path)


if __name__ == "__main__":
    main()
