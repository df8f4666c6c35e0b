//! `decoder_model_gqa.onnx`: the Qwen3 decoder for a KV cache that is allocated once and
//! updated in place, through ONNX Runtime's `com.microsoft.GroupQueryAttention` (GQA).
//!
//! Inputs: `inputs_embeds [B, S, D]`; `seqlens_k [B]` (int32: each row's total length after
//! this run, minus one); `total_sequence_length` (int32 scalar: the largest total length of
//! the batch, read on the host); `past_key_values.{i}.key|value [B, kv_heads, max_seq,
//! head_dim]`, a fixed-size cache whose rows `0..len` hold each sequence's keys and values.
//! Outputs: `logits [B, 1, vocab]` (float32, last position only), `next_token [B, 1]` (int64,
//! the argmax of the logits, so that greedy steps need not bring the logits to the host),
//! `top_logits`/`top_ids [B, 1, K]` (the K largest logits and their ids, for sampling steps),
//! `logsumexp [B, 1]` (with the candidates, the log-probabilities a request asks for) and
//! `present.{i}.key|value`, the same `[B, kv_heads, max_seq, head_dim]` buffers with the new
//! positions written at rows `len..len+S`. Binding each present to the memory of its past
//! (IoBinding) makes GQA update the cache in place: no concatenation, no copy, no repacking.
//!
//! Why GQA (checked against ONNX Runtime 1.31.1's schema and kernels): one node does RoPE
//! (`do_rotary`, from the `cos_cache`/`sin_cache` tables, positions taken from `seqlens_k`),
//! the grouped-query attention (16:8 heads without repeating K/V) and the cache write; the CPU
//! provider runs it in float32 and float16 (so CI checks this graph against the reference),
//! the CUDA provider in float16 with flash / XQA decoding kernels. Qwen3's per-head q/k norms
//! are applied before GQA (its fused `q_norm_weight` inputs are CUDA-only). Each residual sum
//! and the RMSNorm after it are one `SkipSimplifiedLayerNormalization` node
//! ([`layers::add_rms_norm`]): 56 fewer nodes per step for LightOnOCR's 28 layers. Rows of a decode
//! step may have different lengths (`seqlens_k` per row); a prompt of S > 1 tokens runs with
//! B = 1 (ONNX Runtime refuses S > 1 with B > 1 once any row has a past). Positions are
//! `len..len+S`, i.e. a sequence is right-aligned at row 0 of its cache: no padding at all.
//! With `--kv-cache fp8|int8` ([`crate::kv_cache`]) the cache inputs and outputs are 8-bit,
//! each GQA node gets the per-tensor scale (`k_scale` = `v_scale`, one tensor) and the
//! quantization attributes, and the query heads are padded in the weights (`PaddedHeads`)
//! to the group ONNX Runtime's 8-bit decode kernel takes.
//! Ports transformers' `qwen3/modeling_qwen3.py` like [`crate::decoder`].

use crate::checkpoint::Weights;
use crate::config::ModelConfig;
use crate::contract::{hint, tensor, Kv};
use crate::decoder::{lm_head_name, mlp, qkv_normed, PREFIX};
use crate::graph::{Attr, DType, Dim, Graph, Value};
use crate::kv_cache::{GqaLayout, KvCache};
use crate::layers::{self, Emit, Target};
use crate::ExportError;

/// Checks that GQA's kernels take this model's attention shape: rotary over the whole head
/// (`head_dim / 2` a multiple of 8, `head_dim` a multiple of 16) and whole KV groups.
pub fn check(cfg: &ModelConfig, target: Target) -> Result<(), ExportError> {
    check_attention(cfg, target, "gqa", "GroupQueryAttention")
}

/// The checks of [`check`] for the `what` decoder, whose attention is ONNX Runtime's `op`
/// (PagedAttention has the same rotary and grouping constraints).
pub(crate) fn check_attention(
    cfg: &ModelConfig,
    target: Target,
    what: &str,
    op: &str,
) -> Result<(), ExportError> {
    if target != Target::Ort {
        return Err(ExportError::Invalid(format!(
            "the {what} decoder uses ONNX Runtime's {op}: export it with --target ort"
        )));
    }
    if let Some(problem) = shape_problem(cfg) {
        return Err(ExportError::Invalid(format!(
            "the {what} decoder {problem}; export --decoder merged"
        )));
    }
    Ok(())
}

/// What in this model's attention shape GQA's (and PagedAttention's) kernels cannot take, or
/// `None` (see [`check`]).
pub fn shape_problem(cfg: &ModelConfig) -> Option<String> {
    let t = &cfg.text;
    let fits = t.head_dim.is_multiple_of(16)
        && t.num_kv_heads > 0
        && t.num_heads.is_multiple_of(t.num_kv_heads);
    (!fits).then(|| {
        format!(
            "needs head_dim a multiple of 16 and num_attention_heads a multiple of \
             num_key_value_heads (this model: head_dim {}, {} heads, {} KV heads)",
            t.head_dim, t.num_heads, t.num_kv_heads
        )
    })
}

/// RoPE tables `[positions, head_dim / 2]` like transformers computes them: float32 angles
/// `position · inv_freq`, their cosine and sine.
pub(crate) fn rope_tables(theta: f64, head_dim: usize, positions: usize) -> (Vec<f32>, Vec<f32>) {
    let inv = layers::inv_freq(theta, head_dim);
    let mut cos = Vec::with_capacity(positions * inv.len());
    let mut sin = Vec::with_capacity(positions * inv.len());
    for p in 0..positions {
        for f in &inv {
            let a = p as f32 * f;
            cos.push(a.cos());
            sin.push(a.sin());
        }
    }
    (cos, sin)
}

/// The inputs besides the cache: `inputs_embeds [B, S, D]`, `seqlens_k [B]` and
/// `total_sequence_length`.
fn step_inputs(g: &mut Graph, e: Emit, d: usize, b: &Dim) -> (Value, Value, Value) {
    let s = Dim::named("sequence_length");
    let x0 = g.input(
        tensor::INPUTS_EMBEDS,
        e.act,
        &[b.clone(), s, Dim::Fixed(d as i64)],
    );
    let seqlens = g.input(tensor::SEQLENS_K, DType::I32, std::slice::from_ref(b));
    let total = g.input(tensor::TOTAL_SEQUENCE_LENGTH, DType::I32, &[]);
    (x0, seqlens, total)
}

/// Builds `<dir>/<stem>.onnx` with the cache and query-head layout of `layout`. `step` is
/// called once per decoder layer.
pub fn build(
    dir: &std::path::Path,
    stem: &str,
    cfg: &ModelConfig,
    w: &dyn Weights,
    e: Emit,
    layout: GqaLayout,
    step: &mut dyn FnMut(),
) -> Result<crate::graph::GraphInfo, ExportError> {
    check(cfg, e.target)?;
    let kv = layout.kv;
    let cache = kv.dtype(e.act);
    let padding = Padding::of(cfg, w, &layout)?;
    let (cfg, w) = padding.model(cfg, w);
    let t = &cfg.text;
    let (d, nh, kvh, hd) = (t.hidden_size, t.num_heads, t.num_kv_heads, t.head_dim);
    let mut g = Graph::create(dir, stem)?;
    let b = Dim::named("batch_size");
    let (x0, seqlens, total) = step_inputs(&mut g, e, d, &b);
    let kv_dims = vec![
        b.clone(),
        Dim::Fixed(kvh as i64),
        Dim::named("max_sequence_length"),
        Dim::Fixed(hd as i64),
    ];
    let pasts = cache_inputs(&mut g, t.num_layers, cache, &kv_dims);
    let (cos, sin) = rope_weights(&mut g, e, cfg)?;

    let q_shape = g.const_i64(&[0, 0, nh as i64, hd as i64]);
    let kv_shape = g.const_i64(&[0, 0, kvh as i64, hd as i64]);
    let q_flat = g.const_i64(&[0, 0, (nh * hd) as i64]);
    let kv_flat = g.const_i64(&[0, 0, (kvh * hd) as i64]);
    let scales = kv_scales(&mut g, &layout, t.num_layers)?;
    let mut attention = |g: &mut Graph, i: usize, pre: &str, hn: &Value| {
        let (pk, pv) = &pasts[i];
        let (q, k, v) = qkv_normed(g, e, w, cfg, pre, hn, &q_shape, &kv_shape)?;
        let q = g.op("Reshape", &[&q, &q_flat], &[]);
        let k = g.op("Reshape", &[&k, &kv_flat], &[]);
        let v = g.op("Reshape", &[&v, &kv_flat], &[]);
        let mut inputs = vec![&q, &k, &v, pk, pv, &seqlens, &total, &cos, &sin];
        let mut attrs = rotary_attention_attrs(cfg);
        let absent = Value::absent();
        if let Some(s) = &scales[i] {
            // position_ids, attention_bias, head_sink absent; k_scale, v_scale.
            inputs.extend([&absent, &absent, &absent, s, s]);
            attrs.extend([
                ("k_quant_type", Attr::Str("PER_TENSOR".into())),
                ("v_quant_type", Attr::Str("PER_TENSOR".into())),
                ("kv_cache_bit_width", Attr::Int(8)),
            ]);
        }
        let outs = g.op_multi_in("com.microsoft", "GroupQueryAttention", &inputs, &attrs, 3);
        Ok(outs.try_into().expect("three outputs"))
    };
    let x = cache_layers(
        &mut g,
        e,
        w,
        cfg,
        x0,
        (cache, &kv_dims),
        &mut attention,
        step,
    )?;
    // Only the last position's logits: a decode step has one, a prompt needs only its last.
    let starts = g.const_i64(&[-1]);
    let ends = g.const_i64(&[i64::MAX]);
    let axis = g.const_i64(&[1]);
    let x = g.op("Slice", &[&x, &starts, &ends, &axis], &[]);
    last_position_outputs(&mut g, e, w, cfg, &x, b)?;
    g.finish(&[("", e.opset()), ("com.microsoft", 1)], &kv8_hints(kv))
}

/// The graph's hints: for an 8-bit cache, the fusion other ONNX Runtime programs must leave
/// out, as ocrctl does.
fn kv8_hints(kv: KvCache) -> Vec<(String, String)> {
    match kv {
        KvCache::Activation => Vec::new(),
        _ => vec![(
            hint::DISABLE_OPTIMIZERS.into(),
            hint::KV8_DISABLED_OPTIMIZERS.into(),
        )],
    }
}

/// The query-head padding of an 8-bit cache's layout (see `kv_cache`): the padded model
/// configuration and weights when the attention node takes more query heads per KV head than
/// the model has, else nothing.
pub(crate) struct Padding<'a> {
    padded: Option<(ModelConfig, PaddedHeads<'a>)>,
}

impl<'a> Padding<'a> {
    /// The padding `layout` asks of `cfg`'s heads. The padding lives in the weights: q_proj
    /// gets zero rows (zero queries, which q_norm keeps zero) and o_proj zero columns (the
    /// padding heads' outputs count for nothing), so the graph has no extra node. (A `Pad`
    /// node on the queries instead cost 0.9 ms per layer per A4 prompt on the H200.)
    pub(crate) fn of(
        cfg: &ModelConfig,
        w: &'a dyn Weights,
        layout: &GqaLayout,
    ) -> Result<Padding<'a>, ExportError> {
        let group = cfg.text.num_heads / cfg.text.num_kv_heads;
        let padded = layout.attention_group(group)?;
        Ok(Padding {
            padded: (padded > group).then(|| {
                (
                    cfg.with_query_heads(cfg.text.num_kv_heads * padded),
                    PaddedHeads {
                        inner: w,
                        group,
                        padded,
                        head_dim: cfg.text.head_dim,
                    },
                )
            }),
        })
    }

    /// The configuration and weights to build from: the padded ones, or `cfg` and `w`.
    pub(crate) fn model<'s>(
        &'s self,
        cfg: &'s ModelConfig,
        w: &'s dyn Weights,
    ) -> (&'s ModelConfig, &'s dyn Weights) {
        match &self.padded {
            Some((c, p)) => (c, p),
            None => (cfg, w),
        }
    }
}

/// The cache's scale tensor of each layer (`None` for the activation type's cache). Keys and
/// values of a layer share one tensor (XQA wants the same for both): one for every layer, or
/// one per layer when calibration measured them.
pub(crate) fn kv_scales(
    g: &mut Graph,
    layout: &GqaLayout,
    layers_n: usize,
) -> Result<Vec<Option<Value>>, ExportError> {
    let kv = layout.kv;
    if layout.layer_scales.is_empty() {
        let one = kv.scale();
        let one = one.map(|s| g.weight("decoder_kv_cache_scale", DType::F32, &[1], &[s]));
        return Ok(vec![one.transpose()?; layers_n]);
    }
    (0..layers_n)
        .map(|i| {
            let s = kv.layer_scale(layout.layer_scales, i, layers_n)?;
            let name = format!("decoder_kv_cache_scale.{i}");
            s.map(|s| g.weight(&name, DType::F32, &[1], &[s]))
                .transpose()
        })
        .collect()
}

/// Layer `i`'s cache inputs `past_key_values.{i}.key|value` of type `cache` over `dims`.
pub(crate) fn cache_inputs(
    g: &mut Graph,
    layers: usize,
    cache: DType,
    dims: &[Dim],
) -> Vec<(Value, Value)> {
    (0..layers)
        .map(|i| {
            let k = g.input(&tensor::past(i, Kv::Key), cache, dims);
            let v = g.input(&tensor::past(i, Kv::Value), cache, dims);
            (k, v)
        })
        .collect()
}

/// The rotary tables as graph weights `[max_position_embeddings, head_dim / 2]` (cos, sin).
pub(crate) fn rope_weights(
    g: &mut Graph,
    e: Emit,
    cfg: &ModelConfig,
) -> Result<(Value, Value), ExportError> {
    let t = &cfg.text;
    let positions = t.max_position_embeddings.max(1);
    let (cos, sin) = rope_tables(t.rope_theta, t.head_dim, positions);
    let table = [positions as i64, (t.head_dim / 2) as i64];
    let cos = g.weight("decoder_rope_cos_cache", e.act, &table, &cos)?;
    let sin = g.weight("decoder_rope_sin_cache", e.act, &table, &sin)?;
    Ok((cos, sin))
}

/// The attributes GroupQueryAttention and PagedAttention share: heads, rotate-half rotary
/// inside the node, the 1/√head_dim scale.
pub(crate) fn rotary_attention_attrs(cfg: &ModelConfig) -> Vec<(&'static str, Attr)> {
    let t = &cfg.text;
    vec![
        ("num_heads", Attr::Int(t.num_heads as i64)),
        ("kv_num_heads", Attr::Int(t.num_kv_heads as i64)),
        ("do_rotary", Attr::Int(1)),
        ("rotary_interleaved", Attr::Int(0)),
        ("scale", Attr::Float((t.head_dim as f32).powf(-0.5))),
    ]
}

/// Layer `i`'s attention in a cache decoder: on the normed input `hn` of the layer whose
/// checkpoint prefix is `pre`, its output `[.., heads · head_dim]` and present key and value.
pub(crate) type Attention<'a> =
    dyn FnMut(&mut Graph, usize, &str, &Value) -> Result<[Value; 3], ExportError> + 'a;

/// The layers of a cache decoder around its `attention`: per layer the input norm, the
/// attention, o_proj, the residual sum and norm and the MLP, and the layer's present key and
/// value declared as outputs (`present`: the cache's type and dims). Returns the hidden states
/// after the final norm. `step` is called once per layer.
#[allow(clippy::too_many_arguments)]
pub(crate) fn cache_layers(
    g: &mut Graph,
    e: Emit,
    w: &dyn Weights,
    cfg: &ModelConfig,
    x0: Value,
    present: (DType, &[Dim]),
    attention: &mut Attention,
    step: &mut dyn FnMut(),
) -> Result<Value, ExportError> {
    let t = &cfg.text;
    let (d, nh, hd, eps) = (t.hidden_size, t.num_heads, t.head_dim, t.rms_norm_eps);
    let mut x = x0;
    // The MLP output not yet added to the residual stream: the next norm adds it
    // (`add_rms_norm`, one SkipSimplifiedLayerNormalization node for sum and norm).
    let mut pending: Option<Value> = None;
    for i in 0..t.num_layers {
        let pre = format!("{PREFIX}.layers.{i}");
        let (nx, m, pres) = g.scoped(&format!("decoder.layers.{i}"), |g| {
            let name = format!("{pre}.input_layernorm.weight");
            let (hn, x) = layers::add_rms_norm(g, e, w, &x, pending.as_ref(), &name, d, eps)?;
            let [att, k, v] = attention(g, i, &pre, &hn)?;
            let name = format!("{pre}.self_attn.o_proj.weight");
            let o = layers::linear(g, e, w, &att, &name, d, nh * hd)?;
            let name = format!("{pre}.post_attention_layernorm.weight");
            let (hn, x1) = layers::add_rms_norm(g, e, w, &x, Some(&o), &name, d, eps)?;
            let m = mlp(g, e, w, cfg, &pre, &hn)?;
            Ok::<_, ExportError>((x1, m, [k, v]))
        })?;
        x = nx;
        pending = Some(m);
        g.output(&pres[0], &tensor::present(i, Kv::Key), present.0, present.1);
        g.output(
            &pres[1],
            &tensor::present(i, Kv::Value),
            present.0,
            present.1,
        );
        step();
    }
    let name = format!("{PREFIX}.norm.weight");
    Ok(layers::add_rms_norm(g, e, w, &x, pending.as_ref(), &name, d, eps)?.0)
}

/// The outputs of a decoder whose normed last positions are `x [B, 1, D]`: `logits`,
/// `next_token`, the sampling candidates and `logsumexp` (see the module documentation).
pub(crate) fn last_position_outputs(
    g: &mut Graph,
    e: Emit,
    w: &dyn Weights,
    cfg: &ModelConfig,
    x: &Value,
    b: Dim,
) -> Result<(), ExportError> {
    let t = &cfg.text;
    let d = t.hidden_size;
    let logits = layers::linear(g, e, w, x, lm_head_name(cfg, w), t.vocab_size, d)?;
    let logits = layers::cast(g, &logits, e.act, DType::F32);
    g.output(
        &logits,
        tensor::LOGITS,
        DType::F32,
        &[b.clone(), Dim::Fixed(1), Dim::Fixed(t.vocab_size as i64)],
    );
    // The greedy choice on the device: a greedy step needs only these ids on the host, not
    // the [B, vocab] logits (ties: the lowest id, like the runner's argmax).
    let next = g.op(
        "ArgMax",
        &[&logits],
        &[("axis", Attr::Int(-1)), ("keepdims", Attr::Int(0))],
    );
    g.output(
        &next,
        tensor::NEXT_TOKEN,
        DType::I64,
        &[b.clone(), Dim::Fixed(1)],
    );
    // Sampling candidates: the largest logits and their ids, so that a sampling step needs
    // only these on the host whenever they decide the draw (`Sampler::next_from_candidates`).
    // ONNX's TopK returns them largest first, the lower index first among equal values.
    let k = tensor::SAMPLING_CANDIDATES.min(t.vocab_size);
    let kk = g.const_i64(&[k as i64]);
    let top = g.op_multi(
        "TopK",
        &[&logits, &kk],
        &[
            ("axis", Attr::Int(-1)),
            ("largest", Attr::Int(1)),
            ("sorted", Attr::Int(1)),
        ],
        2,
    );
    let top_dims = [b.clone(), Dim::Fixed(1), Dim::Fixed(k as i64)];
    g.output(&top[0], tensor::TOP_LOGITS, DType::F32, &top_dims);
    g.output(&top[1], tensor::TOP_IDS, DType::I64, &top_dims);
    // The log-normaliser of each row: with the candidates it gives the log-probabilities a
    // request asks for (the chosen token's, the top 20) without the logits on the host.
    // max + log Σ exp(logits − max), the max being the first candidate. Spelled out rather
    // than `ReduceLogSumExp`, whose CUDA kernel goes through cuDNN's generic reductions and
    // a scratch copy of the logits; `ReduceSum` over the last axis has ONNX Runtime's own
    // row-reduction kernel.
    let (zero, one, two) = (g.const_i64(&[0]), g.const_i64(&[1]), g.const_i64(&[2]));
    let max = g.op("Slice", &[&top[0], &zero, &one, &two], &[]);
    let shifted = g.op("Sub", &[&logits, &max], &[]);
    let exp = g.op("Exp", &[&shifted], &[]);
    let last = g.const_i64(&[-1]);
    let sum = g.op("ReduceSum", &[&exp, &last], &[("keepdims", Attr::Int(0))]);
    let log = g.op("Log", &[&sum], &[]);
    let max = g.op("Squeeze", &[&max, &two], &[]);
    let lse = g.op("Add", &[&log, &max], &[]);
    g.output(&lse, tensor::LOGSUMEXP, DType::F32, &[b, Dim::Fixed(1)]);
    Ok(())
}

/// The checkpoint's weights with each KV head's group of query heads padded from `group` to
/// `padded` zero heads: model head `j` sits at `(j / group)·padded + j % group` (the
/// attention node pairs query head `h` with KV head `h / padded`, the model head `j` with
/// `j / group`). `q_proj` gets zero rows for the padding heads, `o_proj` zero columns.
struct PaddedHeads<'a> {
    inner: &'a dyn Weights,
    group: usize,
    padded: usize,
    head_dim: usize,
}

impl PaddedHeads<'_> {
    /// The padded position of model head `j`.
    fn slot(&self, j: usize) -> usize {
        (j / self.group) * self.padded + j % self.group
    }

    /// Model heads of a padded head count.
    fn model_heads(&self, padded_heads: usize) -> usize {
        padded_heads / self.padded * self.group
    }
}

impl Weights for PaddedHeads<'_> {
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ExportError> {
        let hd = self.head_dim;
        if name.ends_with(".self_attn.q_proj.weight") && shape.len() == 2 {
            // [heads·hd, in]: rows of head j move to its slot.
            let (rows, inp) = (shape[0], shape[1]);
            let heads = self.model_heads(rows / hd);
            let src = self.inner.get(name, &[heads * hd, inp])?;
            let mut out = vec![0.0; rows * inp];
            for j in 0..heads {
                let (from, to) = (j * hd * inp, self.slot(j) * hd * inp);
                out[to..to + hd * inp].copy_from_slice(&src[from..from + hd * inp]);
            }
            return Ok(out);
        }
        if name.ends_with(".self_attn.o_proj.weight") && shape.len() == 2 {
            // [out, heads·hd]: columns of head j move to its slot, in every row.
            let (rows, cols) = (shape[0], shape[1]);
            let heads = self.model_heads(cols / hd);
            let src = self.inner.get(name, &[rows, heads * hd])?;
            let mut out = vec![0.0; rows * cols];
            for r in 0..rows {
                for j in 0..heads {
                    let from = r * heads * hd + j * hd;
                    let to = r * cols + self.slot(j) * hd;
                    out[to..to + hd].copy_from_slice(&src[from..from + hd]);
                }
            }
            return Ok(out);
        }
        self.inner.get(name, shape)
    }

    fn contains(&self, name: &str) -> bool {
        self.inner.contains(name)
    }

    fn source_dtype(&self) -> String {
        self.inner.source_dtype()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_tables_match_the_angles() {
        let (cos, sin) = rope_tables(10000.0, 16, 3);
        assert_eq!(cos.len(), 3 * 8);
        assert_eq!((cos[0], sin[0]), (1.0, 0.0));
        // Position 2, first frequency (inv_freq[0] = 1).
        assert!((cos[16] - 2f32.cos()).abs() < 1e-7);
        assert!((sin[16] - 2f32.sin()).abs() < 1e-7);
    }

    #[test]
    fn padded_heads_move_to_their_group_slots() {
        // 4 model heads over 2 KV heads (group 2) padded to 4 per group; head_dim 2, in 3.
        let w = PaddedHeads {
            inner: &crate::checkpoint::CountingWeights,
            group: 2,
            padded: 4,
            head_dim: 2,
        };
        let q = w
            .get("m.layers.0.self_attn.q_proj.weight", &[16, 3])
            .unwrap();
        // Model head j's 2 rows (6 values from j*6+1) at padded head 0, 1, 4, 5.
        for (j, slot) in [(0, 0), (1, 1), (2, 4), (3, 5)] {
            let expect: Vec<f32> = (0..6).map(|i| (j * 6 + i + 1) as f32).collect();
            assert_eq!(&q[slot * 6..slot * 6 + 6], &expect[..], "head {j}");
        }
        for slot in [2, 3, 6, 7] {
            assert!(q[slot * 6..slot * 6 + 6].iter().all(|x| *x == 0.0));
        }
        // o_proj [out 2, heads·hd]: row r's model columns (8 per row) spread the same way.
        let o = w
            .get("m.layers.0.self_attn.o_proj.weight", &[2, 16])
            .unwrap();
        assert_eq!(&o[0..4], &[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(&o[4..8], &[0.0; 4]);
        assert_eq!(&o[8..12], &[5.0, 6.0, 7.0, 8.0]);
        assert_eq!(&o[16..20], &[9.0, 10.0, 11.0, 12.0]);
        assert_eq!(&o[24..28], &[13.0, 14.0, 15.0, 16.0]);
        assert_eq!(&o[28..32], &[0.0; 4]);
        // Other tensors pass through.
        let k = w
            .get("m.layers.0.self_attn.k_proj.weight", &[4, 3])
            .unwrap();
        assert_eq!(k.len(), 12);
    }
}
