#!/usr/bin/env python3
"""Markdown report of a scripts/gpu/gpu_compare.sh run: reads bench-<precision>-<decoder>.json and
transformers.json from the results folder given as the only argument; prints markdown and writes
summary.json beside the inputs."""
import glob
import json
import os
import sys

d = sys.argv[1]
rows, summary = [], {}
for path in sorted(glob.glob(os.path.join(d, "bench-*.json"))):
    b = json.load(open(path))
    name = os.path.basename(path)[len("bench-"):-len(".json")]
    res = {r["size"]: r for r in b["results"]}
    a4 = next((r for r in b["results"] if r["size"].startswith("1092")), b["results"][0])
    sq = next((r for r in b["results"] if r["size"] == "1540x1540"), None)
    sweep = {s["batch"]: s for s in b["batch_sweep"]}
    summary[name] = {
        "decoder": b.get("decoder"), "precision": b["precision"],
        "vision_ms_a4": a4["vision_ms"], "vision_ms_1540": sq and sq["vision_ms"],
        "ttft_ms_a4": a4["ttft_ms"], "decode_tok_s_batch1": a4["decode_tokens_per_s"],
        "pages_per_s": {k: v["pages_per_s"] for k, v in sweep.items()},
        "decode_tok_s": {k: v["decode_tokens_per_s"] for k, v in sweep.items()},
        "gpu_mib": {k: v.get("gpu_process_mib") for k, v in sweep.items()},
        "new_tokens": b["new_tokens"], "kv_cache": b.get("kv_cache"),
    }
tf = None
tp = os.path.join(d, "transformers.json")
if os.path.exists(tp) and os.path.getsize(tp) > 0:
    tf = json.load(open(tp))
    summary["transformers-bf16"] = tf


def f(x, p=1):
    return "–" if x is None else f"{x:.{p}f}"


gpu = open(os.path.join(d, "gpu.txt")).read().strip() if os.path.exists(os.path.join(d, "gpu.txt")) else ""
print(f"GPU: {gpu}\n")
batches = sorted({b for s in summary.values() if "pages_per_s" in s for b in s["pages_per_s"]})
# Batch-1 decode two ways: the engine's (the batch-1 sweep point: CUDA graphs, greedy ids on
# the device) and bench's phase loop (full logits to the host every step, as a request for
# log-probabilities costs).
head = ["", "vision A4 / 1540² ms", "TTFT A4 ms", "decode tok/s b1 (engine / full logits)"] + [f"pages/s b{b}" for b in batches]
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for name, s in summary.items():
    if name == "transformers-bf16":
        continue
    cells = [f"ocrctl {name}", f"{f(s['vision_ms_a4'])} / {f(s['vision_ms_1540'])}", f(s["ttft_ms_a4"]),
             f"{f(s['decode_tok_s'].get(1), 0)} / {f(s['decode_tok_s_batch1'], 0)}"]
    cells += [f(s["pages_per_s"].get(b), 3) for b in batches]
    print("| " + " | ".join(cells) + " |")
if tf:
    tb = {x["batch"]: x for x in tf.get("batch_sweep", [])}
    cells = [f"transformers bf16 ({tf['new_tokens']} new tokens)", f"{f(tf.get('vision_ms'))} / –",
             f(tf.get("ttft_ms")), f(tf.get("decode_tokens_per_s_batch1"), 0)]
    cells += [f(tb.get(b, {}).get("pages_per_s"), 3) for b in batches]
    print("| " + " | ".join(cells) + " |")
print()
print("Decode tokens/s and process GPU MiB per batch:\n")
for name, s in summary.items():
    if name == "transformers-bf16":
        continue
    parts = [f"b{b}: {f(s['decode_tok_s'].get(b), 0)} tok/s, {f(s['gpu_mib'].get(b), 0)} MiB" for b in batches]
    print(f"- {name} ({s['new_tokens']} new tokens, KV {s['kv_cache']}): " + "; ".join(parts))
serve = os.path.join(d, "serve", "load.jsonl")
if os.path.exists(serve):
    print("\n`serve --profile 16gb` under load (int4-fp16, scripts/gpu/gpu_serve_check.sh):\n")
    for line in open(serve):
        r = json.loads(line)
        metrics = os.path.join(d, "serve", f"metrics-b{r['batch']}-g{r['cuda_graphs']}.txt")
        gpu = next((float(l.split()[-1]) for l in open(metrics) if l.startswith("ocrctl_gpu_memory_used_bytes"))
                   if os.path.exists(metrics) else None, None)
        print(f"- batch {r['batch']}, CUDA graphs {r['cuda_graphs']}, {r['concurrency']} clients, "
              f"{r['requests']} requests of {r['max_tokens']} new tokens: {r['requests_per_s']:.2f} requests/s, "
              f"p50 {r['p50_ms'] / 1e3:.2f} s, p99 {r['p99_ms'] / 1e3:.2f} s, statuses {r['statuses']}, "
              f"GPU memory {f(gpu and gpu / 1e9, 1)} GB")
        summary.setdefault("serve_16gb", []).append({**r, "gpu_memory_bytes": gpu})
json.dump(summary, open(os.path.join(d, "summary.json"), "w"), indent=1)

