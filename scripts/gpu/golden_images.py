#!/usr/bin/env python3
"""Writes the tiny fixture's images into OUT_DIR as the reference saw them: PNGs copied, and each
JPEG whose golden records Pillow's decoded pixels (`decoded_rgb.STEM`) written as a PNG of those
pixels, so that an end-to-end run compares the model path, not two JPEG decoders.

Why: ocrctl's JPEG decode differs from Pillow's by up to 4 levels (IDCT rounding;
tests/parity.rs checks that bound), which moves the fixture photo's top-5 log-probabilities by
0.0035, on the CPU as on CUDA: over the fp32 tolerance (0.001) although every graph matches.
The parity tests substitute Pillow's pixels the same way. Used by scripts/gpu/gpu_parity.sh.

Usage: python3 scripts/gpu/golden_images.py OUT_DIR
"""

import json
import os
import shutil
import struct
import sys
import zlib

import numpy as np

GOLDEN = "tests/fixtures/tiny-lightonocr/golden/golden.safetensors"
DTYPES = {"F32": np.float32, "U8": np.uint8}


def read_safetensors(path):
    """{name: array} of a safetensors file (the format's 8-byte header length, JSON, data).

    Read by hand: the GPU machine's Python has numpy but not necessarily the `safetensors`
    package, and it cannot install one (no network)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__" or t["dtype"] not in DTYPES:
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[a:b], DTYPES[t["dtype"]]).reshape(t["shape"])
    return out


IMAGES = os.path.join(os.path.dirname(GOLDEN), "..", "images")


def write_png(path, rgb):
    """An 8-bit RGB PNG of `rgb [H, W, 3]` (uint8): no filter, one zlib stream."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))

    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)))
        f.write(chunk(b"IDAT", zlib.compress(raw, 6)))
        f.write(chunk(b"IEND", b""))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    tensors = read_safetensors(GOLDEN)
    for name in sorted(os.listdir(IMAGES)):
        stem, ext = os.path.splitext(name)
        decoded = tensors.get(f"decoded_rgb.{stem}")
        if decoded is not None:
            write_png(os.path.join(out, stem + ".png"), decoded)
            print(f"{name}: Pillow's decoded pixels as {stem}.png")
        elif ext.lower() in (".jpg", ".jpeg"):
            sys.exit(f"{name}: a JPEG without decoded_rgb.{stem} in {GOLDEN}")
        else:
            shutil.copy(os.path.join(IMAGES, name), out)


if __name__ == "__main__":
    main()
