//! The processor files of an export, adjusted so that the tools that read the onnx-community
//! layout (transformers.js, fast-lightonocr) build LightOnOCR's prompt.
//!
//! LightOnOCR checkpoints ship Pixtral's `processor_config.json`, whose `image_break_token`
//! and `image_end_token` make a Pixtral processor insert a break token after every row of
//! image patches and an end token after the image. LightOnOCR, transformers' LightOnOCR
//! processor and vLLM use neither: the prompt holds `image_token × (rows · cols)` alone, and
//! with the two tokens the full-size model's first answer token changes. The export writes
//! them as `""` (no such token), which transformers.js honours (fast-lightonocr 0.1.4 does
//! not: it requires both tokens, so it can only build Pixtral's prompt). `preprocessor_config.json`,
//! which transformers.js reads for the image settings and the processor class, is written from
//! the processor's `image_processor` block (or its flat settings) when the checkpoint has none,
//! and gets `processor_class` in any case. ocrctl reads none of these fields: its prompt and
//! preprocessing already follow LightOnOCR.
//!
//! [`complete`] fills what the v1 and pruned models' files (see [`crate::family`]) leave out
//! and transformers.js requires: `spatial_merge_size` from `config.json` (without it: "config
//! must contain 'spatial_merge_size'"), the image token from the tokenizer, a numeric
//! `patch_size`, the chat template in `tokenizer_config.json`; their `LightOnOCRProcessor`
//! class, which transformers.js lacks, is written as `PixtralProcessor`.
//!
//! [`adapt_config`] adds what the onnx-community `config.json` carries beside the hub's:
//! `image_token_index` and the `transformers.js_config` block (which graphs have external
//! data, the KV-cache dtype per precision).

use crate::config::ModelConfig;
use crate::export::Precision;
use crate::family::Tokens;
use crate::graph::GraphInfo;
use crate::ExportError;
use serde_json::{json, Value};
use std::path::Path;

/// The keys that would add Pixtral's row-break and image-end tokens to a prompt.
pub const PIXTRAL_LAYOUT_KEYS: [&str; 2] = ["image_break_token", "image_end_token"];

/// Adjusts `processor_config.json` in the export directory `dir` (if present) and writes
/// `preprocessor_config.json` beside it when missing.
pub fn adapt(dir: &Path) -> Result<(), ExportError> {
    let path = dir.join("processor_config.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(());
    };
    let mut v: Value = serde_json::from_str(&text)
        .map_err(|e| ExportError::config(&path, format!("not valid JSON: {e}")))?;
    let Some(obj) = v.as_object_mut() else {
        return Err(ExportError::config(&path, "expected a JSON object"));
    };
    for key in PIXTRAL_LAYOUT_KEYS {
        if obj.contains_key(key) {
            obj.insert(key.to_string(), Value::String(String::new()));
        }
    }
    let image_processor = match obj.get("image_processor") {
        Some(ip @ Value::Object(_)) => Some(ip.clone()),
        // An older flat layout: the image settings are the object itself.
        _ if obj.contains_key("image_processor_type") => Some(Value::Object(obj.clone())),
        _ => None,
    };
    let processor_class =
        readable_processor_class(v.get("processor_class").and_then(Value::as_str))
            .unwrap_or("PixtralProcessor")
            .to_string();
    let out = serde_json::to_string_pretty(&v).expect("JSON");
    std::fs::write(&path, out).map_err(|e| ExportError::io(&path, e))?;
    let pre = dir.join("preprocessor_config.json");
    if let (Some(mut ip), false) = (image_processor, pre.exists()) {
        if let Some(o) = ip.as_object_mut() {
            for key in PIXTRAL_LAYOUT_KEYS {
                o.remove(key);
            }
            // What the processor keeps beside the image settings, readers want here too.
            for key in ["patch_size", "spatial_merge_size"] {
                if let (false, Some(x)) = (o.contains_key(key), v.get(key)) {
                    o.insert(key.to_string(), x.clone());
                }
            }
        }
        let out = serde_json::to_string_pretty(&ip).expect("JSON");
        std::fs::write(&pre, out).map_err(|e| ExportError::io(&pre, e))?;
    }
    // transformers.js picks the processor (and with it the tokenizer) by this field.
    if let Ok(text) = std::fs::read_to_string(&pre) {
        let mut p: Value = serde_json::from_str(&text)
            .map_err(|e| ExportError::config(&pre, format!("not valid JSON: {e}")))?;
        if let Some(o) = p.as_object_mut() {
            let own = o.get("processor_class").and_then(Value::as_str);
            if readable_processor_class(own).is_none() {
                o.insert("processor_class".into(), Value::String(processor_class));
                let out = serde_json::to_string_pretty(&p).expect("JSON");
                std::fs::write(&pre, out).map_err(|e| ExportError::io(&pre, e))?;
            }
        }
    }
    Ok(())
}

/// Completes what transformers.js needs and the checkpoint may lack (the v1 and pruned models
/// ship transformers 4.x files): in `processor_config.json`, `spatial_merge_size` and
/// `patch_size` from `cfg`, `image_token` from `tokenizer.json`'s entry for
/// `cfg.image_token_id`, and the Pixtral break/end tokens (as `""`: without them its
/// PixtralProcessor writes "undefined" into the prompt); in the checkpoint's own
/// `preprocessor_config.json`, `spatial_merge_size` (its image processor aligns with it) and
/// `patch_size` as a bare number (the 16k model's `{height, width}` would make it NaN); in
/// `tokenizer_config.json`, `chat_template` from `chat_template.jinja` (its tokenizer reads
/// the template nowhere else). Present keys are kept; a missing file is left missing.
pub fn complete(dir: &Path, cfg: &ModelConfig) -> Result<(), ExportError> {
    edit_json(&dir.join("processor_config.json"), |obj| {
        let mut changed = false;
        for (key, value) in [
            ("spatial_merge_size", json!(cfg.spatial_merge_size)),
            ("patch_size", json!(cfg.vision.patch_size)),
            ("image_break_token", json!("")),
            ("image_end_token", json!("")),
        ] {
            changed |= insert_missing(obj, key, value);
        }
        if obj.get("image_token").is_none_or(Value::is_null) {
            obj.insert("image_token".into(), json!(image_token(dir, cfg)?));
            changed = true;
        }
        Ok(changed)
    })?;
    edit_json(&dir.join("preprocessor_config.json"), |obj| {
        let mut changed = insert_missing(obj, "spatial_merge_size", json!(cfg.spatial_merge_size));
        if obj.get("patch_size").is_some_and(|p| !p.is_u64()) {
            obj.insert("patch_size".into(), json!(cfg.vision.patch_size));
            changed = true;
        }
        Ok(changed)
    })?;
    let template = dir.join("chat_template.jinja");
    if let Ok(text) = std::fs::read_to_string(&template) {
        edit_json(&dir.join("tokenizer_config.json"), |obj| {
            Ok(insert_missing(obj, "chat_template", json!(text)))
        })?;
    }
    Ok(())
}

/// Sets `key` where it is absent or null; says whether it did.
fn insert_missing(obj: &mut serde_json::Map<String, Value>, key: &str, value: Value) -> bool {
    if obj.get(key).is_none_or(Value::is_null) {
        obj.insert(key.into(), value);
        true
    } else {
        false
    }
}

/// The token string of the config's image token id, from `tokenizer.json`.
fn image_token(dir: &Path, cfg: &ModelConfig) -> Result<String, ExportError> {
    let path = dir.join("tokenizer.json");
    Tokens::read(&path)?
        .token(cfg.image_token_id)
        .map(str::to_string)
        .ok_or_else(|| {
            ExportError::config(
                &path,
                format!(
                    "no token with config.json's image_token_id {} (processor_config.json \
                     names none either)",
                    cfg.image_token_id
                ),
            )
        })
}

/// Applies `edit` to the JSON object in `path` and writes it back when it says it changed
/// something; a missing file is no error.
fn edit_json(
    path: &Path,
    edit: impl FnOnce(&mut serde_json::Map<String, Value>) -> Result<bool, ExportError>,
) -> Result<(), ExportError> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    let mut v: Value = serde_json::from_str(&text)
        .map_err(|e| ExportError::config(path, format!("not valid JSON: {e}")))?;
    let Some(obj) = v.as_object_mut() else {
        return Err(ExportError::config(path, "expected a JSON object"));
    };
    if edit(obj)? {
        let out = serde_json::to_string_pretty(&v).expect("JSON");
        std::fs::write(path, out).map_err(|e| ExportError::io(path, e))?;
    }
    Ok(())
}

/// transformers.js has no LightOnOCR processor class (the v1 files name `LightOnOCRProcessor`):
/// its PixtralProcessor, with the break/end tokens cleared, builds LightOnOCR's prompt.
fn readable_processor_class(class: Option<&str>) -> Option<&str> {
    class.filter(|c| !c.to_ascii_lowercase().starts_with("lightonocr"))
}

/// Adds the onnx-community fields to the export's `config.json` in `dir`: `image_token_index`
/// (transformers-style name of `image_token_id`) and `transformers.js_config` with
/// `use_external_data_format` (one data file for each graph that has one) and `kv_cache_dtype`
/// (float16 for the 16-bit precisions). Other fields are kept as they are.
pub fn adapt_config(
    dir: &Path,
    image_token_id: u32,
    graphs: &[(Precision, &GraphInfo)],
) -> Result<(), ExportError> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| ExportError::io(&path, e))?;
    let mut v: Value = serde_json::from_str(&text)
        .map_err(|e| ExportError::config(&path, format!("not valid JSON: {e}")))?;
    let Some(obj) = v.as_object_mut() else {
        return Err(ExportError::config(&path, "expected a JSON object"));
    };
    obj.entry("image_token_index")
        .or_insert(json!(image_token_id));
    let external: serde_json::Map<String, Value> = graphs
        .iter()
        .filter(|(_, g)| g.data_file.is_some())
        .map(|(_, g)| (g.file.clone(), json!(1)))
        .collect();
    let kv: serde_json::Map<String, Value> = graphs
        .iter()
        .filter(|(p, _)| *p == Precision::Fp16 || *p == Precision::Int4Fp16)
        .map(|(p, _)| {
            let name = if *p == Precision::Fp16 {
                "fp16"
            } else {
                "q4f16"
            };
            (name.to_string(), json!("float16"))
        })
        .collect();
    let mut js = json!({"use_external_data_format": external});
    if !kv.is_empty() {
        js["kv_cache_dtype"] = Value::Object(kv);
    }
    obj.insert("transformers.js_config".into(), js);
    let out = serde_json::to_string_pretty(&v).expect("JSON");
    std::fs::write(&path, out).map_err(|e| ExportError::io(&path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn break_and_end_tokens_are_cleared_and_a_preprocessor_config_is_written() {
        let d = tempfile::tempdir().unwrap();
        let proc = json!({
            "image_break_token": "<|vision_pad|>", "image_end_token": "<|vision_end|>",
            "image_token": "<|image_pad|>", "patch_size": 14, "spatial_merge_size": 2,
            "image_processor": {"image_processor_type": "PixtralImageProcessorFast",
                                "size": {"longest_edge": 1540}}
        });
        std::fs::write(d.path().join("processor_config.json"), proc.to_string()).unwrap();
        adapt(d.path()).unwrap();
        let read = |n: &str| -> Value {
            serde_json::from_str(&std::fs::read_to_string(d.path().join(n)).unwrap()).unwrap()
        };
        let p = read("processor_config.json");
        assert_eq!(p["image_break_token"], "");
        assert_eq!(p["image_end_token"], "");
        assert_eq!(p["image_token"], "<|image_pad|>");
        assert_eq!(p["image_processor"]["size"]["longest_edge"], 1540);
        let pre = read("preprocessor_config.json");
        assert_eq!(pre["image_processor_type"], "PixtralImageProcessorFast");
        assert_eq!(pre["processor_class"], "PixtralProcessor");
        assert_eq!(
            (pre["patch_size"].clone(), pre["spatial_merge_size"].clone()),
            (json!(14), json!(2))
        );
        // A checkpoint's own preprocessor_config.json is kept (and given the processor class);
        // no processor file, no change.
        std::fs::write(d.path().join("preprocessor_config.json"), "{\"mine\": 1}").unwrap();
        adapt(d.path()).unwrap();
        assert_eq!(read("preprocessor_config.json")["mine"], 1);
        assert_eq!(
            read("preprocessor_config.json")["processor_class"],
            "PixtralProcessor"
        );
        let empty = tempfile::tempdir().unwrap();
        adapt(empty.path()).unwrap();
        assert!(!empty.path().join("preprocessor_config.json").exists());
    }

    /// A flat `processor_config.json` (image settings at the top, no processor keys) gets
    /// `spatial_merge_size` from the config and `image_token` from the tokenizer; the keys a
    /// checkpoint gives are kept.
    #[test]
    fn a_flat_processor_config_is_completed() {
        let d = tempfile::tempdir().unwrap();
        let cfg: ModelConfig = ModelConfig::from_json(
            &serde_json::from_str(crate::config::LIGHTONOCR_2_1B_CONFIG).unwrap(),
            Path::new("config.json"),
        )
        .unwrap();
        let flat = json!({"image_processor_type": "PixtralImageProcessorFast",
                          "processor_class": "LightOnOCRProcessor", "size": {"longest_edge": 1540}});
        std::fs::write(d.path().join("processor_config.json"), flat.to_string()).unwrap();
        let tok = json!({"model": {"vocab": {"a": 0}},
                         "added_tokens": [{"id": 151655, "content": "<|image_pad|>"}]});
        std::fs::write(d.path().join("tokenizer.json"), tok.to_string()).unwrap();
        std::fs::write(d.path().join("chat_template.jinja"), "T").unwrap();
        std::fs::write(d.path().join("tokenizer_config.json"), "{}").unwrap();
        complete(d.path(), &cfg).unwrap();
        adapt(d.path()).unwrap();
        let read = |n: &str| -> Value {
            serde_json::from_str(&std::fs::read_to_string(d.path().join(n)).unwrap()).unwrap()
        };
        let p = read("processor_config.json");
        assert_eq!(p["spatial_merge_size"], 2);
        assert_eq!(p["patch_size"], 14);
        assert_eq!(p["image_token"], "<|image_pad|>");
        assert_eq!(p["size"]["longest_edge"], 1540);
        assert_eq!(read("tokenizer_config.json")["chat_template"], "T");
        let pre = read("preprocessor_config.json");
        assert_eq!(pre["spatial_merge_size"], 2);
        // A checkpoint's own preprocessor file gets the merge size and a numeric patch size.
        std::fs::write(
            d.path().join("preprocessor_config.json"),
            r#"{"patch_size": {"height": 14, "width": 14}, "processor_class": "LightOnOCRProcessor"}"#,
        )
        .unwrap();
        complete(d.path(), &cfg).unwrap();
        adapt(d.path()).unwrap();
        let own = read("preprocessor_config.json");
        assert_eq!(
            (own["patch_size"].clone(), own["spatial_merge_size"].clone()),
            (json!(14), json!(2))
        );
        assert_eq!(own["processor_class"], "PixtralProcessor");
        // transformers.js has no LightOnOCR processor: its Pixtral one is named.
        assert_eq!(pre["processor_class"], "PixtralProcessor");
        assert_eq!(
            (p["image_break_token"].clone(), p["image_end_token"].clone()),
            (json!(""), json!(""))
        );
        // Given keys stay; a tokenizer without the image token is an error naming it.
        let given = json!({"image_token": "<img>", "spatial_merge_size": 3});
        std::fs::write(d.path().join("processor_config.json"), given.to_string()).unwrap();
        complete(d.path(), &cfg).unwrap();
        let p = read("processor_config.json");
        assert_eq!(
            (p["image_token"].clone(), p["spatial_merge_size"].clone()),
            (json!("<img>"), json!(3))
        );
        std::fs::write(d.path().join("processor_config.json"), "{}").unwrap();
        std::fs::write(
            d.path().join("tokenizer.json"),
            r#"{"model": {"vocab": {}}}"#,
        )
        .unwrap();
        let e = complete(d.path(), &cfg).unwrap_err().to_string();
        assert!(e.contains("tokenizer.json") && e.contains("151655"), "{e}");
    }

    #[test]
    fn config_gets_the_onnx_community_fields() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("config.json"),
            r#"{"model_type": "mistral3", "image_token_id": 10}"#,
        )
        .unwrap();
        let g = |file: &str, data: bool| GraphInfo {
            file: file.into(),
            data_file: data.then(|| format!("{file}_data")),
            data_bytes: 0,
            inputs: vec![],
            outputs: vec![],
            op_counts: Default::default(),
        };
        let (a, b) = (
            g("embed_tokens.onnx", false),
            g("decoder_model_merged_fp16.onnx", true),
        );
        adapt_config(
            d.path(),
            10,
            &[(Precision::Fp32, &a), (Precision::Fp16, &b)],
        )
        .unwrap();
        let c: Value =
            serde_json::from_str(&std::fs::read_to_string(d.path().join("config.json")).unwrap())
                .unwrap();
        assert_eq!(c["model_type"], "mistral3");
        assert_eq!(c["image_token_index"], 10);
        let js = &c["transformers.js_config"];
        assert_eq!(
            js["use_external_data_format"],
            json!({"decoder_model_merged_fp16.onnx": 1})
        );
        assert_eq!(js["kv_cache_dtype"], json!({"fp16": "float16"}));
    }
}
