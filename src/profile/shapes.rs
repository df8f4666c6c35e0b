//! The model dimensions a budget needs ([`ModelDims`]) and the TensorRT shape ranges derived
//! from a profile ([`trt_shapes`]).

use super::*;

/// The model dimensions the memory calculator and the TensorRT shapes need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelDims {
    /// Vision encoder width.
    pub vision_hidden: u64,
    /// Vision encoder layers.
    pub vision_layers: u64,
    /// Vision attention heads.
    pub vision_heads: u64,
    /// Vision head dimension.
    pub vision_head_dim: u64,
    /// Vision MLP width.
    pub vision_intermediate: u64,
    /// Patch side, px.
    pub patch: u64,
    /// Largest image side the model was trained for, px.
    pub image_size: u64,
    /// Decoder width (also the width of `inputs_embeds`).
    pub text_hidden: u64,
    /// Decoder layers.
    pub text_layers: u64,
    /// Decoder query heads.
    pub text_heads: u64,
    /// Decoder key/value heads.
    pub text_kv_heads: u64,
    /// Decoder head dimension.
    pub text_head_dim: u64,
    /// Decoder MLP width.
    pub text_intermediate: u64,
    /// Vocabulary size (logits width).
    pub vocab: u64,
    /// Spatial merge of the projector (2: 2×2 patches per image token).
    pub merge: u64,
    /// `max_position_embeddings` of the decoder.
    pub max_positions: u64,
}

impl ModelDims {
    /// LightOnOCR-2-1B, from the hub's `config.json` embedded in the exporter (the one
    /// source of the model's shapes; `profiles check` without `--model` uses it).
    pub fn lightonocr_2_1b() -> ModelDims {
        static DIMS: std::sync::OnceLock<ModelDims> = std::sync::OnceLock::new();
        *DIMS.get_or_init(|| {
            let v: serde_json::Value =
                serde_json::from_str(ocrctl_exporters::config::LIGHTONOCR_2_1B_CONFIG)
                    .expect("the embedded config is JSON");
            let c = ModelConfig::from_json(&v, Path::new("lightonocr-2-1b.config.json"))
                .expect("the embedded config parses");
            ModelDims::from_config(&c)
        })
    }

    /// The dimensions of a parsed `config.json` (e.g. an export's manifest).
    pub fn from_config(c: &ModelConfig) -> ModelDims {
        let u = |x: usize| x as u64;
        ModelDims {
            vision_hidden: u(c.vision.hidden_size),
            vision_layers: u(c.vision.num_layers),
            vision_heads: u(c.vision.num_heads),
            vision_head_dim: u(c.vision.head_dim),
            vision_intermediate: u(c.vision.intermediate_size),
            patch: u(c.vision.patch_size),
            image_size: u(c.vision.image_size),
            text_hidden: u(c.text.hidden_size),
            text_layers: u(c.text.num_layers),
            text_heads: u(c.text.num_heads),
            text_kv_heads: u(c.text.num_kv_heads),
            text_head_dim: u(c.text.head_dim),
            text_intermediate: u(c.text.intermediate_size),
            vocab: u(c.text.vocab_size),
            merge: u(c.spatial_merge_size),
            max_positions: u(c.text.max_position_embeddings),
        }
    }

    /// Pixels per image token along one side (patch × merge).
    pub fn image_unit(&self) -> u64 {
        self.patch * self.merge
    }

    /// Image tokens of a preprocessed `h`×`w` image.
    pub fn image_tokens(&self, h: u64, w: u64) -> u64 {
        let a = self.image_unit().max(1);
        (h / a) * (w / a)
    }

    /// Vision patches of a preprocessed `h`×`w` image (before merging).
    pub fn patches(&self, h: u64, w: u64) -> u64 {
        let p = self.patch.max(1);
        (h / p) * (w / p)
    }

    /// KV-cache bytes per token: layers × (key + value) × kv_heads × head_dim × element size.
    pub fn kv_bytes_per_token(&self, elem_bytes: u64) -> u64 {
        mul(&[
            self.text_layers,
            2,
            self.text_kv_heads,
            self.text_head_dim,
            elem_bytes,
        ])
    }
}

pub(crate) fn mul(xs: &[u64]) -> u64 {
    xs.iter().fold(1u64, |a, &x| a.saturating_mul(x))
}

/// Bytes per activation (and KV) element of a precision: 2 for fp16 activations, else 4.
pub fn activation_bytes(p: Precision) -> u64 {
    match p {
        Precision::Fp16 | Precision::Int4Fp16 => 2,
        Precision::Fp32 | Precision::Int4 => 4,
    }
}

/// One graph's `trt_profile_{min,opt,max}_shapes` values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShapeRange {
    /// `trt_profile_min_shapes`.
    pub min: String,
    /// `trt_profile_opt_shapes`.
    pub opt: String,
    /// `trt_profile_max_shapes`.
    pub max: String,
}

/// TensorRT shape profiles for the three graphs of an export.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TrtShapes {
    /// `vision_encoder`: `pixel_values [1, 3, H, W]`.
    pub vision_encoder: ShapeRange,
    /// `embed_tokens`: `input_ids [B, S]`.
    pub embed_tokens: ShapeRange,
    /// `decoder_model_merged`: embeddings, mask, positions and every layer's past.
    pub decoder: ShapeRange,
}

/// An A4 portrait page whose long side is `side`, preprocessed: the short side scaled by
/// 210/297 (floored) and rounded up to a multiple of `unit` (1540 → 1540×1092).
pub fn a4_page(side: u64, unit: u64) -> (u64, u64) {
    let unit = unit.max(1);
    let short = side * 210 / 297;
    let short = short.div_ceil(unit) * unit;
    (side, short.min(side))
}

/// Derives the TensorRT EP's min/opt/max shapes from a profile and the model.
///
/// - Vision (one image per call): min 28×28, opt an A4 page at `max_image_side`
///   (1540×1092), max `max_image_side`².
/// - Embeddings: min `1x1`, opt a decode step of the full batch (`Bx1`), max
///   `B x max_sequence_length`.
/// - Decoder: min batch 1, one new token and an empty past (P = 0, the prefill; TensorRT ≥ 8
///   accepts zero-length dimensions in profiles, and ONNX Runtime GenAI's TensorRT profiles
///   use a zero past minimum too); opt a decode step of the full batch at half the sequence
///   length (decode steps dominate OCR time); max the full batch with S at
///   `max_sequence_length` (a whole-sequence prefill), P at `max_sequence_length` − 1 (the
///   last decode step) and the mask at their sum. No run has both at once, but TensorRT checks
///   that the max shapes agree with each other (mask = past + new: TensorRT-RTX 1.7 warns
///   "Profile kMAX values are not self-consistent" otherwise). TensorRT sizes its activation
///   memory for the max shapes.
pub fn trt_shapes(p: &Profile, d: &ModelDims) -> TrtShapes {
    let side = p.max_image_side as u64;
    let (oh, ow) = a4_page(side, d.image_unit());
    let unit = d.image_unit();
    let vision = ShapeRange {
        min: format!("pixel_values:1x3x{unit}x{unit}"),
        opt: format!("pixel_values:1x3x{oh}x{ow}"),
        max: format!("pixel_values:1x3x{side}x{side}"),
    };
    let b = p.max_batch_size as u64;
    let seq = p.max_sequence_length as u64;
    let embed = ShapeRange {
        min: "input_ids:1x1".to_string(),
        opt: format!("input_ids:{b}x1"),
        max: format!("input_ids:{b}x{seq}"),
    };
    let opt_past = seq / 2;
    let decoder = ShapeRange {
        min: decoder_shapes(d, 1, 1, 0, 1),
        opt: decoder_shapes(d, b, 1, opt_past, opt_past + 1),
        max: decoder_shapes(
            d,
            b,
            seq,
            seq.saturating_sub(1),
            (2 * seq).saturating_sub(1),
        ),
    };
    TrtShapes {
        vision_encoder: vision,
        embed_tokens: embed,
        decoder,
    }
}

/// The decoder's shapes for batch `b`, `s` new tokens, a past of `past` tokens and an
/// attention mask of `mask` positions.
pub(crate) fn decoder_shapes(d: &ModelDims, b: u64, s: u64, past: u64, mask: u64) -> String {
    let mut parts = vec![
        format!("inputs_embeds:{b}x{s}x{}", d.text_hidden),
        format!("attention_mask:{b}x{mask}"),
        format!("position_ids:{b}x{s}"),
    ];
    for i in 0..d.text_layers {
        for kind in ["key", "value"] {
            parts.push(format!(
                "past_key_values.{i}.{kind}:{b}x{}x{past}x{}",
                d.text_kv_heads, d.text_head_dim
            ));
        }
    }
    parts.join(",")
}
