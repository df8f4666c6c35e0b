#!/usr/bin/env python3
"""Bounded load run against a live `ocrctl serve` (standard library only).

Sends N chat-completion requests for one image from C concurrent clients and reports
requests/s, p50/p90/p99 latency, statuses, and the server's resident memory before and
after (from /metrics).

Usage: scripts/load.py --url http://127.0.0.1:8000 --image page.png [--requests 200]
                       [--concurrency 8] [--max-tokens 16] [--json]
"""

import argparse
import base64
import http.client
import json
import mimetypes
import statistics
import threading
import time
import urllib.parse


def rss(url: urllib.parse.ParseResult) -> float | None:
    c = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    c.request("GET", "/metrics")
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith("ocrctl_resident_memory_bytes "):
            return float(line.split()[1])
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--image", required=True)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--ignore-eos", action="store_true",
                    help="generate max_tokens every time (random weights stop at random)")
    a = ap.parse_args()
    url = urllib.parse.urlparse(a.url)
    mime = mimetypes.guess_type(a.image)[0] or "image/png"
    with open(a.image, "rb") as f:
        data = f"data:{mime};base64,{base64.b64encode(f.read()).decode()}"
    body = json.dumps({
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data}}]}],
        "max_tokens": a.max_tokens,
        "temperature": 0,
        "ignore_eos": a.ignore_eos,
    }).encode()
    lock = threading.Lock()
    todo = list(range(a.requests))
    latencies: list[float] = []
    statuses: dict[int, int] = {}

    def client() -> None:
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=300)
        while True:
            with lock:
                if not todo:
                    return
                todo.pop()
            t = time.perf_counter()
            conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            dt = time.perf_counter() - t
            with lock:
                statuses[r.status] = statuses.get(r.status, 0) + 1
                if r.status == 200:
                    latencies.append(dt)

    before = rss(url)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(a.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    after = rss(url)
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else float("nan")

    out = {
        "requests": a.requests,
        "concurrency": a.concurrency,
        "max_tokens": a.max_tokens,
        "seconds": wall,
        "requests_per_s": len(latencies) / wall,
        "p50_ms": pct(0.50),
        "p90_ms": pct(0.90),
        "p99_ms": pct(0.99),
        "mean_ms": statistics.mean(latencies) * 1000 if latencies else float("nan"),
        "statuses": statuses,
        "rss_before_mb": before / 2**20 if before else None,
        "rss_after_mb": after / 2**20 if after else None,
    }
    if a.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:>16}: {v:.1f}" if isinstance(v, float) else f"{k:>16}: {v}")


if __name__ == "__main__":
    main()
