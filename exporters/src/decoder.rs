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
    let d = t.hidden_size;
    let (nh, kvh, hd) = (t.num_heads, t.num_kv_heads, t.head_dim);
    let mut g = Graph::create(dir, stem)?;
    let b = Dim::named("batch_size");
    let s = Dim::named("sequence_length");
    let past = Dim::named("past_sequence_length");
    let total = Dim::named(tensor::TOTAL_SEQUENCE_LENGTH);
    let x0 = g.input(
        tensor::INPUTS_EMBEDS,
        e.act,
        &[b.clone(), s.clone(), Dim::Fixed(d as i64)],
    );
    let mask_in = g.input(
        tensor::ATTENTION_MASK,
        DType::I64,
        &[b.clone(), total.clone()],
    );
    // `--target tensorrt` takes positions as an input; the ONNX Runtime graph derives them
    // from the mask like the onnx-community decoders (whose consumers pass no position_ids).
    let pos_in = (e.target == layers::Target::TensorRt)
        .then(|| g.input(tensor::POSITION_IDS, DType::I64, &[b.clone(), s.clone()]));
    let kv_dims = |len: &Dim| {
        vec![
            b.clone(),
            Dim::Fixed(kvh as i64),
            len.clone(),
            Dim::Fixed(hd as i64),
        ]
    };
    let mut pasts = Vec::new();
    for i in 0..t.num_layers {
        let k = g.input(&tensor::past(i, Kv::Key), e.act, &kv_dims(&past));
        let v = g.input(&tensor::past(i, Kv::Value), e.act, &kv_dims(&past));
        pasts.push((k, v));
    }
    let keep = g.input(tensor::NUM_LOGITS_TO_KEEP, DType::I64, &[]);
    g.initializer(
        tensor::NUM_LOGITS_TO_KEEP,
        DType::I64,
        &[],
        0i64.to_le_bytes().to_vec(),
    )?;

    // Mask: key j is visible to query i iff attention_mask[b, j] == 1 and j <= P + i.
    let past_len = g.op(
        "Shape",
        &[&pasts[0].0],
        &[("start", Attr::Int(2)), ("end", Attr::Int(3))],
    );
    let seq_len = g.op(
        "Shape",
        &[&x0],
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
    let pos_in = match pos_in {
        Some(p) => p,
        None => {
            let ax = g.scalar_i64(1);
            let cs = g.op("CumSum", &[&mask_in, &ax], &[]);
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
        &[&mask_in],
        &[("to", Attr::Int(DType::Bool.onnx_code()))],
    );
    let ax12 = g.const_i64(&[1, 2]);
    let pad = g.op("Unsqueeze", &[&pad, &ax12], &[]);
    let mask = g.op("And", &[&causal, &pad], &[]);

    // RoPE cos/sin [B, 1, S, hd] from position_ids, in float32 then cast.
    let inv = layers::inv_freq(t.rope_theta, hd);
    let inv = g.weight(
        "decoder_rope_inv_freq",
        DType::F32,
        &[inv.len() as i64],
        &inv,
    )?;
    let posf = g.op(
        "Cast",
        &[&pos_in],
        &[("to", Attr::Int(DType::F32.onnx_code()))],
    );
    let ax2 = g.const_i64(&[2]);
    let posf = g.op("Unsqueeze", &[&posf, &ax2], &[]);
    let freqs = g.op("Mul", &[&posf, &inv], &[]);
    let emb = g.op("Concat", &[&freqs, &freqs], &[("axis", Attr::Int(-1))]);
    let cos = g.op("Cos", &[&emb], &[]);
    let sin = g.op("Sin", &[&emb], &[]);
    let cos = layers::cast(&mut g, &cos, DType::F32, e.act);
    let sin = layers::cast(&mut g, &sin, DType::F32, e.act);
    let cos = g.op("Unsqueeze", &[&cos, &ax1], &[]);
    let sin = g.op("Unsqueeze", &[&sin, &ax1], &[]);

    let q_shape = g.const_i64(&[0, 0, nh as i64, hd as i64]);
    let kv_shape = g.const_i64(&[0, 0, kvh as i64, hd as i64]);
    let to_bnsh = [("perm", Attr::Ints(vec![0, 2, 1, 3]))];
    let eps = t.rms_norm_eps;
    let mut x = x0.clone();
    for (i, (pk, pv)) in pasts.iter().enumerate() {
        let pre = format!("{PREFIX}.layers.{i}");
        let (nx, pres_k, pres_v) = g.scoped(
            &format!("decoder.layers.{i}"),
            |g| -> Result<(Value, Value, Value), ExportError> {
                let hn = layers::rms_norm(
                    g,
                    e,
                    w,
                    &x,
                    &format!("{pre}.input_layernorm.weight"),
                    d,
                    eps,
                )?;
                let (q, k, v) = qkv_normed(g, e, w, cfg, &pre, &hn, &q_shape, &kv_shape)?;
                let q = g.op("Transpose", &[&q], &to_bnsh);
                let k = g.op("Transpose", &[&k], &to_bnsh);
                let v = g.op("Transpose", &[&v], &to_bnsh);
                let q = layers::rope(g, &q, &cos, &sin);
                let k = layers::rope(g, &k, &cos, &sin);
                // What an 8-bit cache will store, for `--calibrate`'s scale.
                layers::calibration_output(g, e, &k, &crate::kv_cache::calib_name(i, Kv::Key), hd);
                layers::calibration_output(
                    g,
                    e,
                    &v,
                    &crate::kv_cache::calib_name(i, Kv::Value),
                    hd,
                );
                let k_all = g.op("Concat", &[pk, &k], &[("axis", Attr::Int(2))]);
                let v_all = g.op("Concat", &[pv, &v], &[("axis", Attr::Int(2))]);
                let a = layers::attention_bnsh(g, e, &q, &k_all, &v_all, Some(&mask), nh, kvh, hd);
                let o = layers::linear(
                    g,
                    e,
                    w,
                    &a,
                    &format!("{pre}.self_attn.o_proj.weight"),
                    d,
                    nh * hd,
                )?;
                let x1 = g.op("Add", &[&x, &o], &[]);
                let m = mlp_block(g, e, w, cfg, &pre, &x1)?;
                Ok((m, k_all, v_all))
            },
        )?;
        x = nx;
        let kv_out = kv_dims(&total);
        g.output(&pres_k, &tensor::present(i, Kv::Key), e.act, &kv_out);
        g.output(&pres_v, &tensor::present(i, Kv::Value), e.act, &kv_out);
        step();
    }

    let x = layers::rms_norm(&mut g, e, w, &x, &format!("{PREFIX}.norm.weight"), d, eps)?;
    // Keep the last `num_logits_to_keep` positions (0 keeps all).
    let neg = g.op("Neg", &[&keep], &[]);
    let starts = g.op("Unsqueeze", &[&neg, &ax0], &[]);
    let ends = g.const_i64(&[i64::MAX]);
    let x = g.op("Slice", &[&x, &starts, &ends, &ax1], &[]);
    let head_name = lm_head_name(cfg, w);
    let logits = layers::linear(&mut g, e, w, &x, head_name, t.vocab_size, d)?;
    let logits = layers::cast(&mut g, &logits, e.act, DType::F32);
    g.output(
        &logits,
        tensor::LOGITS,
        DType::F32,
        &[
            b,
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
