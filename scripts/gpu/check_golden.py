#!/usr/bin/env python3
"""Compares `ocrctl ocr --json --top-logprobs 5 --ignore-eos` lines (stdin) with the tiny
fixture's transformers goldens: greedy ids exact, every reference top-5 log-probability within
TOL (or, when it left our top 5, a near-tie with our 5th). Prints one line per image and exits
non-zero on any mismatch. Used by scripts/gpu/gpu_parity.sh on the GPU machine.

Usage: ocrctl ocr ... | python3 scripts/gpu/check_golden.py GOLDEN_JSON TOL
"""
import json
import os
import sys

golden = json.load(open(sys.argv[1]))
tol = float(sys.argv[2])
# By stem: scripts/gpu/golden_images.py gives JPEGs as PNGs of the reference's decoded pixels.
stem = lambda path: os.path.splitext(os.path.basename(path))[0]  # noqa: E731
by_file = {stem(im["file"]): im for im in golden["images"]}
bad = 0
seen = 0
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("{"):
        continue
    got = json.loads(line)
    im = by_file[stem(got["file"])]
    seen += 1
    want = im["greedy_ids"]
    ids_ok = got["token_ids"] == want
    worst = 0.0
    lp_ok = True
    for step, (ours, ref) in enumerate(zip(got["top_logprobs"], im["top5"])):
        for r in ref:
            hit = next((t for t in ours if t["id"] == r["id"]), None)
            d = abs((hit or ours[-1])["logprob"] - r["logprob"])
            worst = max(worst, d) if hit else worst
            if d > tol:
                lp_ok = False
    ok = ids_ok and lp_ok
    bad += not ok
    first_diff = next((i for i, (a, b) in enumerate(zip(got["token_ids"], want)) if a != b), None)
    print(f"{im['stem']:16} ids {'equal' if ids_ok else f'differ from step {first_diff}'}, "
          f"max top-5 |dlogprob| {worst:.4f} {'ok' if ok else 'FAIL'}")
if seen != len(by_file):
    print(f"{seen} of {len(by_file)} images checked")
    bad += 1
sys.exit(1 if bad else 0)
