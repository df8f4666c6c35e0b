"""Figures of scripts/serve_bench/serve_bench.py's runs (standard library only).

- `run_stats(records, samples)`: one run's pages/s, tokens/s, TTFT and page-latency
  percentiles, failures, peak GPU memory.
- `summarize(dir)`: every run JSON under DIR/runs as issue 37 item 7's `summary.json` rows
  (one per engine, memory, KV cache, mode and load; one figure per run) and a Markdown table of
  medians with ranges and the ocrctl / vLLM ratio.
- `occupancy_svg(...)`: pages running, waiting and in flight over one run, as a small SVG.
"""

import glob
import json
import os
import statistics
import sys

GIB = 2**30


def percentile(xs: list, p: float):
    """Linear interpolation between closest ranks (numpy's default); None when empty."""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _r(x, n=4):
    return None if x is None else round(x, n)


def peak_gpu(samples: list) -> tuple:
    """(peak GiB, source): the server's processes (nvidia-smi) where seen, else the server's
    own /metrics figure, else the device's used memory; (None, None) without any."""
    for key, source in (("gpu_proc_mib", "nvidia-smi, server process tree"),
                        ("gpu_metrics_bytes", "server /metrics"),
                        ("gpu_device_mib", "nvidia-smi, whole device")):
        vals = [s[key] for s in samples if s.get(key) is not None]
        if vals:
            scale = GIB if key.endswith("bytes") else 1024
            return round(max(vals) / scale, 2), source
    return None, None


def window(records: list) -> dict:
    """Steady-state throughput: from the first completion to the last send, the load is on
    (every closed-loop client busy, arrivals still coming), without the start-up wave and
    the drain. Pages completed in that window, and tokens streamed in it (each page's tokens
    spread evenly from its first token to its end)."""
    done = [r for r in records if r["ok"]]
    if not done:
        return {"window_s": None, "window_pages_per_s": None, "window_output_tokens_per_s": None}
    t1 = min(r["t_send"] + r["latency_s"] for r in done)
    t2 = max(r["t_send"] for r in records)
    if t2 <= t1:
        return {"window_s": None, "window_pages_per_s": None, "window_output_tokens_per_s": None}
    pages = sum(1 for r in done if t1 < r["t_send"] + r["latency_s"] <= t2)
    tokens = 0.0
    for r in done:
        a, b = r["t_send"] + (r["ttft_s"] or r["latency_s"]), r["t_send"] + r["latency_s"]
        if b > a:
            tokens += r["completion_tokens"] * max(0.0, min(b, t2) - max(a, t1)) / (b - a)
        elif t1 <= b <= t2:
            tokens += r["completion_tokens"]
    return {"window_s": _r(t2 - t1, 3), "window_pages_per_s": _r(pages / (t2 - t1)),
            "window_output_tokens_per_s": _r(tokens / (t2 - t1), 1)}


def run_stats(records: list, samples: list) -> dict:
    done = [r for r in records if r["ok"]]
    sends = [r["t_send"] for r in records if r.get("t_send") is not None]
    ends = [r["t_send"] + r["latency_s"] for r in done]
    wall = (max(ends) - min(sends)) if done else None
    tokens = sum(r["completion_tokens"] for r in done)
    ttft = [r["ttft_s"] for r in done if r.get("ttft_s") is not None]
    lat = [r["latency_s"] for r in done]
    reasons = {}
    for r in records:
        if not r["ok"]:
            reasons[r["failure"]] = reasons.get(r["failure"], 0) + 1
    peak, source = peak_gpu(samples)
    running = [s["running"] for s in samples if s.get("running") is not None]
    return {
        "pages_sent": len(records),
        "pages_completed": len(done),
        "failures": len(records) - len(done),
        "failure_reasons": reasons,
        "wall_s": _r(wall, 3),
        "pages_per_s": _r(len(done) / wall) if wall else None,
        "output_tokens": tokens,
        "output_tokens_per_s": _r(tokens / wall, 1) if wall else None,
        **window(records),
        "ttft_p50_s": _r(percentile(ttft, 50)),
        "ttft_p95_s": _r(percentile(ttft, 95)),
        "page_latency_p50_s": _r(percentile(lat, 50)),
        "page_latency_p95_s": _r(percentile(lat, 95)),
        "page_latency_p99_s": _r(percentile(lat, 99)),
        "mean_running": _r(statistics.mean(running), 2) if running else None,
        "max_running": max(running) if running else None,
        "peak_gpu_memory_gib": peak,
        "gpu_memory_source": source,
    }


# ---------------------------------------------------------------------------------------------
# summary.json and the Markdown table

ROW_KEYS = ("engine", "memory_gib", "kv_cache", "mode", "load")


def load_runs(out_dir: str) -> list:
    runs = []
    for p in sorted(glob.glob(os.path.join(out_dir, "runs", "*.json"))):
        with open(p) as f:
            runs.append(json.load(f))
    return runs


def summarize(out_dir: str, device: str | None = None) -> dict:
    runs = load_runs(out_dir)
    groups: dict = {}
    for r in runs:
        groups.setdefault(tuple(r[k] for k in ROW_KEYS), []).append(r)
    rows = []
    for key, rs in groups.items():
        rs.sort(key=lambda r: r["run"])
        st = [r["stats"] for r in rs]
        notes = [dict(n) for n in {tuple(sorted(r.get("notes", {}).items())) for r in rs}]
        if len(notes) > 1:
            print(f"warning: runs of {key} were made with different settings {notes}; keep "
                  "different server settings in different folders", file=sys.stderr)
        peaks = [s["peak_gpu_memory_gib"] for s in st if s["peak_gpu_memory_gib"] is not None]
        rows.append({
            **dict(zip(ROW_KEYS, key)),
            "pages_per_s": [s["pages_per_s"] for s in st],
            "p95_page_latency_s": [s["page_latency_p95_s"] for s in st],
            "p50_ttft_s": [s["ttft_p50_s"] for s in st],
            "failures": sum(s["failures"] for s in st),
            "peak_gpu_memory_gib": max(peaks) if peaks else None,
            # Beyond item 7's schema: the rest of each run's figures, for the report.
            "output_tokens_per_s": [s["output_tokens_per_s"] for s in st],
            "window_pages_per_s": [s["window_pages_per_s"] for s in st],
            "p95_ttft_s": [s["ttft_p95_s"] for s in st],
            "p50_page_latency_s": [s["page_latency_p50_s"] for s in st],
            "p99_page_latency_s": [s["page_latency_p99_s"] for s in st],
            "pages_completed": [s["pages_completed"] for s in st],
            "stopped_by": sorted({r["stop"]["by"] for r in rs}),
            "notes": notes,
            "runs": [os.path.join("runs", r["file"]) for r in rs],
        })
    rows.sort(key=lambda r: (r["memory_gib"] or 0, r["mode"], r["load"], r["kv_cache"],
                             r["engine"]))
    first = runs[0] if runs else {}
    return {
        "workload": first.get("workload"),
        "device": device or first.get("device"),
        "scale": first.get("scale"),
        "max_new": first.get("max_new"),
        "rows": rows,
    }


def _med(xs: list):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _cell(xs: list, fmt: str) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "–"
    m = fmt.format(statistics.median(xs))
    return m if len(xs) == 1 else f"{m} ({fmt.format(min(xs))}–{fmt.format(max(xs))})"


def vllm_peer(rows: list, row: dict):
    """The vLLM row to compare an ocrctl row with: same memory, mode and load, the same KV
    cache where vLLM ran one, else vLLM's fp16 row."""
    peers = [r for r in rows if r["engine"] == "vllm" and
             all(r[k] == row[k] for k in ("memory_gib", "mode", "load"))]
    same = [r for r in peers if r["kv_cache"] == row["kv_cache"]]
    fp16 = [r for r in peers if r["kv_cache"] == "fp16"]
    return (same or fp16 or [None])[0]


def markdown(summary: dict) -> str:
    rows = summary["rows"]
    out = [f"Workload {summary['workload']}, device {summary['device']}"
           + (f", page sizes x{summary['scale']}" if summary.get("scale") not in (None, 1, 1.0) else "")
           + (f", new tokens capped at {summary['max_new']}" if summary.get("max_new") else "")
           + ". Medians of the runs, range in brackets. pages/s: completed pages / (first send to "
           "last completion); steady: pages completed from the first completion to the last send.",
           "",
           "| engine | memory GiB | KV | mode | load | pages/s | steady pages/s | output tok/s | p50 TTFT s | "
           "p95 page latency s | p99 page latency s | failures | peak GPU GiB | "
           "pages/s ocrctl/vLLM | p95 latency ocrctl/vLLM |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = lat_ratio = "–"
        peer = vllm_peer(rows, r) if r["engine"].startswith("ocrctl") else None
        if peer:
            a, b = _med(r["pages_per_s"]), _med(peer["pages_per_s"])
            if a is not None and b:
                ratio = f"{a / b:.2f}" + ("" if peer["kv_cache"] == r["kv_cache"] else " (vs fp16)")
            a, b = _med(r["p95_page_latency_s"]), _med(peer["p95_page_latency_s"])
            if a is not None and b:
                lat_ratio = f"{a / b:.2f}"
        out.append(
            f"| {r['engine']} | {r['memory_gib'] if r['memory_gib'] is not None else '–'} | "
            f"{r['kv_cache']} | {r['mode']} | {r['load']} | {_cell(r['pages_per_s'], '{:.3f}')} | "
            f"{_cell(r['window_pages_per_s'], '{:.3f}')} | "
            f"{_cell(r['output_tokens_per_s'], '{:.0f}')} | {_cell(r['p50_ttft_s'], '{:.3f}')} | "
            f"{_cell(r['p95_page_latency_s'], '{:.2f}')} | {_cell(r['p99_page_latency_s'], '{:.2f}')} | "
            f"{r['failures']} | {r['peak_gpu_memory_gib'] if r['peak_gpu_memory_gib'] is not None else '–'} | "
            f"{ratio} | {lat_ratio} |")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# Occupancy over time

SERIES = (("running", "#1f77b4", "running (server)"), ("waiting", "#d62728", "waiting (server)"),
          ("in_flight", "#7f7f7f", "in flight (client)"))


def in_flight(records: list, times: list) -> list:
    """Pages sent and not yet finished (client side) at each time."""
    spans = [(r["t_send"], r["t_send"] + (r.get("latency_s") or 0)) for r in records
             if r.get("t_send") is not None]
    return [sum(1 for a, b in spans if a <= t < b) for t in times]


def occupancy_svg(title: str, samples: list, records: list, w: int = 640, h: int = 260) -> str:
    times = [s["t"] for s in samples]
    series = {k: [s.get(k) for s in samples] for k in ("running", "waiting")}
    series["in_flight"] = in_flight(records, times)
    t_max = max(times + [r["t_send"] + (r.get("latency_s") or 0) for r in records] + [1e-9])
    y_max = max([v for vs in series.values() for v in vs if v is not None] + [1])
    y_max = 4 * -(-int(y_max) // 4)  # a multiple of 4: whole pages at the 5 ticks
    left, right, top, bottom = 44, 12, 28, 34
    pw, ph = w - left - right, h - top - bottom

    def xy(t, v):
        return f"{left + pw * t / t_max:.1f},{top + ph * (1 - v / y_max):.1f}"

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
             f'font-family="sans-serif" font-size="11">',
             f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<text x="{left}" y="16" font-size="12">{_esc(title)}</text>',
             f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>']
    for i in range(5):
        v, t = y_max * i / 4, t_max * i / 4
        y, x = top + ph * (1 - i / 4), left + pw * i / 4
        parts.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{v:.3g}</text>')
        parts.append(f'<text x="{x:.1f}" y="{top + ph + 14}" text-anchor="middle">{t:.3g}</text>')
    parts.append(f'<text x="{left + pw / 2}" y="{h - 4}" text-anchor="middle">seconds since the '
                 f'run started; pages</text>')
    for n, (key, color, label) in enumerate(SERIES):
        pts = [xy(t, v) for t, v in zip(times, series[key]) if v is not None]
        if len(pts) > 1:
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                         f'points="{" ".join(pts)}"/>')
        lx = left + 8 + n * 150
        parts.append(f'<line x1="{lx}" y1="{top + 10}" x2="{lx + 16}" y2="{top + 10}" '
                     f'stroke="{color}" stroke-width="2"/>')
        parts.append(f'<text x="{lx + 20}" y="{top + 14}">{label}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
