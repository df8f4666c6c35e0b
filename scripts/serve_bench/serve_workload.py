"""The page workload of scripts/serve_bench/serve_bench.py (standard library only).

- `load_workload(path)`: the workload file (benchmarks/workloads/ocr-pages.yaml's shape) as a
  checked `Workload`. YAML is read by a small parser for the subset that file uses (block
  mappings, `- {flow map}` sequences, `[flow lists]`, scalars, `#` comments), because the GPU
  machine may lack PyYAML; a `.json` file with the same fields is read with `json`.
- `draw_pages(...)`: the seeded page stream: a size by share, new tokens lognormal (median,
  sigma), rounded and clamped to [min, max], then capped by `--max-new`.
- `png_page(w, h)`: a synthetic page (white, black text-like bars) as PNG bytes, written with
  zlib; the content does not matter for speed, only its size.
"""

import json
import math
import random
import struct
import zlib
from dataclasses import dataclass


class WorkloadError(ValueError):
    """A workload file that cannot be used; the message names the file and the field."""


# ---------------------------------------------------------------------------------------------
# A YAML subset


def _strip_comment(line: str) -> str:
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()


def _split_top(s: str, where: str) -> list[str]:
    """Splits a flow collection's body at the commas outside nested brackets."""
    parts, depth, cur = [], 0, ""
    for c in s:
        if c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    if depth != 0:
        raise WorkloadError(f"{where}: unbalanced brackets in {s!r}")
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts]


def _scalar(s: str):
    s = s.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    low = s.lower()
    if low in ("null", "~", ""):
        return None
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(s)
        except ValueError:
            pass
    return s


def _flow(s: str, where: str):
    s = s.strip()
    if s.startswith("{"):
        if not s.endswith("}"):
            raise WorkloadError(f"{where}: unterminated flow mapping {s!r}")
        out = {}
        for item in _split_top(s[1:-1], where):
            k, sep, v = item.partition(":")
            if not sep:
                raise WorkloadError(f"{where}: {item!r} is not `key: value`")
            out[k.strip()] = _flow(v, f"{where}.{k.strip()}")
        return out
    if s.startswith("["):
        if not s.endswith("]"):
            raise WorkloadError(f"{where}: unterminated flow list {s!r}")
        return [_flow(x, f"{where}[{i}]") for i, x in enumerate(_split_top(s[1:-1], where))]
    return _scalar(s)


def _block(lines: list, i: int, indent: int, where: str):
    """Parses the block starting at lines[i] (all at `indent`); returns (value, next i)."""
    if lines[i][1].startswith("- ") or lines[i][1] == "-":
        out = []
        while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("-"):
            item = lines[i][1][1:].strip()
            if not item or (":" in item and not item.startswith(("{", "[", "'", '"'))):
                raise WorkloadError(f"{where}[{len(out)}]: only `- scalar`, `- {{flow map}}` "
                                    "or `- [flow list]` items are supported")
            out.append(_flow(item, f"{where}[{len(out)}]"))
            i += 1
        return out, i
    out = {}
    while i < len(lines) and lines[i][0] == indent:
        key, sep, rest = lines[i][1].partition(":")
        key = key.strip()
        path = f"{where}.{key}" if where else key
        if not sep or not key:
            raise WorkloadError(f"{path or 'line'}: expected `key: value`, got {lines[i][1]!r}")
        i += 1
        if rest.strip():
            out[key] = _flow(rest, path)
        elif i < len(lines) and lines[i][0] > indent:
            out[key], i = _block(lines, i, lines[i][0], path)
        else:
            out[key] = None
    if i < len(lines) and lines[i][0] > indent:
        raise WorkloadError(f"{where or 'top level'}: unexpected indentation at {lines[i][1]!r}")
    return out, i


def parse_yaml_subset(text: str):
    lines = []
    for raw in text.splitlines():
        body = _strip_comment(raw)
        if body.strip():
            if "\t" in body[: len(body) - len(body.lstrip())]:
                raise WorkloadError(f"tabs in indentation: {raw!r}")
            lines.append((len(body) - len(body.lstrip()), body.strip()))
    if not lines:
        return {}
    value, i = _block(lines, 0, lines[0][0], "")
    if i != len(lines):
        raise WorkloadError(f"unexpected line {lines[i][1]!r}")
    return value


# ---------------------------------------------------------------------------------------------
# The workload


@dataclass
class Workload:
    name: str
    seed: int
    pages: int
    sizes: list  # [(w, h, share)], shares summing to 1
    median: float
    sigma: float
    min_tokens: int
    max_tokens: int
    rates: list


def _need(d, key, kind, where):
    if not isinstance(d, dict) or key not in d:
        raise WorkloadError(f"{where}: missing field `{key}`")
    v = d[key]
    if kind is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if not isinstance(v, kind) or isinstance(v, bool):
        raise WorkloadError(f"{where}.{key}: expected {kind.__name__}, got {v!r}")
    return v


def _size(s, where):
    try:
        w, h = (int(x) for x in str(s).lower().split("x"))
    except ValueError:
        raise WorkloadError(f"{where}: size {s!r} is not WIDTHxHEIGHT") from None
    if w <= 0 or h <= 0:
        raise WorkloadError(f"{where}: size {s!r} must be positive")
    return w, h


def load_workload(path: str) -> Workload:
    import os

    name = os.path.basename(path)
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        raise WorkloadError(f"{path}: {e.strerror}") from None
    try:
        doc = json.loads(text) if path.endswith(".json") else parse_yaml_subset(text)
    except (WorkloadError, json.JSONDecodeError) as e:
        raise WorkloadError(f"{path}: {e}") from None
    w = name
    sizes = _need(doc, "sizes", list, w)
    if not sizes:
        raise WorkloadError(f"{w}.sizes: empty")
    parsed = []
    for i, s in enumerate(sizes):
        where = f"{w}.sizes[{i}]"
        sw, sh = _size(_need(s, "size", str, where), f"{where}.size")
        share = _need(s, "share", float, where)
        if share <= 0:
            raise WorkloadError(f"{where}.share: must be positive, got {share}")
        parsed.append((sw, sh, share))
    total = sum(p[2] for p in parsed)
    if abs(total - 1.0) > 1e-6:
        raise WorkloadError(f"{w}.sizes: shares sum to {total}, not 1")
    nt = _need(doc, "new_tokens", dict, w)
    dist = _need(nt, "distribution", str, f"{w}.new_tokens")
    if dist != "lognormal":
        raise WorkloadError(f"{w}.new_tokens.distribution: only `lognormal` is supported, got {dist!r}")
    median = _need(nt, "median", float, f"{w}.new_tokens")
    sigma = _need(nt, "sigma", float, f"{w}.new_tokens")
    lo, hi = _need(nt, "min", int, f"{w}.new_tokens"), _need(nt, "max", int, f"{w}.new_tokens")
    if median <= 0 or sigma < 0 or not 1 <= lo <= hi:
        raise WorkloadError(f"{w}.new_tokens: need median > 0, sigma >= 0, 1 <= min <= max")
    rates = (doc.get("arrivals") or {}).get("rates_per_s") or []
    return Workload(name, _need(doc, "seed", int, w), _need(doc, "pages", int, w),
                    [(a, b, s / total) for a, b, s in parsed], median, sigma, lo, hi, list(rates))


def scaled(w: int, h: int, scale: float) -> tuple:
    return max(1, round(w * scale)), max(1, round(h * scale))


def draw_pages(wl: Workload, count: int | None, scale: float = 1.0, max_new: int | None = None):
    """Yields `count` pages (forever when None): the same stream for every run of a seed."""
    rng = random.Random(wl.seed)
    mu = math.log(wl.median)
    cum, acc = [], 0.0
    for w, h, share in wl.sizes:
        acc += share
        cum.append(acc)
    i = 0
    while count is None or i < count:
        u = rng.random()
        k = next((j for j, c in enumerate(cum) if u < c), len(cum) - 1)
        n = min(wl.max_tokens, max(wl.min_tokens, round(rng.lognormvariate(mu, wl.sigma))))
        if max_new is not None:
            n = min(n, max_new)
        w, h = wl.sizes[k][:2]
        yield {"i": i, "size": f"{w}x{h}", "sent": "%dx%d" % scaled(w, h, scale),
               "max_tokens": n}
        i += 1


def png_page(w: int, h: int) -> bytes:
    """An RGB PNG of a white page with black bars where lines of text would be."""
    margin, pitch, bar = max(1, w // 16), max(2, h // 40), max(1, h // 120)
    white = b"\x00" + b"\xff" * (3 * w)
    ink = b"\x00" + b"\xff" * (3 * margin) + b"\x00" * (3 * (w - 2 * margin)) + b"\xff" * (3 * margin)
    rows = [ink if (margin <= y < h - margin and y % pitch < bar) else white for y in range(h)]

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"".join(rows), 6)) + chunk(b"IEND", b""))
