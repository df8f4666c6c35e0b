//! `decoder_model_paged.onnx`: the Qwen3 decoder over a KV cache in fixed-size blocks, through
//! ONNX Runtime's `com.microsoft.PagedAttention`, checked by `scripts/check_paged.py` and run
//! by ocrctl's runtime on CUDA (`--decoder paged`, `src/runtime/ortmodel/paged.rs`).
//!
//! Inputs:
//! - `inputs_embeds [1, T, D]`: the new tokens of every sequence of the call, packed one
//!   sequence after another (a prompt's many, a decode step's one), with no padding;
//! - `cumulative_sequence_length [B + 1]` (int32): where each sequence's tokens start in `T`,
//!   and `T` last;
//! - `past_seqlens [B]` (int32): the positions each sequence already holds in the cache;
//! - `block_table [B, max_blocks]` (int32): each sequence's cache blocks, in order;
//! - `attention_metadata [2]` (int32, in host memory): upper bounds on any sequence's new
//!   tokens and total positions in this call, which fix the kernel ONNX Runtime picks (a CUDA
//!   graph captured with them stays right while sequences grow below the bounds);
//! - `past_key_values.{i}.key|value [num_blocks, block_size, kv_heads, head_dim]`: the block
//!   pool of layer `i`, written in place (bind `present.{i}.*` to the same memory).
//!
//! Outputs, one row per sequence at its last new token: `logits [B, 1, vocab]`, `next_token`,
//! the sampling candidates and `logsumexp`, as [`crate::decoder_gqa`]'s; and `present.{i}.*`.
//!
//! Why PagedAttention (ONNX Runtime 1.31.1's schema and CUDA kernel, read in
//! `contrib_ops/cuda/bert/paged_attention.cc`): one node takes the q|k|v projection packed
//! (no `Split`), applies Qwen3's per-head query and key RMSNorms (`q_norm_weight`,
//! `k_norm_weight`, `qk_norm_epsilon`) and the rotary embedding at each token's position
//! (`past_seqlens` + its index), writes the keys and values into their blocks and attends with
//! FlashAttention (paged, for block sizes that are a multiple of 128 at head size 128) or its
//! flash-decoding kernel. Prompts and decode tokens of different sequences run in one call.
//! Its kernel is CUDA-only and takes float16 or bfloat16: on the CPU, `scripts/check_paged.py`
//! (`tests/paged.rs`) runs this graph with `onnx.reference` and numpy's PagedAttention and
//! compares it with the GQA decoder. An 8-bit cache pads the query heads as
//! [`crate::decoder_gqa`] does (XQA's groups) and passes the per-tensor scale.

use crate::checkpoint::Weights;
use crate::config::ModelConfig;
use crate::contract::tensor;
use crate::decoder::qkv_names;
use crate::decoder_gqa::{
    cache_inputs, cache_layers, check_attention, kv_scales, last_position_outputs, rope_weights,
    rotary_attention_attrs, Padding,
};
use crate::graph::{Attr, DType, Dim, Graph, Value};
use crate::kv_cache::GqaLayout;
use crate::layers::{self, Emit, Target};
use crate::ExportError;

/// Checks that PagedAttention takes this model and precision: GQA's head constraints and
/// float16 activations.
pub fn check(cfg: &ModelConfig, target: Target, act: DType) -> Result<(), ExportError> {
    check_attention(cfg, target, "paged", "PagedAttention")?;
    if act != DType::F16 {
        return Err(ExportError::Invalid(
            "the paged decoder uses ONNX Runtime's PagedAttention, which takes float16 (or \
             bfloat16) activations only: export it with --precision fp16 or int4-fp16"
                .into(),
        ));
    }
    Ok(())
}

/// Builds `<dir>/<stem>.onnx` with the cache type and query-head layout of `layout`. `step`
/// is called once per decoder layer.
pub fn build(
    dir: &std::path::Path,
    stem: &str,
    cfg: &ModelConfig,
    w: &dyn Weights,
    e: Emit,
    layout: GqaLayout,
    step: &mut dyn FnMut(),
) -> Result<crate::graph::GraphInfo, ExportError> {
    check(cfg, e.target, e.act)?;
    let cache = layout.kv.dtype(e.act);
    let padding = Padding::of(cfg, w, &layout)?;
    let (cfg, w) = padding.model(cfg, w);
    let t = &cfg.text;
    let (d, nh, kvh, hd) = (t.hidden_size, t.num_heads, t.num_kv_heads, t.head_dim);
    let mut g = Graph::create(dir, stem)?;
    let b = Dim::named("batch_size");
    let call = call_inputs(&mut g, e, d, &b);
    let kv_dims = vec![
        Dim::named("num_blocks"),
        Dim::named("block_size"),
        Dim::Fixed(kvh as i64),
        Dim::Fixed(hd as i64),
    ];
    let pools = cache_inputs(&mut g, t.num_layers, cache, &kv_dims);
    let (cos, sin) = rope_weights(&mut g, e, cfg)?;
    let scales = kv_scales(&mut g, &layout, t.num_layers)?;
    // [1, T, x] ⇄ [T, x]: PagedAttention takes tokens without a batch axis.
    let tokens_2d = g.const_i64(&[-1, ((nh + 2 * kvh) * hd) as i64]);
    let tokens_3d = g.const_i64(&[1, -1, (nh * hd) as i64]);
    let node = NodeInputs {
        pools,
        cos,
        sin,
        scales,
        tokens_2d,
        tokens_3d,
    };
    let mut attention = |g: &mut Graph, i: usize, pre: &str, hn: &Value| {
        paged_attention(g, (e, w, cfg), &call, &node, (i, pre, hn))
    };
    let x = cache_layers(
        &mut g,
        e,
        w,
        cfg,
        call.embeds.clone(),
        (cache, &kv_dims),
        &mut attention,
        step,
    )?;
    let x = last_tokens(&mut g, &x, &call.cu);
    last_position_outputs(&mut g, e, w, cfg, &x, b)?;
    g.finish(&[("", e.opset()), ("com.microsoft", 1)], &[])
}

/// What each layer's PagedAttention node takes besides the call's inputs and its own weights.
struct NodeInputs {
    /// Each layer's key and value block pools.
    pools: Vec<(Value, Value)>,
    /// The rotary tables.
    cos: Value,
    sin: Value,
    /// Each layer's 8-bit cache scale.
    scales: Vec<Option<Value>>,
    /// `[T, (heads + 2·kv_heads)·head_dim]` and `[1, T, heads·head_dim]`.
    tokens_2d: Value,
    tokens_3d: Value,
}

/// Layer `i`'s attention (checkpoint prefix `pre`, normed input `hn`): one PagedAttention
/// node over the packed q|k|v projection, its output back in `[1, T, heads·head_dim]`.
fn paged_attention(
    g: &mut Graph,
    (e, w, cfg): (Emit, &dyn Weights, &ModelConfig),
    call: &CallInputs,
    node: &NodeInputs,
    (i, pre, hn): (usize, &str, &Value),
) -> Result<[Value; 3], ExportError> {
    let t = &cfg.text;
    let (d, hd) = (t.hidden_size, t.head_dim);
    let (pk, pv) = &node.pools[i];
    let (names, packed) = qkv_names(cfg, pre);
    let parts = names.each_ref().map(|(n, out)| (n.as_str(), *out));
    let qkv = layers::linear_stacked(g, e, w, hn, &packed, &parts, d)?;
    let qkv = g.op("Reshape", &[&qkv, &node.tokens_2d], &[]);
    let qn = layers::vector(g, e, w, &format!("{pre}.self_attn.q_norm.weight"), hd)?;
    let kn = layers::vector(g, e, w, &format!("{pre}.self_attn.k_norm.weight"), hd)?;
    let absent = Value::absent();
    // query (packed q|k|v), key, value, key_cache, value_cache, cumulative lengths,
    // past lengths, block table, cos, sin, slot_mapping, head_sink, q/k norms,
    // k_scale, v_scale, attention_metadata.
    let mut inputs = vec![
        &qkv,
        &absent,
        &absent,
        pk,
        pv,
        &call.cu,
        &call.past,
        &call.table,
        &node.cos,
        &node.sin,
        &absent,
        &absent,
        &qn,
        &kn,
    ];
    let mut attrs = rotary_attention_attrs(cfg);
    attrs.push(("qk_norm_epsilon", Attr::Float(t.rms_norm_eps as f32)));
    match &node.scales[i] {
        Some(s) => {
            inputs.extend([s, s]);
            attrs.extend([
                ("k_quant_type", Attr::Str("PER_TENSOR".into())),
                ("v_quant_type", Attr::Str("PER_TENSOR".into())),
            ]);
        }
        None => inputs.extend([&absent, &absent]),
    }
    inputs.push(&call.bounds);
    let outs = g.op_multi_in("com.microsoft", "PagedAttention", &inputs, &attrs, 3);
    let att = g.op("Reshape", &[&outs[0], &node.tokens_3d], &[]);
    Ok([att, outs[1].clone(), outs[2].clone()])
}

/// The inputs besides the block pools.
struct CallInputs {
    /// `inputs_embeds [1, T, D]`.
    embeds: Value,
    /// `cumulative_sequence_length [B + 1]`.
    cu: Value,
    /// `past_seqlens [B]`.
    past: Value,
    /// `block_table [B, max_blocks]`.
    table: Value,
    /// `attention_metadata [2]`.
    bounds: Value,
}

/// Declares the inputs of a call (see the module documentation) but the block pools.
fn call_inputs(g: &mut Graph, e: Emit, d: usize, b: &Dim) -> CallInputs {
    let embeds = g.input(
        tensor::INPUTS_EMBEDS,
        e.act,
        &[
            Dim::Fixed(1),
            Dim::named("total_tokens"),
            Dim::Fixed(d as i64),
        ],
    );
    let b1 = Dim::named("batch_size_plus_1");
    let cu = g.input(tensor::CUMULATIVE_SEQUENCE_LENGTH, DType::I32, &[b1]);
    let past = g.input(tensor::PAST_SEQLENS, DType::I32, std::slice::from_ref(b));
    let table = g.input(
        tensor::BLOCK_TABLE,
        DType::I32,
        &[b.clone(), Dim::named("max_blocks_per_sequence")],
    );
    let bounds = g.input(tensor::ATTENTION_METADATA, DType::I32, &[Dim::Fixed(2)]);
    CallInputs {
        embeds,
        cu,
        past,
        table,
        bounds,
    }
}

/// Each sequence's last new token of `x [1, T, D]`: cumulative_sequence_length[1..] − 1,
/// along T; then [1, B, D] → [B, 1, D], the rows the shared outputs take.
fn last_tokens(g: &mut Graph, x: &Value, cu: &Value) -> Value {
    let (one, big, zero) = (
        g.const_i64(&[1]),
        g.const_i64(&[i64::MAX]),
        g.const_i64(&[0]),
    );
    let ends = g.op("Slice", &[cu, &one, &big, &zero], &[]);
    let ends = layers::cast(g, &ends, DType::I32, DType::I64);
    let last = g.op("Sub", &[&ends, &one], &[]);
    let x = g.op("Gather", &[x, &last], &[("axis", Attr::Int(1))]);
    g.op("Transpose", &[&x], &[("perm", Attr::Ints(vec![1, 0, 2]))])
}
