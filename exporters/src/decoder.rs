//! `decoder_model_merged.onnx`: the Qwen3 decoder with KV cache and lm_head.
//!
//! Inputs `inputs_embeds [B, S, D]`, `attention_mask [B, P+S]` (int64, 1 = real token; rows
//! right-aligned), `position_ids [B, S]` (`--target tensorrt` only: the ONNX Runtime graph
//! derives positions from the mask, as the onnx-community decoders do),
//! `past_key_values.{i}.key|value [B, kv_heads, P, head_dim]`, and an
//! optional `num_logits_to_keep` (int64 scalar, default 0 = all positions; 1 during prefill
//! avoids a `[B, S, vocab]` tensor). Outputs `logits [B, S', vocab]` (float32) and
//! `present.{i}.key|value [B, kv_heads, P+S, head_dim]` (after q/k-norm and RoPE).
//! An empty past (P = 0) is the prefill. Ports transformers'
//! `qwen3/modeling_qwen3.py` (`Qwen3Attention`, `Qwen3DecoderLayer`, `Qwen3RotaryEmbedding`).

use crate::checkpoint::Weights;
use crate::config::ModelConfig;
use crate::contract::{tensor, Kv};
use crate::graph::{Attr, DType, Dim, Graph, Value};
use crate::layers::{self, Emit};
use crate::ExportError;

/// Prefix of the decoder weights.
pub const PREFIX: &str = "model.language_model";

/// The graph's symbolic dimensions.
struct Dims {
    batch: Dim,
    seq: Dim,
    past: Dim,
    total: Dim,
}

impl Dims {
    fn new() -> Dims {
        Dims {
            batch: Dim::named("batch_size"),
            seq: Dim::named("sequence_length"),
            past: Dim::named("past_sequence_length"),
            total: Dim::named(tensor::TOTAL_SEQUENCE_LENGTH),
        }
    }

    /// `[B, kv_heads, len, head_dim]`: a past or present key or value.
    fn kv(&self, cfg: &ModelConfig, len: &Dim) -> Vec<Dim> {
        vec![
            self.batch.clone(),
            Dim::Fixed(cfg.text.num_kv_heads as i64),
            len.clone(),
            Dim::Fixed(cfg.text.head_dim as i64),
        ]
    }
}

/// The graph's inputs.
struct Inputs {
    embeds: Value,
    attention_mask: Value,
    /// `--target tensorrt` only.
    position_ids: Option<Value>,
    /// Each layer's past key and value.
    pasts: Vec<(Value, Value)>,
    num_logits_to_keep: Value,
}

/// Declares the inputs (`num_logits_to_keep` with its default of 0).
fn declare_inputs(
    g: &mut Graph,
    cfg: &ModelConfig,
    e: Emit,
    dims: &Dims,
) -> Result<Inputs, ExportError> {
    let (b, s) = (&dims.batch, &dims.seq);
    let embeds = g.input(
        tensor::INPUTS_EMBEDS,
        e.act,
        &[
            b.clone(),
            s.clone(),
            Dim::Fixed(cfg.text.hidden_size as i64),
        ],
    );
    let attention_mask = g.input(
        tensor::ATTENTION_MASK,
        DType::I64,
        &[b.clone(), dims.total.clone()],
    );
    // `--target tensorrt` takes positions as an input; the ONNX Runtime graph derives them
    // from the mask like the onnx-community decoders (whose consumers pass no position_ids).
    let position_ids = (e.target == layers::Target::TensorRt)
        .then(|| g.input(tensor::POSITION_IDS, DType::I64, &[b.clone(), s.clone()]));
    let mut pasts = Vec::new();
    for i in 0..cfg.text.num_layers {
        let k = g.input(&tensor::past(i, Kv::Key), e.act, &dims.kv(cfg, &dims.past));
        let v = g.input(
            &tensor::past(i, Kv::Value),
            e.act,
            &dims.kv(cfg, &dims.past),
        );
        pasts.push((k, v));
    }
    let num_logits_to_keep = g.input(tensor::NUM_LOGITS_TO_KEEP, DType::I64, &[]);
    g.initializer(
        tensor::NUM_LOGITS_TO_KEEP,
        DType::I64,
        &[],
        0i64.to_le_bytes().to_vec(),
    )?;
    Ok(Inputs {
        embeds,
        attention_mask,
        position_ids,
        pasts,
        num_logits_to_keep,
    })
}

/// The attention mask and positions of the new tokens, with the axis constants the rest of
/// the graph reuses.
struct Masking {
    /// `[B, 1, S, P+S]` bool: key j is visible to query i.
    mask: Value,
    /// `[B, S]` positions of the new tokens.
    positions: Value,
    /// `[0]` and `[1]`.
    ax0: Value,
    ax1: Value,
}

/// Key j is visible to query i iff attention_mask[b, j] == 1 and j <= P + i; positions from
/// the mask unless given.
fn mask_and_positions(g: &mut Graph, inp: &Inputs) -> Masking {
    let mask_in = &inp.attention_mask;
    let past_len = g.op(
        "Shape",
        &[&inp.pasts[0].0],
        &[("start", Attr::Int(2)), ("end", Attr::Int(3))],
    );
    let seq_len = g.op(
        "Shape",
        &[&inp.embeds],
        &[("start", Attr::Int(1)), ("end", Attr::Int(2))],
    );
    let total_len = g.op("Add", &[&past_len, &seq_len], &[]);
    let zero = g.scalar_i64(0);
    let one = g.scalar_i64(1);
    // Explicit constant axes: TensorRT requires Squeeze's axes to be an initializer.
    let sq_axes = g.const_i64(&[0]);
    let (p_s, s_s, t_s) = (
        g.op("Squeeze", &[&past_len, &sq_axes], &[]),
        g.op("Squeeze", &[&seq_len, &sq_axes], &[]),
        g.op("Squeeze", &[&total_len, &sq_axes], &[]),
    );
    // Position of each new token: the number of unmasked tokens up to it, minus one (rows are
    // right-aligned, padding masked), i.e. `(cumsum(attention_mask, 1) - 1)[:, P:]`.
    let positions = match &inp.position_ids {
        Some(p) => p.clone(),
        None => {
            let ax = g.scalar_i64(1);
            let cs = g.op("CumSum", &[mask_in, &ax], &[]);
            let cs = g.op("Sub", &[&cs, &one], &[]);
            let axes = g.const_i64(&[1]);
            g.op("Slice", &[&cs, &past_len, &total_len, &axes], &[])
        }
    };
    let keys = g.op("Range", &[&zero, &t_s, &one], &[]);
    let queries = g.op("Range", &[&zero, &s_s, &one], &[]);
    let queries = g.op("Add", &[&queries, &p_s], &[]);
    let ax0 = g.const_i64(&[0]);
    let ax1 = g.const_i64(&[1]);
    let keys = g.op("Unsqueeze", &[&keys, &ax0], &[]);
    let queries = g.op("Unsqueeze", &[&queries, &ax1], &[]);
    let causal = g.op("LessOrEqual", &[&keys, &queries], &[]);
    let pad = g.op(
        "Cast",
        &[mask_in],
        &[("to", Attr::Int(DType::Bool.onnx_code()))],
    );
    let ax12 = g.const_i64(&[1, 2]);
    let pad = g.op("Unsqueeze", &[&pad, &ax12], &[]);
    let mask = g.op("And", &[&causal, &pad], &[]);
    Masking {
        mask,
        positions,
        ax0,
        ax1,
    }
}

/// RoPE's cos and sin `[B, 1, S, hd]` of `positions`, computed in float32 then cast.
fn rope_cos_sin(
    g: &mut Graph,
    cfg: &ModelConfig,
    e: Emit,
    positions: &Value,
    ax1: &Value,
) -> Result<(Value, Value), ExportError> {
    let inv = layers::inv_freq(cfg.text.rope_theta, cfg.text.head_dim);
    let inv = g.weight(
        "decoder_rope_inv_freq",
        DType::F32,
        &[inv.len() as i64],
        &inv,
    )?;
    let posf = g.op(
        "Cast",
        &[positions],
        &[("to", Attr::Int(DType::F32.onnx_code()))],
    );
    let ax2 = g.const_i64(&[2]);
    let posf = g.op("Unsqueeze", &[&posf, &ax2], &[]);
    let freqs = g.op("Mul", &[&posf, &inv], &[]);
    let emb = g.op("Concat", &[&freqs, &freqs], &[("axis", Attr::Int(-1))]);
    let cos = g.op("Cos", &[&emb], &[]);
    let sin = g.op("Sin", &[&emb], &[]);
    let cos = layers::cast(g, &cos, DType::F32, e.act);
    let sin = layers::cast(g, &sin, DType::F32, e.act);
    let cos = g.op("Unsqueeze", &[&cos, ax1], &[]);
    let sin = g.op("Unsqueeze", &[&sin, ax1], &[]);
    Ok((cos, sin))
}

/// What every decoder layer reads besides its input and cache.
struct LayerInputs {
    mask: Value,
    cos: Value,
    sin: Value,
    /// `[0, 0, heads, head_dim]` and `[0, 0, kv_heads, head_dim]`.
    q_shape: Value,
    kv_shape: Value,
}

/// Decoder layer `i` on `x` with its past key and value: the layer's output and its
/// present key and value.
fn decoder_layer(
    g: &mut Graph,
    (e, w, cfg): (Emit, &dyn Weights, &ModelConfig),
    i: usize,
    x: &Value,
    (pk, pv): &(Value, Value),
    li: &LayerInputs,
) -> Result<(Value, Value, Value), ExportError> {
    let t = &cfg.text;
    let (d, nh, kvh, hd) = (t.hidden_size, t.num_heads, t.num_kv_heads, t.head_dim);
    let to_bnsh = [("perm", Attr::Ints(vec![0, 2, 1, 3]))];
    let pre = format!("{PREFIX}.layers.{i}");
    let hn = layers::rms_norm(
        g,
        e,
        w,
        x,
        &format!("{pre}.input_layernorm.weight"),
        d,
        t.rms_norm_eps,
    )?;
    let (q, k, v) = qkv_normed(g, e, w, cfg, &pre, &hn, &li.q_shape, &li.kv_shape)?;
    let q = g.op("Transpose", &[&q], &to_bnsh);
    let k = g.op("Transpose", &[&k], &to_bnsh);
    let v = g.op("Transpose", &[&v], &to_bnsh);
    let q = layers::rope(g, &q, &li.cos, &li.sin);
    let k = layers::rope(g, &k, &li.cos, &li.sin);
    // What an 8-bit cache will store, for `--calibrate`'s scale.
    layers::calibration_output(g, e, &k, &crate::kv_cache::calib_name(i, Kv::Key), hd);
    layers::calibration_output(g, e, &v, &crate::kv_cache::calib_name(i, Kv::Value), hd);
    let k_all = g.op("Concat", &[pk, &k], &[("axis", Attr::Int(2))]);
    let v_all = g.op("Concat", &[pv, &v], &[("axis", Attr::Int(2))]);
    let a = layers::attention_bnsh(g, e, &q, &k_all, &v_all, Some(&li.mask), nh, kvh, hd);
    let o = layers::linear(
        g,
        e,
        w,
        &a,
        &format!("{pre}.self_attn.o_proj.weight"),
        d,
        nh * hd,
    )?;
    let x1 = g.op("Add", &[x, &o], &[]);
    let m = mlp_block(g, e, w, cfg, &pre, &x1)?;
    Ok((m, k_all, v_all))
}

/// The final norm and lm_head over the last `num_logits_to_keep` positions (0 keeps all):
/// the float32 logits.
fn logits_head(
    g: &mut Graph,
    (e, w, cfg): (Emit, &dyn Weights, &ModelConfig),
    x: &Value,
    keep: &Value,
    m: &Masking,
) -> Result<Value, ExportError> {
    let t = &cfg.text;
    let d = t.hidden_size;
    let x = layers::rms_norm(
        g,
        e,
        w,
        x,
        &format!("{PREFIX}.norm.weight"),
        d,
        t.rms_norm_eps,
    )?;
    let neg = g.op("Neg", &[keep], &[]);
    let starts = g.op("Unsqueeze", &[&neg, &m.ax0], &[]);
    let ends = g.const_i64(&[i64::MAX]);
    let x = g.op("Slice", &[&x, &starts, &ends, &m.ax1], &[]);
    let head_name = lm_head_name(cfg, w);
    let logits = layers::linear(g, e, w, &x, head_name, t.vocab_size, d)?;
    Ok(layers::cast(g, &logits, e.act, DType::F32))
}

/// Builds `<dir>/<stem>.onnx`. `step` is called once per decoder layer.
pub fn build(
    dir: &std::path::Path,
    stem: &str,
    cfg: &ModelConfig,
    w: &dyn Weights,
    e: Emit,
    step: &mut dyn FnMut(),
) -> Result<crate::graph::GraphInfo, ExportError> {
    let t = &cfg.text;
    let mut g = Graph::create(dir, stem)?;
    let dims = Dims::new();
    let inp = declare_inputs(&mut g, cfg, e, &dims)?;
    let masking = mask_and_positions(&mut g, &inp);
    let (cos, sin) = rope_cos_sin(&mut g, cfg, e, &masking.positions, &masking.ax1)?;
    let li = LayerInputs {
        mask: masking.mask.clone(),
        cos,
        sin,
        q_shape: g.const_i64(&[0, 0, t.num_heads as i64, t.head_dim as i64]),
        kv_shape: g.const_i64(&[0, 0, t.num_kv_heads as i64, t.head_dim as i64]),
    };
    let mut x = inp.embeds.clone();
    for (i, past) in inp.pasts.iter().enumerate() {
        let (nx, pres_k, pres_v) = g.scoped(&format!("decoder.layers.{i}"), |g| {
            decoder_layer(g, (e, w, cfg), i, &x, past, &li)
        })?;
        x = nx;
        let kv_out = dims.kv(cfg, &dims.total);
        g.output(&pres_k, &tensor::present(i, Kv::Key), e.act, &kv_out);
        g.output(&pres_v, &tensor::present(i, Kv::Value), e.act, &kv_out);
        step();
    }
    let logits = logits_head(&mut g, (e, w, cfg), &x, &inp.num_logits_to_keep, &masking)?;
    g.output(
        &logits,
        tensor::LOGITS,
        DType::F32,
        &[
            dims.batch,
            Dim::named("logits_length"),
            Dim::Fixed(t.vocab_size as i64),
        ],
    );
    g.finish(&[("", e.opset())], &[])
}

/// The Q, K and V projections of layer `pre` on the normed input `hn [B, S, D]`, reshaped to
/// `[B, S, heads, head_dim]` (`q_shape`, `kv_shape`) with Qwen3's per-head RMSNorm applied to
/// Q and K (before RoPE, as transformers does).
#[allow(clippy::too_many_arguments)]
pub(crate) fn qkv_normed(
    g: &mut Graph,
    e: Emit,
    w: &dyn Weights,
    cfg: &ModelConfig,
    pre: &str,
    hn: &Value,
    q_shape: &Value,
    kv_shape: &Value,
) -> Result<(Value, Value, Value), ExportError> {
    let t = &cfg.text;
    let (d, hd) = (t.hidden_size, t.head_dim);
    let (names, packed) = qkv_names(cfg, pre);
    let parts = names.each_ref().map(|(n, out)| (n.as_str(), *out));
    let [q, k, v]: [Value; 3] = layers::linears_packed(g, e, w, hn, &packed, &parts, d)?
        .try_into()
        .expect("three parts");
    let q = g.op("Reshape", &[&q, q_shape], &[]);
    let k = g.op("Reshape", &[&k, kv_shape], &[]);
    let v = g.op("Reshape", &[&v, kv_shape], &[]);
    let eps = t.rms_norm_eps;
    let q = layers::rms_norm(
        g,
        e,
        w,
        &q,
        &format!("{pre}.self_attn.q_norm.weight"),
        hd,
        eps,
    )?;
    let k = layers::rms_norm(
        g,
        e,
        w,
        &k,
        &format!("{pre}.self_attn.k_norm.weight"),
        hd,
        eps,
    )?;
    Ok((q, k, v))
}

/// The Q, K and V projections of layer `pre` (`(weight name, output width)` each) and the
/// name of their packed matrix.
pub(crate) fn qkv_names(cfg: &ModelConfig, pre: &str) -> ([(String, usize); 3], String) {
    let t = &cfg.text;
    let (q, kv) = (t.num_heads * t.head_dim, t.num_kv_heads * t.head_dim);
    let name = |n: &str| format!("{pre}.self_attn.{n}.weight");
    let names = [
        (name("q_proj"), q),
        (name("k_proj"), kv),
        (name("v_proj"), kv),
    ];
    (names, format!("{pre}.self_attn.qkv_proj.weight"))
}

/// `x1 + mlp(post_attention_layernorm(x1))`: the second half of decoder layer `pre`.
pub(crate) fn mlp_block(
    g: &mut Graph,
    e: Emit,
    w: &dyn Weights,
    cfg: &ModelConfig,
    pre: &str,
    x1: &Value,
) -> Result<Value, ExportError> {
    let t = &cfg.text;
    let hn = layers::rms_norm(
        g,
        e,
        w,
        x1,
        &format!("{pre}.post_attention_layernorm.weight"),
        t.hidden_size,
        t.rms_norm_eps,
    )?;
    let m = mlp(g, e, w, cfg, pre, &hn)?;
    Ok(g.op("Add", &[x1, &m], &[]))
}

/// The SwiGLU MLP of decoder layer `pre` on its normed input.
pub(crate) fn mlp(
    g: &mut Graph,
    e: Emit,
    w: &dyn Weights,
    cfg: &ModelConfig,
    pre: &str,
    hn: &Value,
) -> Result<Value, ExportError> {
    let t = &cfg.text;
    let name = format!("{pre}.mlp");
    layers::gated_mlp(
        g,
        e,
        w,
        hn,
        &name,
        t.hidden_size,
        t.intermediate_size,
        "silu",
        true,
    )
}

/// The lm_head weight: `lm_head.weight` unless tied (or absent), else the embeddings.
pub fn lm_head_name(cfg: &ModelConfig, w: &dyn Weights) -> &'static str {
    if !cfg.text.tie_word_embeddings && w.contains("lm_head.weight") {
        "lm_head.weight"
    } else {
        "model.language_model.embed_tokens.weight"
    }
}
