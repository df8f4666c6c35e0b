//! `config.json` of a LightOnOCR checkpoint, in either flavour, normalised.
//!
//! The hub ships `model_type: "mistral3"` with `architectures:
//! ["LightOnOCRForConditionalGeneration"]`; transformers ≥ 5 writes `model_type:
//! "lighton_ocr"`. Both nest a Pixtral `vision_config` and a Qwen3 `text_config`. Every
//! hyper-parameter the graphs need comes from here; keys ocrctl does not know are an error
//! (they might change the maths), except the bookkeeping keys listed in [`IGNORED_KEYS`].
//!
//! Ports the config handling of transformers'
//! `models/lighton_ocr/configuration_lighton_ocr.py`, `pixtral/configuration_pixtral.py`
//! and `qwen3/configuration_qwen3.py`.

use crate::ExportError;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Pixtral's RMSNorm epsilon: transformers hard-codes 1e-5 for `ln_pre`, `attention_norm`
/// and `ffn_norm` (the vision config has no key for it).
pub const PIXTRAL_RMS_EPS: f64 = 1e-5;

/// Keys that do not change the computation and are accepted anywhere.
pub const IGNORED_KEYS: &[&str] = &[
    "architectures",
    "dtype",
    "torch_dtype",
    "transformers_version",
    "initializer_range",
    "attention_dropout",
    "use_cache",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "layer_types",
    "max_window_layers",
    "sliding_window",
    "use_sliding_window",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "tie_word_embeddings",
    "id2label",
    "label2id",
    "problem_type",
    "is_encoder_decoder",
    "chunk_size_feed_forward",
    "tokenizer_class",
    "prefix",
    "task_specific_params",
    "finetuning_task",
    "num_labels",
    "transformers.js_config",
    "use_qk_norm",
    "image_token_index",
    "vision_feature_layer",
    "multimodal_projector_bias",
    "projector_hidden_act",
    "attention_bias",
    "rope_scaling",
];

/// Which `config.json` layout the checkpoint used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Flavour {
    /// `model_type: "mistral3"` + `LightOnOCRForConditionalGeneration` (the hub).
    Hub,
    /// `model_type: "lighton_ocr"` (transformers ≥ 5).
    Transformers,
}

/// Pixtral vision encoder hyper-parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VisionConfig {
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub patch_size: usize,
    pub image_size: usize,
    pub num_channels: usize,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    /// Activation of the gated MLP: `silu` (the hub checkpoint) or `gelu` (exact; the
    /// transformers default when the key is absent).
    pub hidden_act: String,
}

impl VisionConfig {
    /// Patches per side of the largest image: the width of the 2-D RoPE position grid.
    pub fn max_patches_per_side(&self) -> usize {
        self.image_size / self.patch_size
    }
}

/// Qwen3 decoder hyper-parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextConfig {
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
}

/// The whole model's configuration, independent of the flavour it was read from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub flavour: Flavour,
    pub image_token_id: u32,
    pub eos_token_ids: Vec<u32>,
    pub pad_token_id: Option<u32>,
    pub spatial_merge_size: usize,
    /// RMSNorm epsilon of the projector's pre-merge norm (transformers uses the text eps).
    pub projector_rms_norm_eps: f64,
    pub vision: VisionConfig,
    pub text: TextConfig,
}

/// A JSON object being read, remembering which keys were used so leftovers can be reported.
struct Section<'a> {
    file: &'a Path,
    path: String,
    obj: &'a Map<String, Value>,
    used: RefCell<BTreeSet<String>>,
}

impl<'a> Section<'a> {
    fn new(file: &'a Path, path: &str, v: &'a Value) -> Result<Section<'a>, ExportError> {
        let obj = v.as_object().ok_or_else(|| {
            ExportError::config(
                file,
                format!("`{}` must be a JSON object", path_or_root(path)),
            )
        })?;
        Ok(Section {
            file,
            path: path.to_string(),
            obj,
            used: RefCell::new(BTreeSet::new()),
        })
    }

    fn key_path(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    fn err(&self, key: &str, msg: &str) -> ExportError {
        ExportError::config(self.file, format!("field `{}`: {msg}", self.key_path(key)))
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.used.borrow_mut().insert(key.to_string());
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn opt_usize(&self, key: &str) -> Result<Option<usize>, ExportError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|n| *n > 0)
                .map(|n| Some(n as usize))
                .ok_or_else(|| self.err(key, &format!("expected a positive integer, found {v}"))),
        }
    }

    fn usize(&self, key: &str) -> Result<usize, ExportError> {
        self.opt_usize(key)?
            .ok_or_else(|| self.err(key, "missing (required)"))
    }

    fn opt_f64(&self, key: &str) -> Result<Option<f64>, ExportError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
                .map(Some)
                .ok_or_else(|| self.err(key, &format!("expected a positive number, found {v}"))),
        }
    }

    fn opt_str(&self, key: &str) -> Result<Option<&'a str>, ExportError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(key, &format!("expected a string, found {v}"))),
        }
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>, ExportError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(key, &format!("expected true or false, found {v}"))),
        }
    }

    fn opt_ids(&self, key: &str) -> Result<Vec<u32>, ExportError> {
        let bad = || self.err(key, "expected a token id or a list of token ids");
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_u64().map(|n| n as u32).ok_or_else(bad))
                .collect(),
            Some(v) => Ok(vec![v.as_u64().ok_or_else(bad)? as u32]),
        }
    }

    /// Requires `key` to be absent, null or equal to one of `allowed`.
    fn expect_one_of(&self, key: &str, allowed: &[Value]) -> Result<(), ExportError> {
        match self.get(key) {
            Some(v) if !allowed.contains(v) => Err(self.err(
                key,
                &format!(
                    "value {v} is not supported by ocrctl (supported: {})",
                    allowed
                        .iter()
                        .map(|a| a.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
            _ => Ok(()),
        }
    }

    fn finish(&self) -> Result<(), ExportError> {
        let used = self.used.borrow();
        let unknown: Vec<String> = self
            .obj
            .keys()
            .filter(|k| !used.contains(*k) && !IGNORED_KEYS.contains(&k.as_str()))
            .filter(|k| !k.starts_with('_'))
            .map(|k| format!("`{}`", self.key_path(k)))
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(ExportError::config(
                self.file,
                format!(
                    "unknown field(s) {}: ocrctl does not know how they change the model",
                    unknown.join(", ")
                ),
            ))
        }
    }
}

fn path_or_root(p: &str) -> &str {
    if p.is_empty() {
        "(top level)"
    } else {
        p
    }
}

/// Reads θ from `rope_parameters.rope_theta` and/or a flat `rope_theta`; both must agree and
/// the RoPE type must be the default one.
fn rope_theta(s: &Section, default: Option<f64>, rope_types: &[&str]) -> Result<f64, ExportError> {
    let flat = s.opt_f64("rope_theta")?;
    let nested = match s.get("rope_parameters") {
        None => None,
        Some(v) => {
            let p = Section::new(s.file, &s.key_path("rope_parameters"), v)?;
            let types: Vec<Value> = rope_types.iter().map(|t| Value::from(*t)).collect();
            p.expect_one_of("rope_type", &types)?;
            let t = p.opt_f64("rope_theta")?;
            p.opt_f64("partial_rotary_factor")?
                .filter(|f| *f != 1.0)
                .map_or(Ok(()), |_| {
                    Err(p.err("partial_rotary_factor", "only 1.0 is supported"))
                })?;
            p.finish()?;
            t
        }
    };
    s.expect_one_of("rope_scaling", &[Value::Null])?;
    match (flat, nested) {
        (Some(a), Some(b)) if a != b => Err(s.err(
            "rope_theta",
            &format!("{a} disagrees with rope_parameters.rope_theta = {b}"),
        )),
        (Some(t), _) | (None, Some(t)) => Ok(t),
        (None, None) => default.ok_or_else(|| s.err("rope_theta", "missing (required)")),
    }
}

fn vision_config(s: &Section) -> Result<VisionConfig, ExportError> {
    s.expect_one_of("model_type", &[Value::from("pixtral")])?;
    s.expect_one_of("hidden_act", &[Value::from("silu"), Value::from("gelu")])?;
    let hidden_act = s.opt_str("hidden_act")?.unwrap_or("gelu").to_string();
    let hidden_size = s.usize("hidden_size")?;
    let num_heads = s.usize("num_attention_heads")?;
    let head_dim = s.opt_usize("head_dim")?.unwrap_or(hidden_size / num_heads);
    let patch_size = s.usize("patch_size")?;
    let image_size = s.usize("image_size")?;
    if image_size < patch_size {
        return Err(s.err("image_size", "smaller than patch_size"));
    }
    let cfg = VisionConfig {
        hidden_size,
        num_layers: s.usize("num_hidden_layers")?,
        num_heads,
        head_dim,
        intermediate_size: s.usize("intermediate_size")?,
        patch_size,
        image_size,
        num_channels: s.opt_usize("num_channels")?.unwrap_or(3),
        rope_theta: rope_theta(s, None, &["default", "axial"])?,
        rms_norm_eps: PIXTRAL_RMS_EPS,
        hidden_act,
    };
    if head_dim % 4 != 0 {
        return Err(s.err("head_dim", "must be a multiple of 4 for the 2-D RoPE"));
    }
    s.finish()?;
    Ok(cfg)
}

fn text_config(s: &Section, top_tie: Option<bool>) -> Result<TextConfig, ExportError> {
    s.expect_one_of("model_type", &[Value::from("qwen3")])?;
    s.expect_one_of("hidden_act", &[Value::from("silu")])?;
    s.expect_one_of("attention_bias", &[Value::Bool(false)])?;
    s.expect_one_of("use_sliding_window", &[Value::Bool(false)])?;
    s.expect_one_of("use_qk_norm", &[Value::Bool(true)])?;
    let hidden_size = s.usize("hidden_size")?;
    let num_heads = s.usize("num_attention_heads")?;
    let num_kv_heads = s.opt_usize("num_key_value_heads")?.unwrap_or(num_heads);
    if num_heads % num_kv_heads != 0 {
        return Err(s.err(
            "num_key_value_heads",
            &format!("{num_kv_heads} does not divide num_attention_heads = {num_heads}"),
        ));
    }
    let head_dim = s.opt_usize("head_dim")?.unwrap_or(hidden_size / num_heads);
    if head_dim % 2 != 0 {
        return Err(s.err("head_dim", "must be even for RoPE"));
    }
    // Absent everywhere (the pruned 0.9B models): Qwen3's default, untied, as transformers
    // reads it; their checkpoints carry an `lm_head.weight` (their sizes on the hub say so),
    // and one without it still gets the embeddings (`decoder::lm_head_name`).
    let tie = s
        .opt_bool("tie_word_embeddings")?
        .or(top_tie)
        .unwrap_or(false);
    let cfg = TextConfig {
        hidden_size,
        num_layers: s.usize("num_hidden_layers")?,
        num_heads,
        num_kv_heads,
        head_dim,
        intermediate_size: s.usize("intermediate_size")?,
        vocab_size: s.usize("vocab_size")?,
        rms_norm_eps: s.opt_f64("rms_norm_eps")?.unwrap_or(1e-6),
        rope_theta: rope_theta(s, None, &["default"])?,
        max_position_embeddings: s.usize("max_position_embeddings")?,
        tie_word_embeddings: tie,
    };
    s.finish()?;
    Ok(cfg)
}

impl ModelConfig {
    /// This configuration with `heads` query heads in the decoder (graphs whose attention
    /// pads the query heads, see `decoder_gqa`); everything else unchanged.
    pub fn with_query_heads(&self, heads: usize) -> ModelConfig {
        let mut c = self.clone();
        c.text.num_heads = heads;
        c
    }

    /// Reads `config.json` (the file path is used in every error message).
    pub fn from_file(path: &Path) -> Result<ModelConfig, ExportError> {
        let text = std::fs::read_to_string(path).map_err(|e| ExportError::io(path, e))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| ExportError::config(path, format!("invalid JSON: {e}")))?;
        ModelConfig::from_json(&v, path)
    }

    /// Parses an already-loaded `config.json`; `file` names it in errors.
    pub fn from_json(v: &Value, file: &Path) -> Result<ModelConfig, ExportError> {
        let top = Section::new(file, "", v)?;
        let model_type = top
            .opt_str("model_type")?
            .ok_or_else(|| top.err("model_type", "missing (required)"))?;
        let archs: Vec<&str> = top
            .obj
            .get("architectures")
            .and_then(|a| a.as_array())
            .map(|a| a.iter().filter_map(|x| x.as_str()).collect())
            .unwrap_or_default();
        let flavour = match model_type {
            "lighton_ocr" => Flavour::Transformers,
            "mistral3"
                if archs
                    .iter()
                    .any(|a| a.eq_ignore_ascii_case("LightOnOCRForConditionalGeneration")) =>
            {
                Flavour::Hub
            }
            "mistral3" => {
                return Err(top.err(
                    "architectures",
                    &format!(
                        "model_type `mistral3` is only supported for LightOnOCRForConditionalGeneration, found {archs:?}"
                    ),
                ))
            }
            other => {
                return Err(top.err(
                    "model_type",
                    &format!("unsupported model_type `{other}` (expected `lighton_ocr` or the hub's `mistral3`)"),
                ))
            }
        };
        top.expect_one_of("projector_hidden_act", &[Value::from("gelu")])?;
        top.expect_one_of("multimodal_projector_bias", &[Value::Bool(false)])?;
        top.expect_one_of("vision_feature_layer", &[Value::from(-1)])?;
        let image_token_id = match (
            top.opt_ids("image_token_id")?,
            top.opt_ids("image_token_index")?,
        ) {
            (a, _) if a.len() == 1 => a[0],
            (_, b) if b.len() == 1 => b[0],
            _ => return Err(top.err("image_token_id", "missing (required)")),
        };
        let eos_token_ids = top.opt_ids("eos_token_id")?;
        let pad_token_id = top.opt_ids("pad_token_id")?.first().copied();
        let spatial_merge_size = top.opt_usize("spatial_merge_size")?.unwrap_or(2);
        let top_tie = top.opt_bool("tie_word_embeddings")?;
        let vision_v = top
            .get("vision_config")
            .ok_or_else(|| top.err("vision_config", "missing (required)"))?;
        let text_v = top
            .get("text_config")
            .ok_or_else(|| top.err("text_config", "missing (required)"))?;
        let vision = vision_config(&Section::new(file, "vision_config", vision_v)?)?;
        let text = text_config(&Section::new(file, "text_config", text_v)?, top_tie)?;
        top.finish()?;
        Ok(ModelConfig {
            flavour,
            image_token_id,
            eos_token_ids,
            pad_token_id,
            spatial_merge_size,
            projector_rms_norm_eps: text.rms_norm_eps,
            vision,
            text,
        })
    }

    /// Image tokens for a preprocessed image of `height`×`width` pixels.
    pub fn image_tokens(&self, height: usize, width: usize) -> usize {
        let a = self.vision.patch_size * self.spatial_merge_size;
        (height / a) * (width / a)
    }
}

/// The real LightOnOCR-2-1B `config.json` (hub flavour), used by the dummy-weights export.
pub const LIGHTONOCR_2_1B_CONFIG: &str = include_str!("lightonocr-2-1b.config.json");

/// Where `config.json` lives in a checkpoint directory.
pub fn config_path(dir: &Path) -> PathBuf {
    dir.join("config.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<ModelConfig, ExportError> {
        ModelConfig::from_json(&v, Path::new("config.json"))
    }

    fn hub() -> Value {
        serde_json::from_str(LIGHTONOCR_2_1B_CONFIG).unwrap()
    }

    #[test]
    fn hub_config_gives_the_published_shapes() {
        let c = parse(hub()).unwrap();
        assert_eq!(c.flavour, Flavour::Hub);
        assert_eq!(c.image_token_id, 151655);
        assert_eq!(
            (c.vision.hidden_size, c.vision.num_layers, c.vision.head_dim),
            (1024, 24, 64)
        );
        assert_eq!(c.vision.max_patches_per_side(), 110);
        assert_eq!(c.vision.rope_theta, 10000.0);
        assert_eq!(c.vision.hidden_act, "silu");
        assert_eq!(
            (c.text.num_heads, c.text.num_kv_heads, c.text.head_dim),
            (16, 8, 128)
        );
        assert_eq!(c.text.rope_theta, 1e6);
        assert_eq!(c.text.vocab_size, 151936);
        assert!(c.text.tie_word_embeddings);
        assert_eq!(c.projector_rms_norm_eps, 1e-6);
        assert_eq!(c.image_tokens(1540, 1092), 2145);
    }

    #[test]
    fn transformers_flavour_is_accepted() {
        let mut v = hub();
        v["model_type"] = "lighton_ocr".into();
        v["architectures"] = serde_json::json!(["LightOnOcrForConditionalGeneration"]);
        v["text_config"]
            .as_object_mut()
            .unwrap()
            .remove("rope_theta");
        assert_eq!(parse(v).unwrap().flavour, Flavour::Transformers);
    }

    #[test]
    fn errors_name_the_field() {
        let mut v = hub();
        v["text_config"]
            .as_object_mut()
            .unwrap()
            .remove("hidden_size");
        let e = parse(v).unwrap_err().to_string();
        assert!(
            e.contains("text_config.hidden_size") && e.contains("missing"),
            "{e}"
        );

        let mut v = hub();
        v["model_type"] = "llava".into();
        assert!(parse(v)
            .unwrap_err()
            .to_string()
            .contains("unsupported model_type `llava`"));

        let mut v = hub();
        v["vision_config"]["frobnicate"] = 3.into();
        let e = parse(v).unwrap_err().to_string();
        assert!(e.contains("`vision_config.frobnicate`"), "{e}");

        let mut v = hub();
        v["text_config"]["rope_parameters"]["rope_theta"] = 5e5.into();
        let e = parse(v).unwrap_err().to_string();
        assert!(
            e.contains("text_config.rope_theta") && e.contains("disagrees"),
            "{e}"
        );

        let mut v = hub();
        v["text_config"]["rope_parameters"]["rope_type"] = "yarn".into();
        assert!(parse(v).unwrap_err().to_string().contains("rope_type"));

        let mut v = hub();
        v["text_config"]["num_key_value_heads"] = 3.into();
        assert!(parse(v)
            .unwrap_err()
            .to_string()
            .contains("num_key_value_heads"));

        let mut v = hub();
        v["architectures"] = serde_json::json!(["Mistral3ForConditionalGeneration"]);
        assert!(parse(v).unwrap_err().to_string().contains("architectures"));
    }
}
