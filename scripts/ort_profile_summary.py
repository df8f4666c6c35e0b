#!/usr/bin/env python3
"""Summarises ONNX Runtime profiler traces (OCRCTL_ORT_PROFILE=<prefix> on any ocrctl command).

For each trace file given: model runs (count, median ms) and the kernel time per operator type
and provider, largest first, as a share of all kernel time. On a GPU the kernel time ONNX
Runtime records is the host-side launch span of each node (asynchronous kernels), so read it
with nsys where the two differ.

Usage: scripts/ort_profile_summary.py TRACE.json [...] [--top 15] [--skip-runs 1]
       [--runs-under-ms MS] [--runs-over-ms MS] [--decode-rows N] [--prefill]

--decode-rows N counts only decode steps of N rows: runs whose GroupQueryAttention query input
is [N, 1, hidden]; --prefill only prompts (query length > 1). ONNX Runtime records each node's
input shapes in its event.
"""
import argparse
import bisect
import collections
import json
import statistics


def query_starts(events, wanted):
    """Start times of the GroupQueryAttention nodes whose query shape [B, S, hidden] `wanted`
    accepts (ONNX Runtime records each node's input shapes in its event)."""
    starts = []
    for e in events:
        a = e.get("args", {})
        if e.get("cat") != "Node" or a.get("op_name") != "GroupQueryAttention":
            continue
        shapes = a.get("input_type_shape") or [{}]
        dims = next(iter(shapes[0].values()), [])
        if len(dims) == 3 and wanted(dims):
            starts.append(e["ts"])
    return starts


def summarise(path, top, skip, under_ms, over_ms=None, decode_rows=None, prefill=False):
    events = json.load(open(path))
    runs = sorted(
        (e["ts"], e["dur"])
        for e in events
        if e.get("cat") == "Session" and e.get("name") == "model_run"
    )
    # The first runs include allocation and kernel selection: skipped as warm-up. With
    # --runs-under-ms only the shorter runs count (decode steps rather than prefills), with
    # --runs-over-ms only the longer ones (prefills).
    kept = [
        r
        for r in runs[skip:]
        if (under_ms is None or r[1] < under_ms * 1e3) and (over_ms is None or r[1] > over_ms * 1e3)
    ]
    wanted = None
    if decode_rows is not None:
        wanted = lambda d: d[0] == decode_rows and d[1] == 1
    elif prefill:
        wanted = lambda d: d[1] > 1
    if wanted is not None:
        starts = query_starts(events, wanted)
        kept = [r for r in kept if any(r[0] <= t <= r[0] + r[1] for t in starts)]
    print(f"== {path}")
    if not kept:
        print("no runs counted")
        return
    print(f"model runs: {len(runs)} ({len(kept)} counted), median {statistics.median(d for _, d in kept) / 1e3:.2f} ms")
    spans = [(t, t + d) for t, d in kept]

    def counted(ts):
        i = bisect.bisect_right(spans, (ts, float("inf"))) - 1
        return i >= 0 and spans[i][0] <= ts <= spans[i][1]

    per = collections.Counter()
    count = collections.Counter()
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        if not counted(e["ts"]):
            continue
        a = e.get("args", {})
        key = (a.get("op_name", "?"), a.get("provider", "?").replace("ExecutionProvider", ""))
        per[key] += e["dur"]
        count[key] += 1
    total = sum(per.values()) or 1
    n = len(kept)
    print(f"kernel time per run: {total / n / 1e3:.2f} ms over {sum(count.values()) // n} nodes")
    print(f"{'op':<32} {'provider':<10} {'ms/run':>8} {'share':>6} {'nodes/run':>9}")
    for (op, prov), d in per.most_common(top):
        print(f"{op:<32} {prov:<10} {d / n / 1e3:>8.2f} {100 * d / total:>5.1f}% {count[(op, prov)] // n:>9}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", nargs="+")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--skip-runs", type=int, default=1)
    p.add_argument("--runs-under-ms", type=float, help="count only runs shorter than this")
    p.add_argument("--runs-over-ms", type=float, help="count only runs longer than this")
    p.add_argument("--decode-rows", type=int, help="count only decode steps of this many rows")
    p.add_argument("--prefill", action="store_true", help="count only prompt runs (query length > 1)")
    a = p.parse_args()
    for t in a.traces:
        summarise(t, a.top, a.skip_runs, a.runs_under_ms, a.runs_over_ms, a.decode_rows, a.prefill)


if __name__ == "__main__":
    main()
