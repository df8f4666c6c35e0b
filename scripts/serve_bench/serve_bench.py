#!/usr/bin/env python3
"""Steady-state serving benchmark (issue 37 items 3 and 7) against an OpenAI-compatible server:
`ocrctl serve` or vLLM's `vllm serve`. Standard library only (python3.10+).

Pages are drawn from a workload file (benchmarks/workloads/ocr-pages.yaml: page sizes by share,
new tokens lognormal, seeded: every run sends the same pages in the same order) and each is one
streamed chat completion with one image (a synthetic PNG page of the drawn size as a data URL),
`max_tokens` = the drawn count, `ignore_eos`, `temperature` 0, usage in the last chunk.
A page is done only if it streamed exactly its forced token count (`usage.completion_tokens`)
with finish_reason `length`; anything else (HTTP error, error event, short page) is a failure.

  closed loop: `--concurrency 1,8,32`: N clients, each sends its next page when its last ends
  open loop:   `--rate 2,4` (or `--rate workload`): Poisson arrivals at R pages/s
  each load point `--runs` times; a run stops sending after `--pages` pages or `--duration`
  seconds, whichever comes first, then waits for the pages in flight (the run JSON says which).

Per run: pages/s (completed pages / wall time from the first send to the last completion),
output tokens/s, TTFT (first non-empty content) p50/p95, page latency p50/p95/p99, failures,
the peak GPU memory of the server's process tree (nvidia-smi every `--sample-every` s, with
`--server-pid`; else its /metrics figure or the device's used memory), and pages running and
waiting over time from its /metrics (ocrctl_batch_size / ocrctl_queue_depth, vLLM's
vllm:num_requests_running / _waiting), drawn as an SVG.

  serve_bench.py run --url http://127.0.0.1:8000 --engine ocrctl --kv-cache fp16 \\
      --memory-gib 141 --concurrency 8,32 --rate 4 --runs 3 --out results/
  serve_bench.py summarize results/          # summary.json + summary.md from results/runs/
  serve_bench.py draw --pages 20 --json      # the page stream, no server

Writes OUT/runs/<engine>-<memory>-<kv>-<mode><load>-r<k>.json (settings, figures, every page's
record, the samples), OUT/occupancy/<same>.svg, OUT/summary.json and OUT/summary.md.
On a CPU fixture: `--scale 0.1` shrinks the pages, `--max-new 24` caps the new tokens.
"""

import argparse
import base64
import http.client
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_report  # noqa: E402
import serve_workload as wlmod  # noqa: E402

DEFAULT_WORKLOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks",
                                "workloads", "ocr-pages.yaml")
RUNNING = ("ocrctl_batch_size", "vllm:num_requests_running")
WAITING = ("ocrctl_queue_depth", "vllm:num_requests_waiting")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


class Target:
    """The server: base URL, model name, headers, and one data URL per page size."""

    def __init__(self, url: str, api_key: str | None, model: str | None, timeout: float):
        u = urllib.parse.urlparse(url.rstrip("/").removesuffix("/v1"))
        if u.scheme != "http" or not u.hostname:
            raise SystemExit(f"error: --url {url!r}: expected http://HOST:PORT")
        self.host, self.port, self.prefix = u.hostname, u.port or 80, u.path
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout
        self.images: dict = {}
        self.lock = threading.Lock()
        self.model = model or self.first_model()

    def get(self, path: str, timeout: float = 10.0) -> tuple:
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            c.request("GET", self.prefix + path, headers=self.headers)
            r = c.getresponse()
            return r.status, r.read().decode("utf-8", "replace")
        finally:
            c.close()

    def first_model(self) -> str:
        try:
            status, body = self.get("/v1/models")
        except OSError as e:
            raise SystemExit(f"error: --url: GET /v1/models failed: {e}") from None
        if status != 200:
            raise SystemExit(f"error: --url: GET /v1/models answered {status}: {body[:300]}")
        return json.loads(body)["data"][0]["id"]

    def image_url(self, sent: str) -> str:
        with self.lock:
            if sent not in self.images:
                w, h = (int(x) for x in sent.split("x"))
                png = wlmod.png_page(w, h)
                self.images[sent] = "data:image/png;base64," + base64.b64encode(png).decode()
            return self.images[sent]

    def send(self, page: dict, t0: float) -> dict:
        """Streams one page; returns its record (times relative to `t0`)."""
        body = json.dumps({
            "model": self.model,
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": self.image_url(page["sent"])}}]}],
            "max_tokens": page["max_tokens"], "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True},
        }).encode()
        rec = {**page, "t_send": None, "ttft_s": None, "latency_s": None, "status": None,
               "finish_reason": None, "completion_tokens": None, "prompt_tokens": None,
               "content_chunks": 0, "ok": False, "failure": None}
        start = time.perf_counter()
        rec["t_send"] = round(start - t0, 6)
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request("POST", self.prefix + "/v1/chat/completions", body, self.headers)
            resp = conn.getresponse()
            rec["status"] = resp.status
            if resp.status != 200:
                rec["failure"] = f"HTTP {resp.status}: {resp.read(300).decode('utf-8', 'replace')}"
            else:
                read_stream(resp, rec, start)
        except (OSError, http.client.HTTPException, ValueError) as e:
            rec["failure"] = f"{type(e).__name__}: {e}"
        finally:
            conn.close()
        rec["latency_s"] = round(time.perf_counter() - start, 6)
        if rec["failure"] is None:
            if rec["finish_reason"] != "length":
                rec["failure"] = f"finish_reason {rec['finish_reason']!r}, not 'length'"
            elif rec["completion_tokens"] != page["max_tokens"]:
                rec["failure"] = (f"{rec['completion_tokens']} completion tokens, "
                                  f"forced {page['max_tokens']}")
        rec["ok"] = rec["failure"] is None
        return rec


def read_stream(resp, rec: dict, start: float) -> None:
    """Reads the SSE body into `rec`: TTFT at the first non-empty content, the finish reason,
    usage. Only chunks that may carry more than content are parsed once TTFT is known."""
    for line in iter(resp.readline, b""):
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        plain = b'"finish_reason":null' in payload and b'"usage"' not in payload \
            and b'"error"' not in payload
        if rec["ttft_s"] is not None and plain:
            rec["content_chunks"] += 1
            continue
        obj = json.loads(payload)
        if obj.get("error"):
            err = obj["error"]
            rec["failure"] = "error event: " + str(err.get("message", err) if isinstance(err, dict) else err)
            return
        for ch in obj.get("choices") or []:
            content = (ch.get("delta") or {}).get("content")
            if content:
                rec["content_chunks"] += 1
                if rec["ttft_s"] is None:
                    rec["ttft_s"] = round(time.perf_counter() - start, 6)
            if ch.get("finish_reason"):
                rec["finish_reason"] = ch["finish_reason"]
        if obj.get("usage"):
            rec["completion_tokens"] = obj["usage"].get("completion_tokens")
            rec["prompt_tokens"] = obj["usage"].get("prompt_tokens")
    rec["failure"] = rec["failure"] or "stream ended without [DONE]"


# ---------------------------------------------------------------------------------------------
# Sampling the server while a run goes


def descendants(pid: int) -> set:
    """`pid` and every process below it (from /proc)."""
    children: dict = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(d))
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in out:
            out.add(p)
            todo.extend(children.get(p, []))
    return out


def smi(query: str) -> list:
    try:
        out = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [[x.strip() for x in line.split(",")] for line in out.splitlines() if line.strip()]


def metrics(target: Target) -> dict:
    try:
        status, text = target.get("/metrics", timeout=5)
    except OSError:
        return {}
    if status != 200:
        return {}
    vals: dict = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            try:
                vals[name] = vals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except (ValueError, IndexError):
                pass
    pick = lambda names: next((vals[n] for n in names if n in vals), None)  # noqa: E731
    return {"running": pick(RUNNING), "waiting": pick(WAITING), "kv_usage": pick(KV_USAGE),
            "gpu_metrics_bytes": vals.get("ocrctl_gpu_memory_used_bytes")}


class Sampler(threading.Thread):
    """Every `every` s: the server's /metrics gauges and, where nvidia-smi exists, the GPU
    memory of the server's process tree and of the device."""

    def __init__(self, target: Target, t0: float, every: float, server_pid: int | None):
        super().__init__(daemon=True)
        self.target, self.t0, self.every, self.pid = target, t0, every, server_pid
        self.samples: list = []
        self.stop = threading.Event()
        self.smi = shutil.which("nvidia-smi") is not None

    def sample(self) -> dict:
        s = {"t": round(time.perf_counter() - self.t0, 3), **metrics(self.target)}
        if self.smi:
            used = [float(r[0]) for r in smi("--query-gpu=memory.used") if r and r[0]]
            s["gpu_device_mib"] = sum(used) if used else None
            if self.pid:
                tree = descendants(self.pid)
                mine = [float(r[1]) for r in smi("--query-compute-apps=pid,used_memory")
                        if len(r) > 1 and r[0].isdigit() and int(r[0]) in tree and r[1]]
                s["gpu_proc_mib"] = sum(mine) if mine else None
        return s

    def run(self) -> None:
        while not self.stop.is_set():
            t = time.perf_counter()
            self.samples.append(self.sample())
            self.stop.wait(max(0.0, self.every - (time.perf_counter() - t)))
        self.samples.append(self.sample())


# ---------------------------------------------------------------------------------------------
# The two loops


class Pages:
    """The run's page stream, shared by its clients; ends after `count` pages or when
    `duration` seconds have passed since `t0` (and says which)."""

    def __init__(self, stream, count: int | None, duration: float | None, t0: float):
        self.it, self.count, self.duration, self.t0 = stream, count, duration, t0
        self.lock = threading.Lock()
        self.sent = 0
        self.stopped_by = None

    def next(self, at: float | None = None):
        with self.lock:
            if self.stopped_by:
                return None
            now = (time.perf_counter() - self.t0) if at is None else at
            if self.duration is not None and now >= self.duration:
                self.stopped_by = "duration"
                return None
            if self.count is not None and self.sent >= self.count:
                self.stopped_by = "pages"
                return None
            self.sent += 1
            return next(self.it)


def closed_loop(target: Target, pages: Pages, n: int, t0: float) -> list:
    records: list = []
    lock = threading.Lock()

    def client() -> None:
        while (page := pages.next()) is not None:
            rec = target.send(page, t0)
            with lock:
                records.append(rec)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return records


def open_loop(target: Target, pages: Pages, rate: float, t0: float, seed: int) -> list:
    """Poisson arrivals at `rate`/s (exponential gaps drawn with `seed`), one thread a page;
    each record keeps its scheduled time, so a client that fell behind shows."""
    records: list = []
    lock = threading.Lock()
    rng = random.Random(seed)
    threads = []
    at = 0.0

    def one(page: dict, sched: float) -> None:
        rec = target.send(page, t0)
        rec["t_scheduled"] = round(sched, 6)
        with lock:
            records.append(rec)

    while True:
        at += rng.expovariate(rate)
        page = pages.next(at)
        if page is None:
            break
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        t = threading.Thread(target=one, args=(page, at), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return records


# ---------------------------------------------------------------------------------------------
# Runs


def device_name(given: str | None) -> str:
    if given:
        return given
    rows = smi("--query-gpu=name,memory.total")
    if rows:
        return "; ".join(f"{r[0]} ({float(r[1]) / 1024:.0f} GiB)" for r in rows if len(r) > 1)
    import platform
    return f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def warm_up(target: Target, wl, a) -> None:
    """One short page of each size, untimed (first-use costs: kernel plans, graphs); a page
    that fails here means the server cannot serve the benchmark: stop with its reason."""
    n = min(8, a.max_new or 8)
    for w, h, _ in wl.sizes:
        sent = "%dx%d" % wlmod.scaled(w, h, a.scale)
        rec = target.send({"i": -1, "size": f"{w}x{h}", "sent": sent, "max_tokens": n},
                          time.perf_counter())
        if not rec["ok"]:
            raise SystemExit(f"error: warm-up page {sent} failed: {rec['failure']}")


def one_run(target: Target, wl, a, mode: str, load, k: int, device: str) -> dict:
    t0 = time.perf_counter()
    count = a.pages if a.pages is not None else (None if a.duration else wl.pages)
    pages = Pages(wlmod.draw_pages(wl, None, a.scale, a.max_new), count, a.duration, t0)
    sampler = Sampler(target, t0, a.sample_every, a.server_pid)
    sampler.start()
    if mode == "concurrency":
        records = closed_loop(target, pages, int(load), t0)
    else:
        records = open_loop(target, pages, float(load), t0, wl.seed + 1)
    sampler.stop.set()
    sampler.join()
    records.sort(key=lambda r: r["i"])
    name = f"{a.engine}-{a.memory_gib if a.memory_gib is not None else 'na'}-{a.kv_cache}-" \
           f"{mode}{load}-r{k}"
    return {
        "file": name + ".json", "engine": a.engine, "memory_gib": a.memory_gib,
        "kv_cache": a.kv_cache, "mode": mode, "load": load, "run": k,
        "workload": wl.name, "device": device, "scale": a.scale, "max_new": a.max_new,
        "url": f"http://{target.host}:{target.port}{target.prefix}", "model": target.model,
        "notes": dict(x.split("=", 1) for x in a.note),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "stop": {"by": pages.stopped_by, "pages": count, "duration_s": a.duration},
        "stats": serve_report.run_stats(records, sampler.samples),
        "pages": records, "samples": sampler.samples,
    }


def load_points(a, wl) -> list:
    points = [("concurrency", int(x)) for x in a.concurrency.split(",") if x] if a.concurrency else []
    if a.rate:
        rates = wl.rates if a.rate == "workload" else [float(x) for x in a.rate.split(",") if x]
        points += [("rate", int(r) if float(r).is_integer() else float(r)) for r in rates]
    for mode, load in points:
        if load <= 0:
            raise SystemExit(f"error: --{mode}: {load} must be positive")
    if not points:
        raise SystemExit("error: give --concurrency N[,N…] and/or --rate R[,R…]")
    return points


def write_summary(out: str, device: str | None) -> dict:
    summary = serve_report.summarize(out, device)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    md = serve_report.markdown(summary)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(md)
    print(md)
    return summary


def cmd_run(a) -> int:
    wl = wlmod.load_workload(a.workload)
    points = load_points(a, wl)
    target = Target(a.url, a.api_key, a.model, a.timeout)
    device = device_name(a.device)
    for d in ("runs", "occupancy"):
        os.makedirs(os.path.join(a.out, d), exist_ok=True)
    if a.warmup:
        warm_up(target, wl, a)
    failures = 0
    for mode, load in points:
        for k in range(1, a.runs + 1):
            run = one_run(target, wl, a, mode, load, k, device)
            with open(os.path.join(a.out, "runs", run["file"]), "w") as f:
                json.dump(run, f, indent=1)
            svg = serve_report.occupancy_svg(
                f"{a.engine} {a.kv_cache}, {mode} {load}, run {k}: pages over time",
                run["samples"], run["pages"])
            with open(os.path.join(a.out, "occupancy", run["file"][:-5] + ".svg"), "w") as f:
                f.write(svg)
            s = run["stats"]
            failures += s["failures"]
            print(f"[serve_bench] {run['file']}: {s['pages_completed']}/{s['pages_sent']} pages "
                  f"(stopped by {run['stop']['by']}), {s['pages_per_s']} pages/s, "
                  f"{s['output_tokens_per_s']} tok/s, TTFT p50 {s['ttft_p50_s']} s, latency p95 "
                  f"{s['page_latency_p95_s']} s, failures {s['failures']} {s['failure_reasons'] or ''}",
                  file=sys.stderr, flush=True)
    write_summary(a.out, a.device)
    return 3 if a.strict and failures else 0


def cmd_draw(a) -> int:
    wl = wlmod.load_workload(a.workload)
    pages = list(wlmod.draw_pages(wl, a.pages or wl.pages, a.scale, a.max_new))
    if a.json:
        print(json.dumps({"workload": wl.name, "pages": pages}))
    else:
        for p in pages:
            print(p["i"], p["size"], p["sent"], p["max_tokens"])
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run load points against a server")
    r.add_argument("--url", required=True, help="http://HOST:PORT of the server")
    # ocrctl-paged: ocrctl with `--decoder paged`, a row of its own beside the GQA decoder's.
    r.add_argument("--engine", required=True, choices=["ocrctl", "ocrctl-paged", "vllm"])
    r.add_argument("--out", required=True, help="results folder (runs/, occupancy/, summary.*)")
    r.add_argument("--concurrency", help="closed-loop clients, comma-separated")
    r.add_argument("--rate", help="open-loop pages/s, comma-separated, or `workload`")
    r.add_argument("--runs", type=int, default=3, help="runs of each load point")
    r.add_argument("--kv-cache", default="fp16", choices=["fp16", "fp8", "fp32"],
                   help="the KV cache's type (fp32: a CPU fixture)")
    r.add_argument("--memory-gib", type=float, help="GPU memory the server may use (summary row)")
    r.add_argument("--server-pid", type=int, help="the server's pid, for its GPU memory")
    r.add_argument("--model", help="model name (default: the first of /v1/models)")
    r.add_argument("--api-key")
    r.add_argument("--device", help="device description (default: from nvidia-smi)")
    r.add_argument("--timeout", type=float, default=3600, help="socket timeout of a page, s")
    r.add_argument("--sample-every", type=float, default=0.5, help="seconds between samples")
    r.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="skip the untimed page of each size sent first")
    r.add_argument("--note", action="append", default=[], metavar="KEY=VALUE",
                   help="recorded in each run JSON (server flags, profile, precision)")
    r.add_argument("--strict", action="store_true", help="exit 3 when any page failed")
    d = sub.add_parser("draw", help="print the page stream (no server)")
    d.add_argument("--json", action="store_true")
    for p in (r, d):
        p.add_argument("--workload", default=DEFAULT_WORKLOAD)
        p.add_argument("--pages", type=int, help="pages a run sends (default: the workload's)")
        p.add_argument("--scale", type=float, default=1.0, help="page side scale (CPU fixture)")
        p.add_argument("--max-new", type=int, help="cap on the drawn new-token counts")
    r.add_argument("--duration", type=float, help="seconds a run sends pages for")
    s = sub.add_parser("summarize", help="summary.json and summary.md from OUT/runs")
    s.add_argument("out")
    s.add_argument("--device")
    a = ap.parse_args()
    if a.cmd == "summarize":
        if not serve_report.load_runs(a.out):
            raise SystemExit(f"error: {a.out}/runs holds no run JSON")
        write_summary(a.out, a.device)
        return 0
    if a.scale <= 0 or (a.max_new is not None and a.max_new < 1) or (a.pages is not None and a.pages < 1):
        raise SystemExit("error: --scale, --max-new and --pages must be positive")
    if a.cmd == "run":
        bad = [n for n in a.note if "=" not in n]
        if bad or a.runs < 1 or (a.duration is not None and a.duration <= 0):
            raise SystemExit(f"error: --note needs KEY=VALUE ({bad}); --runs, --duration > 0")
    try:
        return cmd_run(a) if a.cmd == "run" else cmd_draw(a)
    except wlmod.WorkloadError as e:
        raise SystemExit(f"error: --workload {e}") from None


if __name__ == "__main__":
    sys.exit(main())
