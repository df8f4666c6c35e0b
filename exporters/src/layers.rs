//! The one place where Linear, RMSNorm, RoPE, activations and attention become ONNX nodes.
//!
//! Every model part calls these helpers, so switching [`Target`] switches the whole export:
//! - [`Target::TensorRt`]: standard ONNX ops only (what the onnx-tensorrt parser accepts).
//! - [`Target::Ort`]: ONNX Runtime's fused contrib ops where they help on CUDA/CPU:
//!   `com.microsoft.MultiHeadAttention` for the vision encoder's unmasked attention (avoids
//!   materialising S×S scores per head), the vision encoder's 2-D RoPE as
//!   `com.microsoft.RotaryEmbedding` ([`rotary_interleaved`]) and its residual sums with the
//!   RMSNorm after them as `com.microsoft.SkipSimplifiedLayerNormalization`
//!   ([`add_rms_norm`]); the GQA decoder adds `com.microsoft.GroupQueryAttention`. A lone
//!   RMSNorm is written in standard ops in the form ONNX Runtime's `SimplifiedLayerNormFusion`
//!   turns into its fused kernel on CPU and CUDA (see [`rms_norm`]).
//!
//! Numerics follow transformers: norms are computed in float32 and cast back before the
//! weight multiply; attention softmax runs in float32.

use crate::checkpoint::Weights;
use crate::graph::{Attr, DType, Dim, Graph, Value};
use crate::ExportError;
use serde::{Deserialize, Serialize};

/// Which runtime the graphs are written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// Standard ONNX ops only: TensorRT, and any ONNX runtime.
    #[serde(rename = "tensorrt")]
    TensorRt,
    /// ONNX Runtime's CPU and CUDA providers, with `com.microsoft` fused ops.
    Ort,
}

/// How a graph is emitted: activation dtype and target.
#[derive(Debug, Clone, Copy)]
pub struct Emit {
    /// Activation and weight dtype (`F32` or `F16`).
    pub act: DType,
    pub target: Target,
    /// INT4 weights for Linear layers, if any.
    pub quant: Option<Quant>,
    /// Expose every Linear's input as an extra output `calib.<weight name>` (`[rows, K]`),
    /// for activation-aware calibration runs.
    pub calibrate: bool,
}

impl Emit {
    /// The default-domain opset of the graphs ([`crate::export::OPSET`] for both targets).
    pub fn opset(&self) -> i64 {
        crate::export::OPSET
    }
}

/// Prefix of the calibration outputs added when [`Emit::calibrate`] is set.
pub const CALIB_PREFIX: &str = "calib.";

/// How INT4 Linear weights are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Int4Format {
    /// `DequantizeLinear(INT4, block_size) → MatMul` (opset 21): TensorRT, and ORT fuses it
    /// into `MatMulNBits` on CPU and CUDA.
    Qdq,
    /// `com.microsoft.MatMulNBits` directly (ONNX Runtime only).
    MatMulNBits,
}

/// INT4 settings of an export.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quant {
    pub block_size: usize,
    pub format: Int4Format,
    /// Quantize the lm_head as well (it is the largest single matrix).
    pub lm_head: bool,
    /// `accuracy_level` attribute of `MatMulNBits` nodes (0 = float compute, 4 = int8
    /// activations on CPU); QDQ graphs get theirs from the session option
    /// `session.qdq_matmulnbits_accuracy_level` instead.
    pub accuracy_level: u8,
}

/// Most negative finite f32: masked scores (a fully masked row stays finite, never NaN).
pub const MASK_MIN: f32 = f32::MIN;

/// Writes `W` (PyTorch layout `[out, in]`) transposed to `[in, out]` and multiplies; with
/// [`Emit::quant`] the weight is stored as block-wise INT4 (see [`crate::quant`]).
pub fn linear(
    g: &mut Graph,
    e: Emit,
    w: &dyn Weights,
    x: &Value,
    name: &str,
    out: usize,
    inp: usize,
) -> Result<Value, ExportError> {
    calibration_output(g, e, x, name, inp);
    let v = w.get(name, &[out, inp])?;
    matmul(g, e, x, name, &v, out, inp)
}

/// Several Linears of the same input as one: on [`Target::Ort`] their weights are stacked
/// into one `[in, Σout]` matrix (`packed`), multiplied once and `Split` into the parts, in
/// `parts` order. Why: a decode step multiplies a few rows by each matrix, and such skinny
/// GEMMs are bound by their launch and by how few tiles they give the GPU, not by the
/// weights: one wider GEMM and a `Split` cost less than two or three narrow ones (Qwen3's
/// Q/K/V and gate/up). Each output column is the same dot product as before, and INT4 blocks
/// run along the input axis per output column, so the quantized weights are those of the
/// parts side by side. TensorRT fuses such GEMMs itself, and calibration graphs need each
/// Linear's input under its own name, so both keep one MatMul per Linear.
pub fn linears_packed(
    g: &mut Graph,
    e: Emit,
    w: &dyn Weights,
    x: &Value,
    packed: &str,
    parts: &[(&str, usize)],
    inp: usize,
) -> Result<Vec<Value>, ExportError> {
    if e.target != Target::Ort || e.calibrate || parts.len() < 2 {
        return parts
            .iter()
            .map(|&(name, out)| linear(g, e, w, x, name, out, inp))
            .collect();
    }
    let y = linear_stacked(g, e, w, x, packed, parts, inp)?;
    let sizes: Vec<i64> = parts.iter().map(|p| p.1 as i64).collect();
    let sizes = g.const_i64(&sizes);
    Ok(g.op_multi(
        "Split",
        &[&y, &sizes],
        &[("axis", Attr::Int(-1))],
        parts.len(),
    ))
}

/// The Linears `parts` of the same input as one MatMul of their weights stacked into an
/// `[in, Σout]` matrix stored as `packed`: the parts side by side along the last axis, unsplit
/// (for an op that takes them packed, like PagedAttention's q|k|v).
pub fn linear_stacked(
    g: &mut Graph,
    e: Emit,
    w: &dyn Weights,
    x: &Value,
    packed: &str,
    parts: &[(&str, usize)],
    inp: usize,
) -> Result<Value, ExportError> {
    let mut v = Vec::new();
    for &(name, out) in parts {
        v.extend(w.get(name, &[out, inp])?);
    }
    let total = parts.iter().map(|p| p.1).sum();
    matmul(g, e, x, packed, &v, total, inp)
}

/// With [`Emit::calibrate`], exposes `x` (the input of Linear `name`, or another tensor
/// whose last axis is `inp` wide) as the output `calib.<name>` `[rows, in]`.
pub(crate) fn calibration_output(g: &mut Graph, e: Emit, x: &Value, name: &str, inp: usize) {
    if !e.calibrate {
        return;
    }
    let shape = g.const_i64(&[-1, inp as i64]);
    let flat = g.op("Reshape", &[x, &shape], &[]);
    let out = format!("{CALIB_PREFIX}{name}");
    g.output(
        &flat,
        &out,
        e.act,
        &[Dim::Named(format!("rows_{name}")), Dim::Fixed(inp as i64)],
    );
}

/// `x · Wᵀ` for the `[out, in]` matrix `v`, stored under `name`: as INT4 with
/// [`Emit::quant`] (the lm_head only if the quantization says so), else in the activation dtype.
fn matmul(
    g: &mut Graph,
    e: Emit,
    x: &Value,
    name: &str,
    v: &[f32],
    out: usize,
    inp: usize,
) -> Result<Value, ExportError> {
    match e.quant {
        Some(q) if q.lm_head || !is_lm_head(name) => linear_int4(g, e, q, x, name, v, out, inp),
        _ => {
            let t = transpose(v, out, inp);
            let wt = g.weight(name, e.act, &[inp as i64, out as i64], &t)?;
            Ok(g.op("MatMul", &[x, &wt], &[]))
        }
    }
}

/// `[out, in]` → `[in, out]` (PyTorch's Linear layout to ONNX MatMul's).
pub(crate) fn transpose(v: &[f32], out: usize, inp: usize) -> Vec<f32> {
    let mut t = vec![0f32; v.len()];
    for o in 0..out {
        for i in 0..inp {
            t[i * out + o] = v[o * inp + i];
        }
    }
    t
}

/// Whether `name` is the output projection (`lm_head.weight` or the tied embeddings).
fn is_lm_head(name: &str) -> bool {
    name == "lm_head.weight" || name.ends_with("embed_tokens.weight")
}

#[allow(clippy::too_many_arguments)]
fn linear_int4(
    g: &mut Graph,
    e: Emit,
    q: Quant,
    x: &Value,
    name: &str,
    v: &[f32],
    out: usize,
    inp: usize,
) -> Result<Value, ExportError> {
    crate::quant::check_block_size(q.block_size, inp, name).map_err(ExportError::Invalid)?;
    let t = transpose(v, out, inp);
    let bq = crate::quant::quantize(&t, inp, out, q.block_size);
    let blocks = (inp / q.block_size) as i64;
    match q.format {
        Int4Format::Qdq => {
            let packed = crate::quant::pack_int4_rows(&bq.q);
            let wq = g.initializer(
                &format!("{name}_int4"),
                DType::I4,
                &[inp as i64, out as i64],
                packed,
            )?;
            let sc = g.weight(
                &format!("{name}_scale"),
                e.act,
                &[blocks, out as i64],
                &bq.scales,
            )?;
            let dq = g.op(
                "DequantizeLinear",
                &[&wq, &sc],
                &[
                    ("axis", Attr::Int(0)),
                    ("block_size", Attr::Int(q.block_size as i64)),
                ],
            );
            Ok(g.op("MatMul", &[x, &dq], &[]))
        }
        Int4Format::MatMulNBits => {
            let (b, scales) = crate::quant::pack_matmulnbits(&bq);
            let bw = g.initializer(
                &format!("{name}_B"),
                DType::U8,
                &[out as i64, blocks, (q.block_size / 2) as i64],
                b,
            )?;
            let sc = g.weight(
                &format!("{name}_scales"),
                e.act,
                &[out as i64 * blocks],
                &scales,
            )?;
            Ok(g.op_in(
                "com.microsoft",
                "MatMulNBits",
                &[x, &bw, &sc],
                &[
                    ("K", Attr::Int(inp as i64)),
                    ("N", Attr::Int(out as i64)),
                    ("bits", Attr::Int(4)),
                    ("block_size", Attr::Int(q.block_size as i64)),
                    ("accuracy_level", Attr::Int(q.accuracy_level as i64)),
                ],
            ))
        }
    }
}

/// A 1-D weight such as a norm scale.
pub fn vector(
    g: &mut Graph,
    e: Emit,
    w: &dyn Weights,
    name: &str,
    len: usize,
) -> Result<Value, ExportError> {
    let v = w.get(name, &[len])?;
    g.weight(name, e.act, &[len as i64], &v)
}

/// Casts `x` from `from` to `to` when they differ.
pub fn cast(g: &mut Graph, x: &Value, from: DType, to: DType) -> Value {
    if from == to {
        x.clone()
    } else {
        g.op("Cast", &[x], &[("to", Attr::Int(to.onnx_code()))])
    }
}

/// RMSNorm over the last axis: `w * cast(x / sqrt(mean(x²) + eps))` computed in float32.
pub fn rms_norm(
    g: &mut Graph,
    e: Emit,
    w: &dyn Weights,
    x: &Value,
    name: &str,
    len: usize,
    eps: f64,
) -> Result<Value, ExportError> {
    let scale = vector(g, e, w, name, len)?;
    let xf = cast(g, x, e.act, DType::F32);
    // For ONNX Runtime, `Pow(x, 2)`: the pattern its SimplifiedLayerNormFusion matches
    // (Pow → ReduceMean → Add → Sqrt → Div → Mul, casts around it), so sessions run its fused
    // kernel as with the contrib op, while the file holds standard ops only. On the H200 the
    // CUDA-optimized GQA fp16 decoder is the same graph either way (454 nodes, 57 fused norms).
    let sq = if e.target == Target::Ort {
        let two = g.scalar(DType::F32, 2.0);
        g.op("Pow", &[&xf, &two], &[])
    } else {
        g.op("Mul", &[&xf, &xf], &[])
    };
    let axes = g.const_i64(&[-1]);
    let ms = g.op("ReduceMean", &[&sq, &axes], &[("keepdims", Attr::Int(1))]);
    let epsv = g.scalar(DType::F32, eps as f32);
    let var = g.op("Add", &[&ms, &epsv], &[]);
    let rms = g.op("Sqrt", &[&var], &[]);
    let normed = g.op("Div", &[&xf, &rms], &[]);
    let normed = cast(g, &normed, DType::F32, e.act);
    Ok(g.op("Mul", &[&normed, &scale], &[]))
}

/// `x + add` and the RMSNorm of that sum (`add` absent: `x` and its RMSNorm): the residual
/// step of a pre-norm transformer. Returns `(normed, sum)`.
///
/// For [`Target::Ort`] the pair is one `com.microsoft.SkipSimplifiedLayerNormalization` node
/// (its fourth output is the sum). ONNX Runtime 1.31's `SkipLayerNormFusion` does not do this
/// itself: it matches only `LayerNormalization`, and only an `Add` with a single consumer,
/// while a residual sum also feeds the next residual `Add`. The CPU (float, float16) and CUDA
/// kernels add and normalise in float32 and round once, where transformers rounds the sum to
/// the activation dtype first: the same in float32, within the float16 tolerance otherwise
/// (`tests/gqa.rs`, `tests/parity.rs`).
#[allow(clippy::too_many_arguments)]
pub fn add_rms_norm(
    g: &mut Graph,
    e: Emit,
    w: &dyn Weights,
    x: &Value,
    add: Option<&Value>,
    name: &str,
    len: usize,
    eps: f64,
) -> Result<(Value, Value), ExportError> {
    let Some(add) = add else {
        return Ok((rms_norm(g, e, w, x, name, len, eps)?, x.clone()));
    };
    if e.target != Target::Ort {
        let sum = g.op("Add", &[x, add], &[]);
        return Ok((rms_norm(g, e, w, &sum, name, len, eps)?, sum));
    }
    let scale = vector(g, e, w, name, len)?;
    let outs = g.op_some_outputs_in(
        "com.microsoft",
        "SkipSimplifiedLayerNormalization",
        &[x, add, &scale],
        &[("epsilon", Attr::Float(eps as f32))],
        &[true, false, false, true],
    );
    Ok((outs[0].clone(), outs[1].clone()))
}

/// `x * sigmoid(x)`.
pub fn silu(g: &mut Graph, x: &Value) -> Value {
    let s = g.op("Sigmoid", &[x], &[]);
    g.op("Mul", &[x, &s], &[])
}

/// Exact (erf) GELU: `0.5·x·(1 + erf(x/√2))`.
pub fn gelu(g: &mut Graph, e: Emit, x: &Value) -> Value {
    let inv_sqrt2 = g.scalar(e.act, std::f32::consts::FRAC_1_SQRT_2);
    let half = g.scalar(e.act, 0.5);
    let one = g.scalar(e.act, 1.0);
    let xs = g.op("Mul", &[x, &inv_sqrt2], &[]);
    let erf = g.op("Erf", &[&xs], &[]);
    let p = g.op("Add", &[&erf, &one], &[]);
    let hx = g.op("Mul", &[x, &half], &[]);
    g.op("Mul", &[&hx, &p], &[])
}

/// Gated MLP: `down(act(gate(x)) * up(x))` with `act` = `silu` (SwiGLU) or exact `gelu`.
/// `pack` multiplies gate and up as one matrix on [`Target::Ort`] ([`linears_packed`]):
/// worth it for the few rows of a decode step, not for thousands of image patches, whose
/// GEMMs already fill the GPU and whose `Split` copies the whole activation once more:
/// packing the vision encoder's q|k|v and gate|up made an A4 page 4 ms slower on the H200
/// (docs/benchmarks/2026-12-04-h200/ §4).
#[allow(clippy::too_many_arguments)]
pub fn gated_mlp(
    g: &mut Graph,
    e: Emit,
    w: &dyn Weights,
    x: &Value,
    prefix: &str,
    hidden: usize,
    inter: usize,
    act: &str,
    pack: bool,
) -> Result<Value, ExportError> {
    let gate_name = format!("{prefix}.gate_proj.weight");
    let up_name = format!("{prefix}.up_proj.weight");
    let (gate, up) = if pack {
        let packed = format!("{prefix}.gate_up_proj.weight");
        let parts = [(gate_name.as_str(), inter), (up_name.as_str(), inter)];
        let mut gu = linears_packed(g, e, w, x, &packed, &parts, hidden)?;
        let up = gu.pop().expect("two parts");
        (gu.pop().expect("two parts"), up)
    } else {
        (
            linear(g, e, w, x, &gate_name, inter, hidden)?,
            linear(g, e, w, x, &up_name, inter, hidden)?,
        )
    };
    let a = match act {
        "silu" => silu(g, &gate),
        "gelu" => gelu(g, e, &gate),
        other => {
            return Err(ExportError::Invalid(format!(
                "unsupported MLP activation `{other}`"
            )))
        }
    };
    let h = g.op("Mul", &[&a, &up], &[]);
    linear(
        g,
        e,
        w,
        &h,
        &format!("{prefix}.down_proj.weight"),
        hidden,
        inter,
    )
}

/// Rotary embedding in the rotate-half convention: `x·cos + rotate_half(x)·sin`, where
/// `rotate_half([a, b]) = [-b, a]` over the last axis. `cos`/`sin` must broadcast to `x`.
pub fn rope(g: &mut Graph, x: &Value, cos: &Value, sin: &Value) -> Value {
    let halves = g.op_multi(
        "Split",
        &[x],
        &[("axis", Attr::Int(-1)), ("num_outputs", Attr::Int(2))],
        2,
    );
    let neg = g.op("Neg", &[&halves[1]], &[]);
    let rot = g.op("Concat", &[&neg, &halves[0]], &[("axis", Attr::Int(-1))]);
    let a = g.op("Mul", &[x, cos], &[]);
    let b = g.op("Mul", &[&rot, sin], &[]);
    g.op("Add", &[&a, &b], &[])
}

/// Rotary embedding by `com.microsoft.RotaryEmbedding` in the interleaved convention
/// (`interleaved = 1`: channels `2i` and `2i + 1` are rotated by angle `i`) on
/// `x [1, S, blocks·width]`, in `blocks` rotary blocks of `width` channels each:
/// `position_ids [1, S]` (int64) index the rows of `cos`/`sin [positions, width / 2]`, and
/// ONNX Runtime takes the block width from the tables' width.
///
/// The input must be 3-D: ONNX Runtime reads a 4-D input as `[B, heads, S, head_dim]`
/// (`rotary_embedding_helper.h`), so a `[B, S, heads, head_dim]` tensor would be rotated
/// along the wrong axes, silently.
pub fn rotary_interleaved(
    g: &mut Graph,
    x: &Value,
    position_ids: &Value,
    cos: &Value,
    sin: &Value,
    blocks: usize,
) -> Value {
    g.op_in(
        "com.microsoft",
        "RotaryEmbedding",
        &[x, position_ids, cos, sin],
        &[
            ("interleaved", Attr::Int(1)),
            ("num_heads", Attr::Int(blocks as i64)),
        ],
    )
}

/// Scaled dot-product attention on BNSH tensors with standard ops.
///
/// `q`: `[B, heads, S, d]`; `k`, `v`: `[B, kv_heads, T, d]`; `mask`: optional bool
/// `[B|1, 1, S, T]` (true = may attend). Returns `[B, S, heads·d]`.
#[allow(clippy::too_many_arguments)]
pub fn attention_bnsh(
    g: &mut Graph,
    e: Emit,
    q: &Value,
    k: &Value,
    v: &Value,
    mask: Option<&Value>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
) -> Value {
    let rep = heads / kv_heads;
    let (k, v) = if rep > 1 {
        let axes = g.const_i64(&[2]);
        let reps = g.const_i64(&[1, 1, rep as i64, 1, 1]);
        let shape = g.const_i64(&[0, heads as i64, -1, head_dim as i64]);
        let k5 = g.op("Unsqueeze", &[k, &axes], &[]);
        let k5 = g.op("Expand", &[&k5, &reps], &[]);
        let v5 = g.op("Unsqueeze", &[v, &axes], &[]);
        let v5 = g.op("Expand", &[&v5, &reps], &[]);
        (
            g.op("Reshape", &[&k5, &shape], &[]),
            g.op("Reshape", &[&v5, &shape], &[]),
        )
    } else {
        (k.clone(), v.clone())
    };
    let kt = g.op(
        "Transpose",
        &[&k],
        &[("perm", Attr::Ints(vec![0, 1, 3, 2]))],
    );
    let scores = g.op("MatMul", &[q, &kt], &[]);
    let scores = cast(g, &scores, e.act, DType::F32);
    let scale = g.scalar(DType::F32, (head_dim as f32).powf(-0.5));
    let scores = g.op("Mul", &[&scores, &scale], &[]);
    let scores = match mask {
        Some(m) => {
            let min = g.scalar(DType::F32, MASK_MIN);
            g.op("Where", &[m, &scores, &min], &[])
        }
        None => scores,
    };
    let probs = g.op("Softmax", &[&scores], &[("axis", Attr::Int(-1))]);
    let probs = cast(g, &probs, DType::F32, e.act);
    let ctx = g.op("MatMul", &[&probs, &v], &[]);
    let ctx = g.op(
        "Transpose",
        &[&ctx],
        &[("perm", Attr::Ints(vec![0, 2, 1, 3]))],
    );
    let shape = g.const_i64(&[0, 0, (heads * head_dim) as i64]);
    g.op("Reshape", &[&ctx, &shape], &[])
}

/// Unmasked self-attention for the vision encoder (after RoPE). Returns `[1, S, heads·d]`.
/// [`Target::Ort`]: `com.microsoft.MultiHeadAttention` on `[1, S, heads·d]` inputs; otherwise
/// standard ops on BSNH inputs `[1, S, heads, d]`.
pub fn vision_attention(
    g: &mut Graph,
    e: Emit,
    q: &Value,
    k: &Value,
    v: &Value,
    heads: usize,
    head_dim: usize,
) -> Value {
    if e.target == Target::Ort {
        return g.op_in(
            "com.microsoft",
            "MultiHeadAttention",
            &[q, k, v],
            &[
                ("num_heads", Attr::Int(heads as i64)),
                ("scale", Attr::Float((head_dim as f32).powf(-0.5))),
            ],
        );
    }
    let perm = [("perm", Attr::Ints(vec![0, 2, 1, 3]))];
    let qt = g.op("Transpose", &[q], &perm);
    let kt = g.op("Transpose", &[k], &perm);
    let vt = g.op("Transpose", &[v], &perm);
    attention_bnsh(g, e, &qt, &kt, &vt, None, heads, heads, head_dim)
}

/// `inv_freq[i] = 1 / θ^(2i/dim)` for `i < dim/2`, in float32 as transformers computes it.
pub fn inv_freq(theta: f64, dim: usize) -> Vec<f32> {
    (0..dim / 2)
        .map(|i| {
            let exponent = (2 * i) as f32 / dim as f32;
            1.0f32 / (theta as f32).powf(exponent)
        })
        .collect()
}
