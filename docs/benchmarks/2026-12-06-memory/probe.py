#!/usr/bin/env python3
"""RSS of `ocrctl serve` before, during and after a burst of large-image requests.

Each run starts a server on the export, waits until it is ready and idle, sends `--clients`
requests at once (alternately `/v1/ocr` multipart and chat with a data URL, each a
`--width`x`--height` PNG, `--max-tokens` new tokens), then reads the RSS `--after` seconds
after the last answer. RSS is sampled every 50 ms from /proc; at the end the process's
resident memory is split by mapping kind from /proc/PID/smaps. One JSON line per run on
stdout, a Markdown table of all runs on stderr. Standard library only.

    python3 probe.py --bin target/release/ocrctl --model /tmp/fixture --label system --runs 3
    python3 probe.py ... --label arena-off --env OCRCTL_SOMETHING=1
"""

import argparse
import base64
import json
import os
import random
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
import urllib.request
import zlib


def png(width, height, seed=7):
    """A grey page: text-like dark runs on white, a few hundred KB compressed."""
    rnd = random.Random(seed)
    rows = []
    for y in range(height):
        if (y // 24) % 2 == 0:
            row = bytearray(b"\xff" * width)
        else:
            row = bytearray(rnd.choice((0x20, 0xff)) for _ in range(width // 8)) * 8
            row = row[:width].ljust(width, b"\xff")
        rows.append(b"\x00" + bytes(row))
    raw = zlib.compress(b"".join(rows), 6)

    def chunk(kind, data):
        c = struct.pack(">I", len(data)) + kind + data
        return c + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", raw) + chunk(b"IEND", b"")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def rss_by_kind(pid):
    """Resident KiB by mapping: glibc's main heap, anonymous maps (thread arenas, mmapped
    allocations, other allocators' segments, ONNX Runtime's large blocks), files, stacks."""
    out = {"heap": 0, "anon": 0, "file": 0, "other": 0}
    kind = "other"
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and len(parts) >= 5 and not parts[0].endswith(":"):
                name = parts[5] if len(parts) > 5 else ""
                kind = ("heap" if name == "[heap]" else "anon" if name == ""
                        else "file" if name.startswith("/") else "other")
            elif parts[0] == "Rss:":
                out[kind] += int(parts[1])
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, content_type):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def request_body(i, image, max_tokens):
    if i % 2 == 0:
        b = "probe-boundary"
        body = (f"--{b}\r\nContent-Disposition: form-data; name=\"max_tokens\"\r\n\r\n"
                f"{max_tokens}\r\n--{b}\r\nContent-Disposition: form-data; name=\"accept_length\"\r\n"
                f"\r\ntrue\r\n--{b}\r\nContent-Disposition: form-data; name=\"file\"; "
                f"filename=\"page.png\"\r\nContent-Type: image/png\r\n\r\n").encode()
        return "/v1/ocr", body + image + f"\r\n--{b}--\r\n".encode(), \
            f"multipart/form-data; boundary={b}"
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    body = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}]}],
        "max_tokens": max_tokens, "temperature": 0}
    return "/v1/chat/completions", json.dumps(body).encode(), "application/json"


def wait_ready(base, proc, limit=120):
    t = time.time()
    while time.time() - t < limit:
        if proc.poll() is not None:
            sys.exit(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return time.time() - t
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit("server not ready")


def one_run(a, image, env):
    port = free_port()
    cmd = [a.bin, "serve", "--model", a.model, "--port", str(port)] + a.serve_args.split()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        ready_s = wait_ready(base, proc)
        time.sleep(a.idle)
        idle = rss_kib(proc.pid)
        peak = [idle]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], rss_kib(proc.pid))
                time.sleep(0.05)

        sampler = threading.Thread(target=sample)
        sampler.start()
        statuses = [None] * a.clients

        def client(i):
            path, body, ct = request_body(i, image, a.max_tokens)
            statuses[i] = post(base + path, body, ct)

        t0 = time.time()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        burst_s = time.time() - t0
        after = {}
        for s in a.after:
            time.sleep(max(0.0, t0 + burst_s + s - time.time()))
            after[str(s)] = rss_kib(proc.pid)
        stop.set()
        sampler.join()
        return {"label": a.label, "ready_s": round(ready_s, 2), "idle_mib": idle // 1024,
                "peak_mib": peak[0] // 1024, "burst_s": round(burst_s, 2),
                "after_mib": {k: v // 1024 for k, v in after.items()},
                "by_kind_mib": {k: v // 1024 for k, v in rss_by_kind(proc.pid).items()},
                "statuses": sorted(set(statuses)), "env": a.env}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--label", required=True)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--width", type=int, default=2480)
    p.add_argument("--height", type=int, default=3508)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--idle", type=float, default=3.0, help="seconds idle before the burst")
    p.add_argument("--after", type=lambda s: [int(x) for x in s.split(",")], default=[10, 30])
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for the server")
    p.add_argument("--serve-args", default="--profile cpu --precision fp32 --queue-size 64")
    a = p.parse_args()
    env = dict(os.environ)
    env.update(kv.split("=", 1) for kv in a.env)
    image = png(a.width, a.height)
    print(f"{a.label}: {a.width}x{a.height} PNG of {len(image) // 1024} KiB, "
          f"{a.clients} clients", file=sys.stderr)
    rows = []
    for _ in range(a.runs):
        r = one_run(a, image, env)
        print(json.dumps(r), flush=True)
        rows.append(r)
    print("| label | idle MiB | peak MiB | " + " | ".join(f"+{s} s MiB" for s in a.after)
          + " | burst s |\n|---|---|---|" + "---|" * len(a.after) + "---|", file=sys.stderr)
    for r in rows:
        print(f"| {r['label']} | {r['idle_mib']} | {r['peak_mib']} | "
              + " | ".join(str(r["after_mib"][str(s)]) for s in a.after)
              + f" | {r['burst_s']} |", file=sys.stderr)
    med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
    print(f"median burst {med('burst_s')} s, peak {med('peak_mib')} MiB", file=sys.stderr)


if __name__ == "__main__":
    main()
