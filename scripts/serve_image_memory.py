#!/usr/bin/env python3
"""Peak resident memory of `ocrctl serve` (tiny fixture, CPU, `cpu` profile) while CLIENTS
clients each send one chat request of IMAGES blank 1540x1540 PNGs (a few KB each).

With 8 images a request's image tokens (8 x 3025) overflow max_sequence_length (6144), so every
request must be refused; the figure is what the server held while finding that out. With 1 image
the requests are served and the figure is the queue's and the batch's memory. With IMAGES given
as `60MB` (any size), each request is instead one data URL of that many bytes of zeros (no image:
refused once read), which measures what request bodies hold (`--body-memory-mb`; the server
reads OCRCTL_BODY_MEMORY_MB from the environment).

Usage: python3 scripts/serve_image_memory.py [BINARY] [CLIENTS=16] [IMAGES=8 | SIZEMB]
(from the repository root, after `cargo build --release`; exports the fixture to a temporary
folder). Prints one JSON line.
"""
import base64
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zlib


def png(w, h):
    """A white RGB PNG of w x h (compresses to a few KB)."""
    raw = b"".join(b"\x00" + b"\xff" * (3 * w) for _ in range(h))

    def chunk(kind, data):
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1])
    return 0


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/ocrctl"
    clients = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    images = sys.argv[3] if len(sys.argv) > 3 else "8"
    work = tempfile.mkdtemp()
    subprocess.run([binary, "export", "--checkpoint", "tests/fixtures/tiny-lightonocr/checkpoint",
                    "--out", f"{work}/tiny", "--precision", "fp32"], check=True,
                   stdout=subprocess.DEVNULL)
    port = 18390
    server = subprocess.Popen([binary, "serve", "--model", f"{work}/tiny", "--profile", "cpu",
                               "--precision", "fp32", "--port", str(port), "--threads", "1"],
                              stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health") as r:
                    if b"loading" not in r.read():
                        break
            except OSError:
                pass
            if server.poll() is not None:
                sys.exit("the server did not start")
            time.sleep(0.2)
        if images.upper().endswith("MB"):
            url, n = "data:image/png;base64," + "A" * (int(images[:-2]) << 20), 1
        else:
            url = "data:image/png;base64," + base64.b64encode(png(1540, 1540)).decode()
            n = int(images)
        body = json.dumps({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}] * n}], "max_tokens": 8}).encode()
        before = rss_kib(server.pid)
        peak, done, statuses = [before], threading.Event(), []

        def watch():
            while not done.is_set():
                peak[0] = max(peak[0], rss_kib(server.pid))
                time.sleep(0.01)

        def client():
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                         {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=600) as r:
                    statuses.append(r.status)
            except urllib.error.HTTPError as e:
                statuses.append(e.code)

        watcher = threading.Thread(target=watch)
        watcher.start()
        start = time.time()
        threads = [threading.Thread(target=client) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done.set()
        watcher.join()
        print(json.dumps({"clients": clients, "images": images, "body_kb": len(body) // 1024,
                          "seconds": round(time.time() - start, 1),
                          "rss_before_mb": before // 1024, "peak_rss_mb": peak[0] // 1024,
                          "statuses": sorted(set(statuses))}))
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
