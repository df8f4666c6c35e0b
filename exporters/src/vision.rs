//! `vision_encoder.onnx`: Pixtral encoder + LightOnOCR projector, one image per call.
//!
//! `pixel_values [1, C, H, W]` → `image_features [N, text_hidden]`, N = (H/28)·(W/28).
//! Ports transformers' `pixtral/modeling_pixtral.py` (`PixtralVisionModel`,
//! `PixtralRotaryEmbedding`) and `lighton_ocr/modeling_lighton_ocr.py`
//! (`LightOnOcrMultiModalProjector`, `LightOnOcrPatchMerger`).
//!
//! 2-D RoPE: a cos/sin table over the `max_side²` grid positions, indexed by the position id
//! `row·max_side + col`. `--target tensorrt` gathers full-width rows and rotates with standard
//! ops; `--target ort` gathers this image's half-width rows, repeats them across a block of
//! heads, and hands them to ONNX Runtime's `RotaryEmbedding` (interleaved, over Q/K
//! projections whose rows are reordered to match) on `[1, S, heads·head_dim]` (a 4-D input
//! would be read as BNSH, the layout mistake that broke other Pixtral exports), checked
//! against the reference like every graph.

use crate::checkpoint::Weights;
use crate::config::{ModelConfig, VisionConfig};
use crate::contract::tensor;
use crate::graph::{Attr, DType, Dim, Graph, Value};
use crate::layers::{self, Emit, Target};
use crate::ExportError;

/// Prefix of the Pixtral weights in a LightOnOCR checkpoint.
pub const ENCODER: &str = "model.vision_encoder";
/// Prefix of the projector weights.
pub const PROJECTOR: &str = "model.vision_projection";

/// The Pixtral 2-D RoPE angles: row `r` uses the even-indexed frequencies, column `c` the
/// odd-indexed ones; each position's `head_dim/2` angles are duplicated to `head_dim`.
/// Returns `(cos, sin)`, each `[max_side², head_dim]` row-major, indexed by `r·max_side + c`.
pub fn pixtral_rope_table(theta: f64, head_dim: usize, max_side: usize) -> (Vec<f32>, Vec<f32>) {
    let freqs = layers::inv_freq(theta, head_dim);
    let even: Vec<f32> = freqs.iter().step_by(2).copied().collect();
    let odd: Vec<f32> = freqs.iter().skip(1).step_by(2).copied().collect();
    let n = max_side * max_side;
    let mut cos = Vec::with_capacity(n * head_dim);
    let mut sin = Vec::with_capacity(n * head_dim);
    let mut angles = Vec::with_capacity(head_dim / 2);
    for r in 0..max_side {
        for c in 0..max_side {
            angles.clear();
            angles.extend(even.iter().map(|f| r as f32 * f));
            angles.extend(odd.iter().map(|f| c as f32 * f));
            for _ in 0..2 {
                cos.extend(angles.iter().map(|a| (*a as f64).cos() as f32));
                sin.extend(angles.iter().map(|a| (*a as f64).sin() as f32));
            }
        }
    }
    (cos, sin)
}

/// The 2-D RoPE of one image, as its attention layers take it.
enum Rope {
    /// `cos`/`sin [S, 1, head_dim]`, broadcast over the heads of `[1, S, heads, head_dim]`
    /// (standard ops, [`layers::rope`]).
    Explicit { cos: Value, sin: Value },
    /// This image's angles `cos`/`sin [S, group·head_dim / 2]`, each row its position's
    /// `head_dim / 2` angles repeated `group` times, for [`layers::rotary_interleaved`] over
    /// blocks of `group` heads (see [`rotary_group`]); `ids [1, S]` are `0..S`.
    /// Q and K come out of their projections in [`interleaved_rows`] order.
    Fused {
        ids: Value,
        cos: Value,
        sin: Value,
        group: usize,
    },
}

/// The widest rotary block, in channels (= CUDA threads per block, see [`rotary_group`]).
const ROTARY_BLOCK_CHANNELS: usize = 256;

/// How many heads one `RotaryEmbedding` block rotates: the most that divide `heads` and fit
/// `ROTARY_BLOCK_CHANNELS` channels.
///
/// Why: ONNX Runtime's CUDA kernel (`rotary_embedding_impl.cu`) launches one block per
/// (position, head) with one thread per channel. At Pixtral's head size 64 that is 64-thread
/// blocks, 137 280 of them on an A4 page, and the kernel ran at ~0.4 TB/s (4.1 ms of the
/// encoder's 37 ms, `docs/benchmarks/2026-12-04-h200`). The kernel takes the block width from
/// the tables' width, so wider tables give it wider blocks over the same data. On the H200
/// (`docs/benchmarks/2026-12-04-h200/gpu_rotary_probe.py`, one rotation of an A4 page's Q):
/// 84 µs in 64-channel blocks, 47 in 256, 49 in 512, 65 in 1024. ONNX Runtime refuses blocks
/// over 1024.
fn rotary_group(heads: usize, head_dim: usize) -> usize {
    (1..=heads)
        .rev()
        .find(|g| heads.is_multiple_of(*g) && g * head_dim <= ROTARY_BLOCK_CHANNELS)
        .unwrap_or(1)
}

/// The Q/K projection rows in interleaved order: within each head, output `2i` is the
/// checkpoint's row `i` and output `2i + 1` its row `i + head_dim/2`.
///
/// Why: Pixtral rotates channel `i` with `i + head_dim/2` (rotate-half); a rotary block wider
/// than one head ([`rotary_group`]) would pair channels across heads in that convention, while
/// the interleaved one pairs neighbours, which stay inside their head. Q and K are reordered
/// alike within each head and V not at all, so every score `q·k` and the attention output are
/// unchanged.
fn interleaved_rows(heads: usize, head_dim: usize) -> Vec<usize> {
    let half = head_dim / 2;
    (0..heads)
        .flat_map(|h| (0..half).flat_map(move |i| [h * head_dim + i, h * head_dim + half + i]))
        .collect()
}

/// `weights` with the rows (output channels) of the `[out, in]` matrices `names` reordered:
/// row `j` is the checkpoint's row `rows[j]`. Each output of such a Linear is the same dot
/// product as before, and INT4 blocks run along the input axis of each row, so quantizing the
/// reordered matrix gives the original rows' blocks in the new order.
struct Reordered<'a> {
    weights: &'a dyn Weights,
    names: [String; 2],
    rows: &'a [usize],
}

impl Weights for Reordered<'_> {
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ExportError> {
        let v = self.weights.get(name, shape)?;
        if !self.names.iter().any(|n| n == name) {
            return Ok(v);
        }
        let inp = shape[1];
        Ok(self
            .rows
            .iter()
            .flat_map(|&r| v[r * inp..(r + 1) * inp].iter().copied())
            .collect())
    }

    fn contains(&self, name: &str) -> bool {
        self.weights.contains(name)
    }

    fn source_dtype(&self) -> String {
        self.weights.source_dtype()
    }
}

/// Position ids `row·max_side + col` over the `h × wd` patch grid, and the table lookup that
/// [`Rope`] needs for `e.target`.
fn rope_inputs(
    g: &mut Graph,
    e: Emit,
    v: &crate::config::VisionConfig,
    max_side: usize,
    h: &Value,
    wd: &Value,
) -> Result<Rope, ExportError> {
    let (cos_t, sin_t) = pixtral_rope_table(v.rope_theta, v.head_dim, max_side);
    let zero = g.scalar_i64(0);
    let one = g.scalar_i64(1);
    // Explicit constant axes: TensorRT requires Squeeze's axes to be an initializer.
    let sq_axes = g.const_i64(&[0]);
    let h_s = g.op("Squeeze", &[h, &sq_axes], &[]);
    let w_s = g.op("Squeeze", &[wd, &sq_axes], &[]);
    let rows = g.op("Range", &[&zero, &h_s, &one], &[]);
    let cols = g.op("Range", &[&zero, &w_s, &one], &[]);
    let ax1 = g.const_i64(&[1]);
    let ax0 = g.const_i64(&[0]);
    let rows = g.op("Unsqueeze", &[&rows, &ax1], &[]);
    let cols = g.op("Unsqueeze", &[&cols, &ax0], &[]);
    let side = g.scalar_i64(max_side as i64);
    let rows = g.op("Mul", &[&rows, &side], &[]);
    let pos = g.op("Add", &[&rows, &cols], &[]);
    if e.target == Target::Ort {
        // Each table row holds its angles twice (rotate-half layout): keep the first half.
        let half = v.head_dim / 2;
        let halve = |t: &[f32]| -> Vec<f32> {
            t.chunks(v.head_dim)
                .flat_map(|r| r[..half].to_vec())
                .collect()
        };
        let dims = [(max_side * max_side) as i64, half as i64];
        let cos = g.weight("vision_rope_cos_cache", e.act, &dims, &halve(&cos_t))?;
        let sin = g.weight("vision_rope_sin_cache", e.act, &dims, &halve(&sin_t))?;
        let minus_one = g.const_i64(&[-1]);
        let pos = g.op("Reshape", &[&pos, &minus_one], &[]);
        let group = rotary_group(v.num_heads, v.head_dim);
        let repeats = g.const_i64(&[1, group as i64]);
        // [S, half] → [S, group·half]: the angles of each head in the block, side by side.
        let [cos, sin] = [&cos, &sin].map(|t| {
            let rows = g.op("Gather", &[t, &pos], &[("axis", Attr::Int(0))]);
            g.op("Tile", &[&rows, &repeats], &[])
        });
        // Ids 0..S into those rows, [1, S]. Not ONNX Runtime's one-start-position form
        // (`[0]`, "format 0"): with it, this encoder's features went wrong on CUDA (ONNX
        // Runtime 1.31.1; the fixture's CUDA parity failed on every page) though the CPU gave
        // the reference's and the op alone was right on CUDA
        // (docs/benchmarks/2026-12-04-h200/gpu_rotary_probe.py).
        let count = g.op("Shape", &[&pos], &[]);
        let count = g.op("Squeeze", &[&count, &sq_axes], &[]);
        let ids = g.op("Range", &[&zero, &count, &one], &[]);
        let ids = g.op("Unsqueeze", &[&ids, &ax0], &[]);
        return Ok(Rope::Fused {
            ids,
            cos,
            sin,
            group,
        });
    }
    let table_dims = [(max_side * max_side) as i64, v.head_dim as i64];
    let cos_t = g.weight("vision_rope_cos", e.act, &table_dims, &cos_t)?;
    let sin_t = g.weight("vision_rope_sin", e.act, &table_dims, &sin_t)?;
    let minus_one = g.const_i64(&[-1]);
    let pos = g.op("Reshape", &[&pos, &minus_one], &[]);
    let cos = g.op("Gather", &[&cos_t, &pos], &[("axis", Attr::Int(0))]);
    let sin = g.op("Gather", &[&sin_t, &pos], &[("axis", Attr::Int(0))]);
    // [S, d] → [S, 1, d] to broadcast over heads in the BSNH layout.
    let cos = g.op("Unsqueeze", &[&cos, &ax1], &[]);
    let sin = g.op("Unsqueeze", &[&sin, &ax1], &[]);
    Ok(Rope::Explicit { cos, sin })
}

/// Self-attention of layer `pre` on the normed input `hn [1, S, D]`: Q/K/V projections,
/// RoPE on Q and K, unmasked attention, output projection. Returns `[1, S, D]`.
fn attention(
    g: &mut Graph,
    e: Emit,
    w: &dyn Weights,
    v: &crate::config::VisionConfig,
    pre: &str,
    hn: &Value,
    rope: &Rope,
) -> Result<Value, ExportError> {
    let (d, heads, hd) = (v.hidden_size, v.num_heads, v.head_dim);
    let inner = heads * hd;
    let name = |n: &str| format!("{pre}.attention.{n}_proj.weight");
    let a = match rope {
        Rope::Fused {
            ids,
            cos,
            sin,
            group,
        } => {
            // [1, S, heads·hd] throughout: what RotaryEmbedding and MultiHeadAttention take.
            let rows = interleaved_rows(heads, hd);
            let qk = Reordered {
                weights: w,
                names: [name("q"), name("k")],
                rows: &rows,
            };
            let q = layers::linear(g, e, &qk, hn, &name("q"), inner, d)?;
            let k = layers::linear(g, e, &qk, hn, &name("k"), inner, d)?;
            let vv = layers::linear(g, e, w, hn, &name("v"), inner, d)?;
            let blocks = heads / group;
            let q = layers::rotary_interleaved(g, &q, ids, cos, sin, blocks);
            let k = layers::rotary_interleaved(g, &k, ids, cos, sin, blocks);
            layers::vision_attention(g, e, &q, &k, &vv, heads, hd)
        }
        Rope::Explicit { cos, sin } => {
            let mut qkv = Vec::new();
            for n in ["q", "k", "v"] {
                qkv.push(layers::linear(g, e, w, hn, &name(n), inner, d)?);
            }
            let bsnh = g.const_i64(&[0, 0, heads as i64, hd as i64]);
            let [q, k, vv] = [&qkv[0], &qkv[1], &qkv[2]].map(|t| g.op("Reshape", &[t, &bsnh], &[]));
            let q = layers::rope(g, &q, cos, sin);
            let k = layers::rope(g, &k, cos, sin);
            layers::vision_attention(g, e, &q, &k, &vv, heads, hd)
        }
    };
    let name = format!("{pre}.attention.o_proj.weight");
    layers::linear(g, e, w, &a, &name, d, inner)
}

/// The `pixel_values [1, C, H, W]` input, float32 in every precision (the onnx-community
/// contract), cast to the activation type.
fn pixel_input(g: &mut Graph, e: Emit, v: &VisionConfig) -> Value {
    let pix = g.input(
        tensor::PIXEL_VALUES,
        DType::F32,
        &[
            Dim::Fixed(1),
            Dim::Fixed(v.num_channels as i64),
            Dim::named("height"),
            Dim::named("width"),
        ],
    );
    layers::cast(g, &pix, DType::F32, e.act)
}

/// The patches of `pix`: Conv(kernel = stride = patch), no bias, flattened to `[1, N, D]`,
/// with the patch grid's height and width (1-D shapes).
fn patch_embedding(
    g: &mut Graph,
    e: Emit,
    w: &dyn Weights,
    v: &VisionConfig,
    pix: &Value,
) -> Result<(Value, Value, Value), ExportError> {
    let (d, p) = (v.hidden_size, v.patch_size);
    let conv_w = w.get(
        &format!("{ENCODER}.patch_conv.weight"),
        &[d, v.num_channels, p, p],
    )?;
    let conv_w = g.weight(
        &format!("{ENCODER}.patch_conv.weight"),
        e.act,
        &[d as i64, v.num_channels as i64, p as i64, p as i64],
        &conv_w,
    )?;
    let conv = g.op(
        "Conv",
        &[pix, &conv_w],
        &[
            ("kernel_shape", Attr::Ints(vec![p as i64, p as i64])),
            ("strides", Attr::Ints(vec![p as i64, p as i64])),
        ],
    );
    let h = g.op(
        "Shape",
        &[&conv],
        &[("start", Attr::Int(2)), ("end", Attr::Int(3))],
    );
    let wd = g.op(
        "Shape",
        &[&conv],
        &[("start", Attr::Int(3)), ("end", Attr::Int(4))],
    );
    let flat_shape = g.const_i64(&[1, d as i64, -1]);
    let x = g.op("Reshape", &[&conv, &flat_shape], &[]);
    let x = g.op("Transpose", &[&x], &[("perm", Attr::Ints(vec![0, 2, 1]))]);
    Ok((x, h, wd))
}

/// Transformer layer `i` on the residual stream `x` plus the previous layer's `pending`
/// branch output: the new residual stream and this layer's MLP output, not yet added.
#[allow(clippy::too_many_arguments)]
fn vision_layer(
    g: &mut Graph,
    e: Emit,
    w: &dyn Weights,
    v: &VisionConfig,
    i: usize,
    x: &Value,
    pending: Option<&Value>,
    rope: &Rope,
) -> Result<(Value, Value), ExportError> {
    let d = v.hidden_size;
    let pre = format!("{ENCODER}.transformer.layers.{i}");
    let norm = format!("{pre}.attention_norm.weight");
    let eps = v.rms_norm_eps;
    let (hn, x) = layers::add_rms_norm(g, e, w, x, pending, &norm, d, eps)?;
    let a = attention(g, e, w, v, &pre, &hn, rope)?;
    let norm = format!("{pre}.ffn_norm.weight");
    let (hn, x1) = layers::add_rms_norm(g, e, w, &x, Some(&a), &norm, d, eps)?;
    let m = layers::gated_mlp(
        g,
        e,
        w,
        &hn,
        &format!("{pre}.feed_forward"),
        d,
        v.intermediate_size,
        &v.hidden_act,
        false,
    )?;
    Ok((x1, m))
}

/// Builds `<dir>/<stem>.onnx`. `step` is called once per transformer layer.
pub fn build(
    dir: &std::path::Path,
    stem: &str,
    cfg: &ModelConfig,
    w: &dyn Weights,
    e: Emit,
    step: &mut dyn FnMut(),
) -> Result<crate::graph::GraphInfo, ExportError> {
    let v = &cfg.vision;
    let mut g = Graph::create(dir, stem)?;
    let pix = pixel_input(&mut g, e, v);
    let (x, h, wd) = patch_embedding(&mut g, e, w, v, &pix)?;
    // Position ids row·max_side + col, row-major over the patch grid.
    let max_side = v.max_patches_per_side();
    let rope = rope_inputs(&mut g, e, v, max_side, &h, &wd)?;
    let ln_pre = format!("{ENCODER}.ln_pre.weight");
    let mut x = layers::rms_norm(&mut g, e, w, &x, &ln_pre, v.hidden_size, v.rms_norm_eps)?;
    // The branch output not yet added to the residual stream: added by the next norm
    // (`add_rms_norm`), so that sum and norm are one node for ONNX Runtime.
    let mut pending: Option<Value> = None;
    for i in 0..v.num_layers {
        let (nx, m) = g.scoped(&format!("vision.layers.{i}"), |g| {
            vision_layer(g, e, w, v, i, &x, pending.as_ref(), &rope)
        })?;
        x = nx;
        pending = Some(m);
        step();
    }
    let feats = g.scoped("projector", |g| {
        projector(g, e, cfg, w, &x, pending.as_ref(), &h, &wd)
    })?;
    // [1, N, hidden] as the onnx-community encoders (and their consumers) have it, in the
    // activation dtype (the same as embed_tokens' output, which the features replace rows of).
    let axes = g.const_i64(&[0]);
    let feats = g.op("Unsqueeze", &[&feats, &axes], &[]);
    g.output(
        &feats,
        tensor::IMAGE_FEATURES,
        e.act,
        &[
            Dim::Fixed(1),
            Dim::named("num_image_tokens"),
            Dim::Fixed(cfg.text.hidden_size as i64),
        ],
    );
    g.finish(&[("", e.opset()), ("com.microsoft", 1)], &[])
}

/// The last residual sum `x + pending` → RMSNorm → 2×2 channel-major unfold → merging
/// Linear → Linear → GELU → Linear.
#[allow(clippy::too_many_arguments)]
fn projector(
    g: &mut Graph,
    e: Emit,
    cfg: &ModelConfig,
    w: &dyn Weights,
    x: &Value,
    pending: Option<&Value>,
    h: &Value,
    wd: &Value,
) -> Result<Value, ExportError> {
    let d = cfg.vision.hidden_size;
    let m = cfg.spatial_merge_size as i64;
    let dt = cfg.text.hidden_size;
    let norm = format!("{PROJECTOR}.norm.weight");
    let eps = cfg.projector_rms_norm_eps;
    let (x, _) = layers::add_rms_norm(g, e, w, x, pending, &norm, d, eps)?;
    // [1, h·w, D] → [h, w, D], cropped to even sides as torch's unfold does (floor).
    let dvec = g.const_i64(&[d as i64]);
    let grid_shape = g.op("Concat", &[h, wd, &dvec], &[("axis", Attr::Int(0))]);
    let grid = g.op("Reshape", &[&x, &grid_shape], &[]);
    let mv = g.const_i64(&[m]);
    let h2 = g.op("Div", &[h, &mv], &[]);
    let w2 = g.op("Div", &[wd, &mv], &[]);
    let hc = g.op("Mul", &[&h2, &mv], &[]);
    let wc = g.op("Mul", &[&w2, &mv], &[]);
    let starts = g.const_i64(&[0, 0]);
    let ends = g.op("Concat", &[&hc, &wc], &[("axis", Attr::Int(0))]);
    let axes = g.const_i64(&[0, 1]);
    let grid = g.op("Slice", &[&grid, &starts, &ends, &axes], &[]);
    // [h2, m, w2, m, D] → [h2, w2, D, m, m] → [h2·w2, D·m²]: feature index c·m² + i·m + j.
    let split_shape = g.op(
        "Concat",
        &[&h2, &mv, &w2, &mv, &dvec],
        &[("axis", Attr::Int(0))],
    );
    let grid = g.op("Reshape", &[&grid, &split_shape], &[]);
    let grid = g.op(
        "Transpose",
        &[&grid],
        &[("perm", Attr::Ints(vec![0, 2, 4, 1, 3]))],
    );
    let merged_shape = g.const_i64(&[-1, d as i64 * m * m]);
    let merged = g.op("Reshape", &[&grid, &merged_shape], &[]);
    let k = d * (m * m) as usize;
    let y = layers::linear(
        g,
        e,
        w,
        &merged,
        &format!("{PROJECTOR}.patch_merger.merging_layer.weight"),
        d,
        k,
    )?;
    let y = layers::linear(g, e, w, &y, &format!("{PROJECTOR}.linear_1.weight"), dt, d)?;
    let y = layers::gelu(g, e, &y);
    layers::linear(g, e, w, &y, &format!("{PROJECTOR}.linear_2.weight"), dt, dt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_table_uses_even_freqs_for_rows_and_odd_for_columns() {
        let (cos, sin) = pixtral_rope_table(10000.0, 8, 3);
        let f = layers::inv_freq(10000.0, 8); // 4 frequencies
        let at = |r: usize, c: usize| ((r * 3 + c) * 8, ());
        let (i, _) = at(2, 1);
        let expect = [2.0 * f[0], 2.0 * f[2], 1.0 * f[1], 1.0 * f[3]];
        for (j, a) in expect.iter().enumerate() {
            assert!((sin[i + j] - a.sin()).abs() < 1e-6);
            assert!((sin[i + 4 + j] - a.sin()).abs() < 1e-6, "duplicated half");
            assert!((cos[i + j] - a.cos()).abs() < 1e-6);
        }
        // Position (0, 0) has zero angles everywhere.
        assert!(cos[..8].iter().all(|c| *c == 1.0) && sin[..8].iter().all(|s| *s == 0.0));
    }

    #[test]
    fn a_rotary_block_holds_the_most_heads_that_fit_256_channels() {
        assert_eq!(rotary_group(16, 64), 4, "Pixtral: 4 heads, 256 channels");
        assert_eq!(rotary_group(16, 128), 2);
        assert_eq!(
            rotary_group(6, 64),
            3,
            "4 heads would fit but do not divide 6"
        );
        assert_eq!(rotary_group(5, 64), 1);
        assert_eq!(
            rotary_group(2, 512),
            1,
            "a head wider than a block stays alone"
        );
    }

    #[test]
    fn interleaved_rows_pair_each_channel_with_its_rotate_half_partner_in_its_head() {
        // 2 heads of 4 channels: head 0 = rows 0..4, head 1 = rows 4..8.
        assert_eq!(interleaved_rows(2, 4), vec![0, 2, 1, 3, 4, 6, 5, 7]);
        let rows = interleaved_rows(16, 64);
        let mut sorted = rows.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1024).collect::<Vec<_>>(), "a permutation");
        assert!(rows
            .chunks(64)
            .enumerate()
            .all(|(h, c)| c.iter().all(|r| r / 64 == h)));
    }
}
