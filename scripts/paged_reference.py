"""numpy references of the ONNX Runtime contrib ops in ocrctl's paged decoder, for checking it
without a GPU (`scripts/check_paged.py`) and ONNX Runtime's CUDA kernels against
(`docs/benchmarks/2026-12-05-h200/gpu_paged_probe.py`).

- `paged_attention`: `com.microsoft.PagedAttention` as its schema and CUDA kernel describe it
  (onnxruntime 1.31.1): packed q|k|v of the packed tokens of B sequences
  (`cumulative_sequence_length`), Qwen3's per-head RMSNorms on q and k, rotate-half rotary at
  each token's position (`past_seqlens` + its index), keys and values written into the blocks
  of `block_table`, causal grouped-query attention over each sequence's positions. Float32
  arithmetic; q and k rounded to float16 after the rotary and the cache holding float16
  values, as the kernel's float16 tensors do.
- `SkipSimplifiedLayerNormalization` and `PagedAttention` as `onnx.reference` operators
  (`REFERENCE_OPS`), so that `onnx.reference.ReferenceEvaluator` runs a whole paged graph.
"""

import numpy as np
from onnx.reference.op_run import OpRun


def rms(x, w, eps):
    """RMSNorm over the last axis in float32, times `w`."""
    x = x.astype(np.float32)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w.astype(np.float32)


def rotate(x, pos, cos, sin):
    """Rotate-half rotary of `x [n, heads, D]` at positions `pos [n]` from tables
    `[positions, D / 2]`, rounded to float16 after float32 arithmetic."""
    half = x.shape[-1] // 2
    c = cos[pos].astype(np.float32)[:, None, :]
    s = sin[pos].astype(np.float32)[:, None, :]
    x = x.astype(np.float32)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1).astype(np.float16)


def project(qkv, heads, kv_heads, pos, cos, sin, norms=None, eps=1e-6):
    """The node's prologue for tokens at positions `pos`: split the packed q|k|v, the optional
    `norms = (q_weight, k_weight)` per head, rotary. Returns q, k `[n, ·, D]` (float16) and v."""
    n, width = qkv.shape
    d = width // (heads + 2 * kv_heads)
    q = qkv[:, : heads * d].reshape(n, heads, d)
    k = qkv[:, heads * d:(heads + kv_heads) * d].reshape(n, kv_heads, d)
    v = qkv[:, (heads + kv_heads) * d:].reshape(n, kv_heads, d)
    if norms is not None:
        q = rms(q, norms[0], eps).astype(np.float16)
        k = rms(k, norms[1], eps).astype(np.float16)
    return rotate(q, pos, cos, sin), rotate(k, pos, cos, sin), v


def dense_attention(q, keys, vals, past, scale=None):
    """Causal attention of `q [n, heads, D]` at positions `past`.. over `keys`/`vals`
    `[total, kv_heads, D]` (query head h reads KV head h // (heads / kv_heads))."""
    n, heads, d = q.shape
    group = heads // keys.shape[1]
    total = keys.shape[0]
    scale = d ** -0.5 if scale is None else scale
    out = np.zeros((n, heads, d), np.float32)
    mask = np.arange(total)[None, :] > past + np.arange(n)[:, None]
    for h in range(heads):
        s = q[:, h].astype(np.float32) @ keys[:, h // group].astype(np.float32).T * scale
        s[mask] = -np.inf
        p = np.exp(s - s.max(-1, keepdims=True))
        out[:, h] = (p / p.sum(-1, keepdims=True)) @ vals[:, h // group].astype(np.float32)
    return out.reshape(n, heads * d)


def paged_attention(qkv, kc, vc, cu, past, table, cos, sin, heads, kv_heads, norms=None,
                    eps=1e-6, scale=None):
    """PagedAttention on float32 caches `kc`/`vc [blocks, block, kv_heads, D]`, updated in place.
    Returns the output `[T, heads · D]` (float32)."""
    block = kc.shape[1]
    out = np.zeros((qkv.shape[0], qkv.shape[1] // (heads + 2 * kv_heads) * heads), np.float32)
    for b in range(len(past)):
        lo, hi = int(cu[b]), int(cu[b + 1])
        if hi == lo:
            continue  # a sequence with no token in this call
        pos = int(past[b]) + np.arange(hi - lo)
        q, k, v = project(qkv[lo:hi], heads, kv_heads, pos, cos, sin, norms, eps)
        for i, p in enumerate(pos):
            kc[table[b, p // block], p % block] = k[i]
            vc[table[b, p // block], p % block] = v[i]
        total = int(past[b]) + hi - lo
        keys = np.stack([kc[table[b, p // block], p % block] for p in range(total)])
        vals = np.stack([vc[table[b, p // block], p % block] for p in range(total)])
        out[lo:hi] = dense_attention(q, keys, vals, int(past[b]), scale)
    return out


class PagedAttention(OpRun):
    """`com.microsoft.PagedAttention` for `onnx.reference` (float16 cache, no 8-bit scales)."""

    op_domain = "com.microsoft"

    def _run(self, query, key=None, value=None, key_cache=None, value_cache=None, cu=None,
             past=None, table=None, cos=None, sin=None, slot_mapping=None, head_sink=None,
             q_norm=None, k_norm=None, k_scale=None, v_scale=None, metadata=None,
             num_heads=None, kv_num_heads=None, scale=None, do_rotary=None,
             rotary_interleaved=None, qk_norm_epsilon=None, k_quant_type=None,
             v_quant_type=None):
        # onnx.reference passes an input named "" as None or as an empty array.
        def given(x):
            return x is not None and x.size > 0
        if any(given(x) for x in (key, value, slot_mapping, head_sink, k_scale, v_scale)):
            raise NotImplementedError("only packed q|k|v, no slot mapping, sinks or 8-bit cache")
        if do_rotary != 1 or rotary_interleaved:
            raise NotImplementedError("only rotate-half rotary")
        kc = key_cache.astype(np.float32)
        vc = value_cache.astype(np.float32)
        norms = (q_norm, k_norm) if given(q_norm) else None
        eps = 1e-6 if qk_norm_epsilon is None else qk_norm_epsilon
        out = paged_attention(query, kc, vc, cu, past, table, cos, sin, num_heads, kv_num_heads,
                              norms, eps, scale)
        return (out.astype(query.dtype), kc.astype(key_cache.dtype), vc.astype(value_cache.dtype))


class SkipSimplifiedLayerNormalization(OpRun):
    """`com.microsoft.SkipSimplifiedLayerNormalization`: RMSNorm(input + skip) · gamma, and the
    sum (output 3), computed in float32."""

    op_domain = "com.microsoft"

    def _run(self, x, skip, gamma, bias=None, epsilon=None):
        s = x.astype(np.float32) + skip.astype(np.float32)
        if bias is not None and bias.size > 0:
            s = s + bias.astype(np.float32)
        y = rms(s, gamma, 1e-5 if epsilon is None else epsilon)
        unused = np.zeros(0, np.float32)  # mean and inverse std, which no graph reads
        outs = (y.astype(x.dtype), unused, unused, s.astype(x.dtype))
        return outs[: len(self.onnx_node.output)]


REFERENCE_OPS = [PagedAttention, SkipSimplifiedLayerNormalization]
