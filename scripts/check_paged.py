#!/usr/bin/env python3
"""Checks an export's paged decoder (`--decoder paged`) against its GQA decoder, which the
parity tests check against transformers: the same tokens through both give the same logits.

Three sequences share the paged decoder's calls the way a continuous batch would:
  call 1: sequence 0's whole prompt, sequence 1's whole prompt, sequence 2's first chunk;
  call 2: one token each for sequences 0 and 1, the rest of sequence 2's prompt;
  calls 3-5: one token each for all three.
Their blocks are scattered over a shuffled pool. The GQA decoder runs each sequence alone
(B = 1) in the same chunks; the tokens fed after each prompt are the GQA decoder's greedy
choices, so both see the same inputs. For every sequence in every call the script compares the
logits at its last token (largest |difference|), the greedy token, the 8 largest candidates and
`logsumexp`, and exits 1 when one differs beyond float16's tolerance.

--device cpu (CI, no GPU): ONNX Runtime runs the embeddings and the GQA decoder, and
`onnx.reference` runs the paged graph with numpy's PagedAttention and
SkipSimplifiedLayerNormalization (`scripts/paged_reference.py`): this checks the graph's wiring
(packed q|k|v, norms, rotary tables, blocks, each sequence's last token), with PagedAttention
as its schema describes it. --device cuda (the GPU machine): ONNX Runtime's CUDA provider runs
all three graphs, the real PagedAttention kernel included.

Usage: python3 scripts/check_paged.py EXPORT_DIR [--precision fp16|int4-fp16] [--device cpu|cuda]
       [--block N]
"""

import argparse
import os
import sys

import numpy as np
import onnx

import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from paged_reference import REFERENCE_OPS  # noqa: E402

SUFFIX = {"fp16": "_fp16", "int4-fp16": "_q4f16"}
PROMPTS = [9, 14, 6]
CHUNK = 4  # sequence 2's first prompt chunk
STEPS = 3  # decode calls after the mixed ones
CAP = 64  # GQA cache positions per sequence
TOLERANCE = 0.05  # float16 logits through two graphs


def query_heads(model):
    """The PagedAttention nodes' `num_heads` (padded for an 8-bit cache's layout)."""
    return next(a.i for n in model.graph.node if n.op_type == "PagedAttention"
                for a in n.attribute if a.name == "num_heads")


def dims(model):
    """(hidden, kv_heads, head_dim, layers, vocab) from the paged graph's inputs and outputs."""
    shape = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    out = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in model.graph.output}
    layers = sum(1 for n in shape if n.startswith("past_key_values.") and n.endswith(".key"))
    kv = shape["past_key_values.0.key"]
    return shape["inputs_embeds"][2], kv[2], kv[3], layers, out["logits"][2]


class Paged:
    """The paged decoder with its block pool and each sequence's block table."""

    def __init__(self, path, device, block, layers, kv_heads, head_dim, rng):
        self.block, self.layers = block, layers
        blocks_per_seq = -(-(max(PROMPTS) + STEPS + 2) // block)
        blocks = blocks_per_seq * len(PROMPTS) + 2
        self.table = rng.permutation(blocks)[: blocks_per_seq * len(PROMPTS)]
        self.table = self.table.reshape(len(PROMPTS), blocks_per_seq).astype(np.int32)
        shape = (blocks, block, kv_heads, head_dim)
        self.cache = {f"past_key_values.{i}.{kv}": np.zeros(shape, np.float16)
                      for i in range(layers) for kv in ("key", "value")}
        if device == "cpu":
            model = onnx.load(path)
            self.ref = onnx.reference.ReferenceEvaluator(model, new_ops=REFERENCE_OPS)
            self.sess = None
        else:
            # ONNX Runtime's kernel writes the new keys and values into the blocks in place: the
            # cache outputs must be the very buffers bound as the cache inputs (IO binding).
            self.ref = None
            self.sess = ort.InferenceSession(path, providers=["CUDAExecutionProvider"])
            self.cache = {k: ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0)
                          for k, v in self.cache.items()}

    def run(self, embeds, news, pasts):
        """One call on the packed `embeds [T, D]` of sequences with `news` new tokens after
        `pasts` cached positions. Returns the outputs by name (cache outputs kept)."""
        cu = np.concatenate([[0], np.cumsum(news)]).astype(np.int32)
        feeds = dict(self.cache)
        feeds.update({
            "inputs_embeds": embeds[None],
            "cumulative_sequence_length": cu,
            "past_seqlens": np.array(pasts, np.int32),
            "block_table": self.table,
            "attention_metadata": np.array(
                [max(news), max(p + n for p, n in zip(pasts, news))], np.int32),
        })
        if self.ref is None:
            return self.run_bound(feeds)
        names = [o.name for o in self.ref.proto_.graph.output]
        outs = dict(zip(names, self.ref.run(None, feeds)))
        for name in self.cache:
            self.cache[name] = outs["present" + name[len("past_key_values"):]]
        return outs

    def run_bound(self, feeds):
        """The CUDA run: the cache's device buffers bound as inputs and as outputs, the rest
        from and to host memory (`attention_metadata` must be there)."""
        io = self.sess.io_binding()
        cache_outs = {"present" + n[len("past_key_values"):] for n in self.cache}
        names = [o.name for o in self.sess.get_outputs() if o.name not in cache_outs]
        for name in names:
            io.bind_output(name, "cpu")
        for name, value in feeds.items():
            if name in self.cache:
                io.bind_ortvalue_input(name, value)
                io.bind_ortvalue_output("present" + name[len("past_key_values"):], value)
            else:
                io.bind_cpu_input(name, np.ascontiguousarray(value))
        self.sess.run_with_iobinding(io)
        return dict(zip(names, io.copy_outputs_to_cpu()[: len(names)]))


def gqa_run(sess, cache, embeds, past):
    """One B = 1 call of the GQA decoder on `embeds [S, D]` after `past` positions."""
    total = past + embeds.shape[0]
    feeds = dict(cache)
    feeds.update({"inputs_embeds": embeds[None],
                  "seqlens_k": np.array([total - 1], np.int32),
                  "total_sequence_length": np.array(total, np.int32)})
    names = [o.name for o in sess.get_outputs()]
    outs = dict(zip(names, sess.run(None, feeds)))
    for name in cache:
        cache[name] = outs["present" + name[len("past_key_values"):]]
    return outs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export")
    ap.add_argument("--precision", default="fp16", choices=sorted(SUFFIX))
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--block", type=int, default=4,
                    help="positions per block (CUDA: a power of two, at least 16)")
    a = ap.parse_args()
    sfx = SUFFIX[a.precision]
    onnx_dir = os.path.join(a.export, "onnx")
    paged_path = os.path.join(onnx_dir, f"decoder_model_paged{sfx}.onnx")
    graph = onnx.load(paged_path, load_external_data=False)
    hidden, kv_heads, head_dim, layers, vocab = dims(graph)
    heads = query_heads(graph)
    ep = ["CUDAExecutionProvider"] if a.device == "cuda" else ["CPUExecutionProvider"]
    so = ort.SessionOptions()
    # int4 on the CPU: dequantized weights times float activations, as numpy's reference
    # computes (ONNX Runtime's default level 4 would quantize the activations to int8).
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    embed = ort.InferenceSession(os.path.join(onnx_dir, f"embed_tokens{sfx}.onnx"), so,
                                 providers=ep)
    gqa = ort.InferenceSession(os.path.join(onnx_dir, f"decoder_model_gqa{sfx}.onnx"), so,
                               providers=ep)
    rng = np.random.default_rng(7)
    paged = Paged(paged_path, a.device, a.block, layers, kv_heads, head_dim, rng)

    def embed_ids(ids):
        return embed.run(None, {"input_ids": np.array([ids], np.int64)})[0][0]

    prompts = [list(rng.integers(10, vocab, n)) for n in PROMPTS]
    # Each sequence's chunks (token ids; None: the GQA decoder's last greedy choice).
    plan = [[prompts[0], None, None, None, None],
            [prompts[1], None, None, None, None],
            [prompts[2][:CHUNK], prompts[2][CHUNK:], None, None, None]]
    calls = len(plan[0])
    # The GQA decoder alone, sequence by sequence: its outputs and the tokens it chose.
    want, fed = [], []
    for chunks in plan:
        cache = {f"past_key_values.{i}.{kv}": np.zeros((1, kv_heads, CAP, head_dim), np.float16)
                 for i in range(layers) for kv in ("key", "value")}
        past, outs, ids_fed, token = 0, [], [], None
        for chunk in chunks:
            ids = chunk if chunk is not None else [token]
            o = gqa_run(gqa, cache, embed_ids(ids), past)
            past += len(ids)
            token = int(o["next_token"][0, 0])
            outs.append(o)
            ids_fed.append(ids)
        want.append(outs)
        fed.append(ids_fed)
    # The paged decoder: all three sequences in every call.
    worst, failures = 0.0, []
    pasts = [0] * len(plan)
    for c in range(calls):
        ids = [fed[s][c] for s in range(len(plan))]
        news = [len(x) for x in ids]
        embeds = np.concatenate([embed_ids(x) for x in ids])
        got = paged.run(embeds, news, pasts)
        for s in range(len(plan)):
            w = want[s][c]
            d = float(np.abs(got["logits"][s, 0] - w["logits"][0, 0]).max())
            worst = max(worst, d)
            same_token = int(got["next_token"][s, 0]) == int(w["next_token"][0, 0])
            # (As a set: float16 noise may swap near-equal candidates.)
            same_top = set(got["top_ids"][s, 0, :8]) == set(w["top_ids"][0, 0, :8])
            lse = abs(float(got["logsumexp"][s, 0]) - float(w["logsumexp"][0, 0]))
            what = f"call {c + 1} sequence {s} ({news[s]} new after {pasts[s]})"
            line = (f"{what}: logits max|d| {d:.4f}, token {'=' if same_token else '!='}, "
                    f"top 8 {'=' if same_top else '!='}, logsumexp |d| {lse:.4f}")
            print(line)
            if d > TOLERANCE or lse > TOLERANCE or not same_token:
                failures.append(line)
        pasts = [p + n for p, n in zip(pasts, news)]
    print(f"paged {a.precision} on {a.device}, block {a.block}, {heads} query heads over "
          f"{kv_heads} KV heads: {calls} calls x {len(plan)} sequences, largest logit difference "
          f"{worst:.4f}"
          + (f"; {len(failures)} FAILED" if failures else "; all equal within tolerance"))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
