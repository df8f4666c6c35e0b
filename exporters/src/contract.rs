//! The contract between an export and the runtimes that read it: graph names, tensor names at
//! the graph boundaries, and the image geometry the vision encoder was trained for.
//!
//! The exporter writes these names and `ocrctl`'s runtime reads them; both take them from
//! here, so a rename is one edit. The names follow the onnx-community / transformers.js
//! layout (`onnx/<graph><suffix>.onnx`, the suffix from [`crate::export::Precision::suffix`]).
//!
//! ```
//! use ocrctl_exporters::contract::{graph, tensor, Kv};
//! assert_eq!(graph::VISION, "vision_encoder");
//! assert_eq!(tensor::past(3, Kv::Value), "past_key_values.3.value");
//! assert_eq!(tensor::present(0, Kv::Key), "present.0.key");
//! ```

/// Graph file stems (without the precision suffix and `.onnx`).
pub mod graph {
    /// `pixel_values` → `image_features`.
    pub const VISION: &str = "vision_encoder";
    /// `input_ids` → `inputs_embeds`.
    pub const EMBED: &str = "embed_tokens";
    /// The Concat-cache decoder (prefill and step in one graph).
    pub const DECODER_MERGED: &str = "decoder_model_merged";
    /// The GroupQueryAttention decoder with a fixed-size, in-place KV cache.
    pub const DECODER_GQA: &str = "decoder_model_gqa";
    /// The PagedAttention decoder over a KV cache in blocks (experimental).
    pub const DECODER_PAGED: &str = "decoder_model_paged";
    /// Folder of the graphs inside an export.
    pub const DIR: &str = "onnx";
}

/// Tensor names at the graph boundaries.
pub mod tensor {
    use super::Kv;

    /// Vision encoder input `[1, 3, H, W]`.
    pub const PIXEL_VALUES: &str = "pixel_values";
    /// Vision encoder output, one row per image token.
    pub const IMAGE_FEATURES: &str = "image_features";
    /// Embedding input `[B, S]` (int64).
    pub const INPUT_IDS: &str = "input_ids";
    /// Embedding output and decoder input `[B, S, hidden]`.
    pub const INPUTS_EMBEDS: &str = "inputs_embeds";
    /// Decoder mask over past + new positions `[B, P+S]` (merged decoder).
    pub const ATTENTION_MASK: &str = "attention_mask";
    /// Positions of the new tokens `[B, S]` (merged decoder; padded batches need them).
    pub const POSITION_IDS: &str = "position_ids";
    /// How many last positions get logits (merged decoder; 1 while decoding).
    pub const NUM_LOGITS_TO_KEEP: &str = "num_logits_to_keep";
    /// Decoder output.
    pub const LOGITS: &str = "logits";
    /// GQA decoder: per sequence, its total length minus one (int32 `[B]`).
    pub const SEQLENS_K: &str = "seqlens_k";
    /// GQA decoder: the largest total length of the batch (int32 scalar).
    pub const TOTAL_SEQUENCE_LENGTH: &str = "total_sequence_length";
    /// Paged decoder: where each sequence's new tokens start in the packed input, and their
    /// total last (int32 `[B + 1]`).
    pub const CUMULATIVE_SEQUENCE_LENGTH: &str = "cumulative_sequence_length";
    /// Paged decoder: the positions each sequence holds before this call (int32 `[B]`).
    pub const PAST_SEQLENS: &str = "past_seqlens";
    /// Paged decoder: each sequence's cache blocks, in order (int32 `[B, max_blocks]`).
    pub const BLOCK_TABLE: &str = "block_table";
    /// Paged decoder: bounds on any sequence's new tokens and total positions in this call
    /// (int32 `[2]`, host memory).
    pub const ATTENTION_METADATA: &str = "attention_metadata";
    /// GQA decoder: the argmax of the logits, picked on the device (int64 `[B, 1]`).
    pub const NEXT_TOKEN: &str = "next_token";
    /// GQA decoder: the [`SAMPLING_CANDIDATES`] largest logits of each row, largest first
    /// (float32 `[B, 1, K]`), so that a sampling step needs only these on the host.
    pub const TOP_LOGITS: &str = "top_logits";
    /// GQA decoder: the ids of [`TOP_LOGITS`] (int64 `[B, 1, K]`; ties: the lower id first).
    pub const TOP_IDS: &str = "top_ids";
    /// GQA decoder: `log Σ exp(logits)` of each row (float32 `[B, 1]`), so that the
    /// log-probability of a candidate is its logit minus this, without the logits on the host.
    pub const LOGSUMEXP: &str = "logsumexp";
    /// How many candidates [`TOP_LOGITS`] holds: enough for a confident model's nucleus at
    /// LightOnOCR's default temperature 0.2 and top-p 0.9, small enough that moving them is
    /// free (128 rows: 96 KiB per step instead of 78 MiB of logits).
    pub const SAMPLING_CANDIDATES: usize = 64;

    /// Past key or value of layer `layer`, a decoder input.
    pub fn past(layer: usize, kv: Kv) -> String {
        format!("past_key_values.{layer}.{}", kv.name())
    }

    /// Present key or value of layer `layer`, a decoder output.
    pub fn present(layer: usize, kv: Kv) -> String {
        format!("present.{layer}.{}", kv.name())
    }

    /// `past` (or `present` when `present`) names of `layers` layers, key then value per layer.
    pub fn cache_names(layers: usize, present: bool) -> Vec<String> {
        (0..layers)
            .flat_map(|i| {
                [Kv::Key, Kv::Value].map(|kv| {
                    if present {
                        self::present(i, kv)
                    } else {
                        past(i, kv)
                    }
                })
            })
            .collect()
    }
}

/// Key or value half of a layer's cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kv {
    Key,
    Value,
}

impl Kv {
    /// `key` or `value`.
    pub fn name(self) -> &'static str {
        match self {
            Kv::Key => "key",
            Kv::Value => "value",
        }
    }
}

/// What a graph's ONNX `metadata_props` tell other programs that load it.
pub mod hint {
    /// Key naming ONNX Runtime graph transformers to leave out
    /// (`optimization.disable_specified_optimizers`), comma-separated.
    pub const DISABLE_OPTIMIZERS: &str = "onnxruntime.disable_specified_optimizers";

    /// Its value on a GQA decoder with an 8-bit KV cache.
    ///
    /// `GroupQueryAttentionPreNormFusion` folds Qwen3's per-head query/key RMSNorm into the
    /// attention node (inputs 14/15). With the norm fused, ONNX Runtime 1.31.1's CUDA kernel no
    /// longer decodes an 8-bit cache through XQA but dequantizes it: measured on an H200
    /// (`docs/benchmarks/2026-12-03-kv-cache/gpu_ort_opt_diff.py`,
    /// `docs/benchmarks/2026-12-03-kv-cache/gpu_kv_decoder_probe.py`), the full-size fp8 decoder's batch-64 step took 34.1
    /// ms with the fusion and 4.8 ms without it, against 6.4 ms for the fp16 cache, which keeps the
    /// fusion (6.65 ms without it); end to end, fp8 8.47 A4 pages/s at batch 256 against 6.86
    /// (docs/benchmarks/2026-12-03-kv-cache/ §5). ocrctl's runtime leaves it out itself; the hint
    /// is for other ONNX Runtime programs.
    pub const KV8_DISABLED_OPTIMIZERS: &str = "GroupQueryAttentionPreNormFusion";
}

/// Image geometry.
pub mod image {
    /// The longest image side LightOnOCR-2-1B was trained on, px (its
    /// `vision_config.image_size` and the processor's `size.longest_edge`). Used where no
    /// config is at hand: the processor's default and bounds chosen before a model is read
    /// (PDF render size, decode budgets). Everything that has a config takes it from there.
    pub const LONGEST_EDGE: u32 = 1540;
}

/// `onnx/<stem><suffix>.onnx`, the path of a graph inside an export.
pub fn graph_path(stem: &str, suffix: &str) -> String {
    format!("{}/{stem}{suffix}.onnx", graph::DIR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_names_are_in_layer_order_key_first() {
        assert_eq!(
            tensor::cache_names(2, false),
            [
                "past_key_values.0.key",
                "past_key_values.0.value",
                "past_key_values.1.key",
                "past_key_values.1.value"
            ]
        );
        assert_eq!(
            tensor::cache_names(1, true),
            ["present.0.key", "present.0.value"]
        );
        assert_eq!(
            graph_path(graph::VISION, "_q4f16"),
            "onnx/vision_encoder_q4f16.onnx"
        );
    }

    #[test]
    fn the_default_geometry_is_the_models() {
        let c: serde_json::Value =
            serde_json::from_str(crate::config::LIGHTONOCR_2_1B_CONFIG).unwrap();
        assert_eq!(
            c["vision_config"]["image_size"].as_u64(),
            Some(image::LONGEST_EDGE as u64)
        );
    }
}
