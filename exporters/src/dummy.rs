//! Random weights with the real shapes (`--checkpoint dummy:lightonocr-2-1b`), like vLLM's
//! `--load-format dummy`: speed and memory can be measured without the hub checkpoint.
//!
//! Weights are deterministic per tensor name (a hash seeds a xorshift generator), uniform
//! with standard deviation 0.02; norm scales are 1. The tokenizer is byte-level with filler
//! entries up to the real special-token ids (151643…), so prompts have the real layout.

use crate::checkpoint::Weights;
use crate::config::{ModelConfig, LIGHTONOCR_2_1B_CONFIG};
use crate::ExportError;
use serde_json::{json, Value};
use std::path::Path;

/// Names accepted after `dummy:`: the real model's shapes, and a tiny one for smoke tests.
pub const DUMMY_MODELS: &[&str] = &["lightonocr-2-1b", "tiny"];

/// A tiny LightOnOCR-shaped config (special ids from 300) for fast smoke tests.
pub const TINY_CONFIG: &str = include_str!("tiny.config.json");

/// The real chat template of LightOnOCR-2-1B (from its `tokenizer_config.json`).
pub const CHAT_TEMPLATE: &str = include_str!("lightonocr.chat_template.jinja");

/// Qwen2/3 special tokens starting at id 151643, in id order.
pub const QWEN_SPECIAL_TOKENS: &[&str] = &[
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
];

/// Random weights; any requested tensor exists with the requested shape.
pub struct DummyWeights;

fn seed_of(name: &str) -> u64 {
    // FNV-1a, then never zero (xorshift's fixed point).
    let mut h: u64 = 0xcbf29ce484222325;
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h | 1
}

impl Weights for DummyWeights {
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ExportError> {
        let n: usize = shape.iter().product();
        if name.ends_with("norm.weight")
            || name.ends_with("ln_pre.weight")
            || name.ends_with("layernorm.weight")
        {
            return Ok(vec![1.0; n]);
        }
        let amp = 0.02f32 * 3f32.sqrt();
        let mut s = seed_of(name);
        Ok((0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
                (2.0 * u - 1.0) * amp
            })
            .collect())
    }

    fn contains(&self, name: &str) -> bool {
        name != "lm_head.weight"
    }

    fn source_dtype(&self) -> String {
        "random".into()
    }
}

/// GPT-2's byte → printable character map used by byte-level BPE.
pub fn byte_to_char() -> Vec<char> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32).collect();
    printable.extend(0xA1..=0xAC);
    printable.extend(0xAE..=0xFF);
    let mut map = vec!['\0'; 256];
    let mut extra = 0;
    for b in 0..256u32 {
        map[b as usize] = if printable.contains(&b) {
            char::from_u32(b).unwrap()
        } else {
            extra += 1;
            char::from_u32(255 + extra).unwrap()
        };
    }
    map
}

/// Writes `config.json`, `tokenizer.json`, `tokenizer_config.json`,
/// `generation_config.json` and `processor_config.json` of the dummy model into `dir`.
pub fn write_files(name: &str, dir: &Path) -> Result<ModelConfig, ExportError> {
    if !DUMMY_MODELS.contains(&name) {
        return Err(ExportError::Invalid(format!(
            "unknown dummy model `dummy:{name}` (known: {})",
            DUMMY_MODELS
                .iter()
                .map(|m| format!("dummy:{m}"))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let cfg_path = dir.join("config.json");
    let cfg_text = if name == "tiny" {
        TINY_CONFIG
    } else {
        LIGHTONOCR_2_1B_CONFIG
    };
    let cfg_json: Value = serde_json::from_str(cfg_text).expect("embedded config is valid JSON");
    let cfg = ModelConfig::from_json(&cfg_json, &cfg_path)?;
    let first_special = cfg.pad_token_id.unwrap_or(151643) as usize;
    let mut vocab = serde_json::Map::new();
    for (i, c) in byte_to_char().into_iter().enumerate() {
        vocab.insert(c.to_string(), json!(i));
    }
    for i in 256..first_special {
        vocab.insert(format!("<|dummy_{i}|>"), json!(i));
    }
    let added: Vec<Value> = QWEN_SPECIAL_TOKENS
        .iter()
        .enumerate()
        .map(|(k, t)| {
            json!({"id": first_special + k, "content": t, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": []}
    });
    let tok_config = json!({
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": null,
        "image_token": "<|image_pad|>", "chat_template": CHAT_TEMPLATE,
    });
    let eos: Vec<u32> = vec![first_special as u32 + 2, first_special as u32];
    let gen = json!({"do_sample": true, "temperature": 0.2, "top_p": 0.9, "top_k": 0,
                     "bos_token_id": first_special, "pad_token_id": first_special, "eos_token_id": eos});
    let proc = json!({"image_processor_type": "PixtralImageProcessor", "size": {"longest_edge": 1540},
                      "patch_size": 14, "resample": 3, "do_rescale": true, "rescale_factor": 1.0 / 255.0,
                      "do_normalize": true, "image_mean": [0.48145466, 0.4578275, 0.40821073],
                      "image_std": [0.26862954, 0.26130258, 0.27577711], "do_convert_rgb": true});
    for (file, v) in [
        ("tokenizer.json", &tokenizer),
        ("tokenizer_config.json", &tok_config),
        ("generation_config.json", &gen),
        ("processor_config.json", &proc),
    ] {
        let p = dir.join(file);
        std::fs::write(&p, serde_json::to_vec(v).expect("JSON"))
            .map_err(|e| ExportError::io(&p, e))?;
    }
    std::fs::write(&cfg_path, cfg_text).map_err(|e| ExportError::io(&cfg_path, e))?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dummy_weights_are_deterministic_and_scaled() {
        let a = DummyWeights.get("x.q_proj.weight", &[64, 64]).unwrap();
        let b = DummyWeights.get("x.q_proj.weight", &[64, 64]).unwrap();
        assert_eq!(a, b);
        let std = (a.iter().map(|v| v * v).sum::<f32>() / a.len() as f32).sqrt();
        assert!((std - 0.02).abs() < 0.002, "{std}");
        assert!(DummyWeights
            .get("l.input_layernorm.weight", &[4])
            .unwrap()
            .iter()
            .all(|v| *v == 1.0));
    }

    #[test]
    fn byte_map_is_a_bijection() {
        let m = byte_to_char();
        let mut s: Vec<char> = m.clone();
        s.sort();
        s.dedup();
        assert_eq!(s.len(), 256);
        assert_eq!(m[b'a' as usize], 'a');
        assert_eq!(m[b' ' as usize], 'Ġ');
    }
}
