#!/usr/bin/env python3
"""Where an A4 page's vision run goes besides its kernels (issue 9.4): the vision encoder's
wall time per run with its input and output in pageable host memory (as a plain
`session.run` has them), with the pixels in page-locked (pinned) host memory, and with both
already on the device, median of RUNS each. The kernels' own time is scripts/gpu/gpu_kernels.py's.

Run on the GPU machine with the torch venv's Python (torch pins the memory) and ONNX Runtime's
GPU package on the path:
  PYTHONPATH=/opt/ortgpu python3 docs/benchmarks/2026-12-04-h200/gpu_vision_io.py MODEL_DIR [--size 1092x1540] [--runs 15]
"""
import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort
import torch


def median_ms(f, runs):
    for _ in range(3):
        f()
    t = []
    for _ in range(runs):
        s = time.perf_counter()
        f()
        t.append((time.perf_counter() - s) * 1e3)
    return statistics.median(t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--size", default="1092x1540")
    ap.add_argument("--suffix", default="_fp16")
    ap.add_argument("--runs", type=int, default=15)
    a = ap.parse_args()
    w, h = (int(v) for v in a.size.split("x"))
    prov = [("CUDAExecutionProvider", {"device_id": 0})]
    s = ort.InferenceSession(f"{a.model}/onnx/vision_encoder{a.suffix}.onnx", providers=prov)
    pix = np.random.default_rng(0).random((1, 3, h, w), dtype=np.float32)
    out_name = s.get_outputs()[0].name
    print(f"vision_encoder{a.suffix} {w}x{h}, pixels {pix.nbytes / 2**20:.1f} MiB")

    copy = median_ms(lambda: pix.copy(), a.runs)
    print(f"  host copy of the pixels (np.copy):            {copy:7.2f} ms")
    plain = median_ms(lambda: s.run([out_name], {"pixel_values": pix}), a.runs)
    print(f"  pageable input and output (session.run):      {plain:7.2f} ms")

    pinned = torch.from_numpy(pix).pin_memory()
    b = s.io_binding()
    b.bind_input("pixel_values", "cpu", 0, np.float32, list(pix.shape), pinned.data_ptr())
    b.bind_output(out_name, "cpu")
    pin = median_ms(lambda: s.run_with_iobinding(b), a.runs)
    print(f"  pinned input, pageable output:                {pin:7.2f} ms")

    dev = ort.OrtValue.ortvalue_from_numpy(pix, "cuda", 0)
    d = s.io_binding()
    d.bind_ortvalue_input("pixel_values", dev)
    d.bind_output(out_name, "cuda", 0)
    on = median_ms(lambda: (s.run_with_iobinding(d), d.synchronize_outputs()), a.runs)
    print(f"  input and output on the device:               {on:7.2f} ms")

    up = median_ms(lambda: ort.OrtValue.ortvalue_from_numpy(pix, "cuda", 0), a.runs)
    print(f"  upload alone, pageable (OrtValue to cuda):    {up:7.2f} ms")
    t = torch.empty(pix.shape, dtype=torch.float32, device="cuda")
    upp = median_ms(lambda: (t.copy_(pinned, non_blocking=True), torch.cuda.synchronize()), a.runs)
    print(f"  upload alone, pinned (torch copy_):           {upp:7.2f} ms")


if __name__ == "__main__":
    main()
