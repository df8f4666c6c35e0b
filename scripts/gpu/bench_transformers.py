#!/usr/bin/env python3
"""The transformers reference on the GPU machine, for `scripts/gpu/gpu_compare.sh`.

LightOnOCR-2-1B's shapes with random weights (``LightOnOcrConfig()``), bfloat16, SDPA, one
synthetic page of WxH pixels (the prompt is the image's tokens between a few text tokens, as
ocrctl's prompt is). Reports medians of the vision encoder (+ projector) ms, time to first
token (``generate`` with one new token), batch-1 decode tokens/s, and pages/s at the given
batch sizes with N new tokens each (EOS ignored), plus peak GPU memory, as JSON on stdout.

Usage: python3 scripts/gpu/bench_transformers.py --size 1092x1540 --new-tokens 256 --batches 1,8
"""
import argparse
import json
import statistics
import time

import torch
from transformers import LightOnOcrConfig, LightOnOcrForConditionalGeneration


def timed(fn, runs):
    out = []
    for i in range(runs + 1):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if i > 0:  # the first run warms up
            out.append(time.perf_counter() - t)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1092x1540")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()
    w, h = (int(x) for x in a.size.split("x"))
    torch.manual_seed(0)
    cfg = LightOnOcrConfig()
    cfg._attn_implementation = "sdpa"
    model = LightOnOcrForConditionalGeneration(cfg).to(torch.bfloat16).cuda().eval()
    image_token = getattr(cfg, "image_token_id", None) or getattr(cfg, "image_token_index")
    merge = getattr(cfg, "spatial_merge_size", 2)
    patch = cfg.vision_config.patch_size
    n_img = (h // (patch * merge)) * (w // (patch * merge))

    def inputs(b):
        ids = [1, 3] + [image_token] * n_img + [4, 5]
        return dict(
            input_ids=torch.tensor([ids] * b, device="cuda"),
            attention_mask=torch.ones(b, len(ids), dtype=torch.long, device="cuda"),
            pixel_values=torch.randn(b, 3, h, w, device="cuda", dtype=torch.bfloat16),
            image_sizes=torch.tensor([[h, w]] * b, device="cuda"),
        )

    def generate(b, n):
        with torch.no_grad():
            model.generate(**inputs(b), max_new_tokens=n, min_new_tokens=n, do_sample=False)

    res = {"size": a.size, "image_tokens": n_img, "new_tokens": a.new_tokens}
    x = inputs(1)
    try:
        with torch.no_grad():
            vis = timed(lambda: model.model.get_image_features(x["pixel_values"], x["image_sizes"]), a.runs)
        res["vision_ms"] = vis * 1e3
    except Exception as e:  # the helper's name differs across versions
        res["vision_error"] = repr(e)
    ttft = timed(lambda: generate(1, 1), a.runs)
    res["ttft_ms"] = ttft * 1e3
    full = timed(lambda: generate(1, a.new_tokens), 1)
    res["decode_tokens_per_s_batch1"] = (a.new_tokens - 1) / (full - ttft)
    sweep = []
    for b in (int(x) for x in a.batches.split(",")):
        torch.cuda.reset_peak_memory_stats()
        try:
            s = timed(lambda: generate(b, a.new_tokens), 1)
            sweep.append({"batch": b, "seconds": s, "pages_per_s": b / s,
                          "tokens_per_s": b * a.new_tokens / s,
                          "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20})
        except torch.cuda.OutOfMemoryError:
            sweep.append({"batch": b, "error": "out of memory"})
            torch.cuda.empty_cache()
    res["batch_sweep"] = sweep
    print(json.dumps(res))


if __name__ == "__main__":
    main()
