#!/usr/bin/env python3
"""Probe: is the merged fp32 photo's 0.0035 on CUDA (scripts/gpu/gpu_parity.sh's one FAIL line)
in the vision encoder, and is it cuDNN's convolution algorithm search?

For each fixture image, the reference's own pixels (golden.safetensors `pixel_values.*`) go
through the export's fp32 vision encoder: on the CPU provider, and on CUDA (TF32 off, as ocrctl
runs it) with each `cudnn_conv_algo_search` (EXHAUSTIVE, ONNX Runtime's default and ocrctl's;
HEURISTIC; DEFAULT, the implicit-GEMM algorithm). Prints the largest |difference| of the image
features from the reference's (`image_features.*`) per image and setting. If every setting
matches as closely as the CPU, the drift is in the decoder. If only EXHAUSTIVE is off, the
convolution's algorithm is at fault.

Usage (GPU machine): PYTHONPATH=/opt/ortgpu python3 docs/benchmarks/2026-12-05-h200/gpu_conv_algo_probe.py EXPORT_DIR
where EXPORT_DIR is `ocrctl export --checkpoint tests/fixtures/tiny-lightonocr/checkpoint
--precision fp32`'s output. Without CUDA it prints the CPU column only.
"""

import os
import sys

import numpy as np
import onnxruntime as ort

# The golden file's reader is golden_images.py's, in scripts/gpu/.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../scripts/gpu"))
from golden_images import GOLDEN, read_safetensors  # noqa: E402


def main():
    model = f"{sys.argv[1]}/onnx/vision_encoder.onnx"
    golden = read_safetensors(GOLDEN)
    images = sorted(k.split(".", 1)[1] for k in golden if k.startswith("pixel_values."))
    settings = [("cpu", ["CPUExecutionProvider"])]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        for algo in ["EXHAUSTIVE", "HEURISTIC", "DEFAULT"]:
            opts = {"device_id": 0, "use_tf32": 0, "cudnn_conv_algo_search": algo}
            settings.append((f"cuda {algo.lower()}", [("CUDAExecutionProvider", opts)]))
    sessions = [(name, ort.InferenceSession(model, providers=p)) for name, p in settings]
    print(f"{'image':16}" + "".join(f"{name:>18}" for name, _ in sessions))
    for image in images:
        pixels = np.ascontiguousarray(golden[f"pixel_values.{image}"])
        want = golden[f"image_features.{image}"]
        row = f"{image:16}"
        for _, s in sessions:
            got = s.run(None, {"pixel_values": pixels})[0].reshape(want.shape)
            row += f"{float(np.abs(got - want).max()):18.2e}"
        print(row)


if __name__ == "__main__":
    main()
