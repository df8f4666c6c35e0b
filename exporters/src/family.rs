//! Which member of the LightOnOCR family a checkpoint is, read from the files its hub
//! repository ships, and the checks that keep its tokenizer and config consistent.
//!
//! One architecture (Pixtral vision + Qwen3 text), two generations of hub layout:
//! - **v1** (`lightonai/LightOnOCR-1B-1025`, and the pruned vocabularies
//!   `LightOnOCR-0.9B-32k-1025` / `-16k-1025`): saved by transformers 4.x. `config.json`
//!   has `rope_theta` flat only (no `rope_parameters`), no top-level `eos_token_id` /
//!   `pad_token_id`; the image settings are in `preprocessor_config.json` and
//!   `processor_config.json` holds the processor keys alone; `tokenizer_config.json` has no
//!   chat template (it is in `chat_template.jinja`). The pruned models go further: the image
//!   token is `image_token_index` (7: their special tokens take ids 0..7), no tie flag (an
//!   `lm_head.weight` of their own: 1 768 379 070 bytes stored for the 16k model is the untied
//!   size plus the same 1.14 MB of other files as the 32k model's),
//!   `generation_config.json` holds eos 1 alone, Pixtral's break/end token is `<|box_end|>`
//!   and the chat template is Qwen2-VL's (rendered as shipped).
//! - **v2** (`lightonai/LightOnOCR-2-1B` and its -base, -bbox, -soup siblings): saved by
//!   transformers 5. `rope_theta` both flat and in `rope_parameters`, top-level eos/pad ids,
//!   the image settings nested in `processor_config.json`'s `image_processor`.
//!
//! The graphs are the same for both; the vocabulary size (151 936, or 32 768 / 16 384 for
//! the pruned models) comes from `config.json` and must cover every id of `tokenizer.json`.

use crate::config::{Flavour, ModelConfig};
use crate::ExportError;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;

/// Qwen's full vocabulary (config `vocab_size` of LightOnOCR-1B-1025 and -2-1B).
pub const FULL_VOCAB: usize = 151_936;

/// The hub layout generation of a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Generation {
    /// LightOnOCR-1B-1025 and the pruned 0.9B models (transformers 4.x layout).
    V1,
    /// LightOnOCR-2-1B and its siblings (transformers 5 layout).
    V2,
    /// Re-saved by transformers ≥ 5 as `model_type: lighton_ocr`: the generation is not
    /// recorded in the files.
    Unknown,
}

/// The family member an export was made from (`ocrctl.json`'s `variant`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Variant {
    pub generation: Generation,
    /// `text_config.vocab_size`: rows of the embedding and columns of the logits.
    pub vocab_size: usize,
    /// Entries of `tokenizer.json` (vocabulary and added tokens); `None` without one.
    pub tokenizer_size: Option<usize>,
    /// `OWNER/NAME` when the checkpoint is a snapshot in the Hugging Face cache.
    pub repo: Option<String>,
    /// What `doctor` and the logs print, e.g. "LightOnOCR v1 (1B-1025), vocabulary 151 936".
    pub name: String,
}

impl Variant {
    /// The variant of the checkpoint in `dir` (already parsed into `cfg`).
    pub fn detect(dir: &Path, cfg: &ModelConfig) -> Result<Variant, ExportError> {
        let cfg_path = dir.join("config.json");
        let raw: Value = read_json(&cfg_path)?;
        let repo = repo_of(dir);
        let generation = match repo.as_deref().and_then(generation_of_repo) {
            Some(g) => g,
            None => generation_of_files(&raw, dir, cfg.flavour),
        };
        let tok = dir.join("tokenizer.json");
        let tokenizer_size = match tok.is_file() {
            true => Some(Tokens::read(&tok)?.check_fits(&tok, cfg)?),
            false => None,
        };
        Ok(Variant::new(
            generation,
            cfg.text.vocab_size,
            tokenizer_size,
            repo,
        ))
    }

    /// A variant from its parts, with its display name.
    pub fn new(
        generation: Generation,
        vocab_size: usize,
        tokenizer_size: Option<usize>,
        repo: Option<String>,
    ) -> Variant {
        let name = display_name(generation, vocab_size, repo.as_deref());
        Variant {
            generation,
            vocab_size,
            tokenizer_size,
            repo,
            name,
        }
    }
}

/// `OWNER/NAME` of a hub-cache snapshot folder (`…/models--OWNER--NAME/snapshots/COMMIT`).
pub fn repo_of(dir: &Path) -> Option<String> {
    let dir = dir.canonicalize().ok()?;
    let snapshots = dir.parent()?;
    if snapshots.file_name()? != "snapshots" {
        return None;
    }
    let repo = snapshots.parent()?.file_name()?.to_str()?;
    let (owner, name) = repo.strip_prefix("models--")?.split_once("--")?;
    Some(format!("{owner}/{name}"))
}

fn generation_of_repo(repo: &str) -> Option<Generation> {
    let name = repo.rsplit('/').next()?.to_ascii_lowercase();
    if name.starts_with("lightonocr-2-") {
        Some(Generation::V2)
    } else if name.starts_with("lightonocr-1b-") || name.starts_with("lightonocr-0.9b-") {
        Some(Generation::V1)
    } else {
        None
    }
}

/// The context length tells the generations apart whoever saved the files (v1 and the
/// pruned models: 8192 positions; LightOnOCR-2: 16384); other lengths (fine-tunes, fixtures)
/// go by the layout: v2 was saved by transformers 5 (`rope_parameters`, a nested
/// `image_processor`), v1 by 4.x.
fn generation_of_files(raw: &Value, dir: &Path, flavour: Flavour) -> Generation {
    match raw["text_config"]["max_position_embeddings"].as_u64() {
        Some(8192) => return Generation::V1,
        Some(16384) => return Generation::V2,
        _ => {}
    }
    if flavour == Flavour::Transformers {
        return Generation::Unknown;
    }
    let nested_rope = raw["text_config"].get("rope_parameters").is_some();
    let nested_processor = read_json(&dir.join("processor_config.json"))
        .map(|p| p.get("image_processor").is_some_and(Value::is_object))
        .unwrap_or(false);
    if nested_rope || nested_processor {
        Generation::V2
    } else {
        Generation::V1
    }
}

/// "LightOnOCR v1 pruned 16k (0.9B-16k-1025), vocabulary 16 384".
pub fn display_name(generation: Generation, vocab: usize, repo: Option<&str>) -> String {
    let gen = match generation {
        Generation::V1 => " v1",
        Generation::V2 => " v2",
        Generation::Unknown => "",
    };
    let pruned = match vocab < FULL_VOCAB && vocab.is_multiple_of(1024) {
        true => format!(" pruned {}k", vocab / 1024),
        false => String::new(),
    };
    let model = match repo {
        Some(r) => Some(
            r.rsplit('/')
                .next()
                .unwrap_or(r)
                .trim_start_matches("LightOnOCR-")
                .to_string(),
        ),
        None => match (generation, vocab) {
            (Generation::V1, FULL_VOCAB) => Some("1B-1025".into()),
            (Generation::V1, 32_768) => Some("0.9B-32k-1025".into()),
            (Generation::V1, 16_384) => Some("0.9B-16k-1025".into()),
            (Generation::V2, FULL_VOCAB) => Some("2-1B family".into()),
            _ => None,
        },
    };
    let model = model.map(|m| format!(" ({m})")).unwrap_or_default();
    format!(
        "LightOnOCR{gen}{pruned}{model}, vocabulary {}",
        thousands(vocab)
    )
}

/// 151936 → "151 936" (a thin grouping that reads the same in every locale).
fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

fn read_json(path: &Path) -> Result<Value, ExportError> {
    let text = std::fs::read_to_string(path).map_err(|e| ExportError::io(path, e))?;
    serde_json::from_str(&text)
        .map_err(|e| ExportError::config(path, format!("not valid JSON: {e}")))
}

/// The ids of a `tokenizer.json`: its model's vocabulary and its added tokens.
pub struct Tokens {
    by_id: std::collections::BTreeMap<u32, String>,
}

impl Tokens {
    /// Reads `model.vocab` (an object token → id) and `added_tokens` of `path`.
    pub fn read(path: &Path) -> Result<Tokens, ExportError> {
        let v = read_json(path)?;
        let mut by_id = std::collections::BTreeMap::new();
        if let Some(vocab) = v["model"]["vocab"].as_object() {
            for (tok, id) in vocab {
                let id = id.as_u64().ok_or_else(|| {
                    ExportError::config(path, format!("field `model.vocab.{tok}`: not an id"))
                })?;
                by_id.insert(id as u32, tok.clone());
            }
        }
        for t in v["added_tokens"].as_array().into_iter().flatten() {
            if let (Some(id), Some(s)) = (t["id"].as_u64(), t["content"].as_str()) {
                by_id.insert(id as u32, s.to_string());
            }
        }
        Ok(Tokens { by_id })
    }

    /// The token string of `id`, if the tokenizer has it.
    pub fn token(&self, id: u32) -> Option<&str> {
        self.by_id.get(&id).map(String::as_str)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// True without any entry.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// The entry count, after checking that every id has a row in the embedding (a pruned
    /// config with the full tokenizer, or the reverse, would read out of range or produce
    /// ids without text) and that the image token is there.
    pub fn check_fits(&self, path: &Path, cfg: &ModelConfig) -> Result<usize, ExportError> {
        let vocab = cfg.text.vocab_size;
        if let Some((&id, tok)) = self.by_id.last_key_value() {
            if id as usize >= vocab {
                return Err(ExportError::config(
                    path,
                    format!(
                        "token {tok:?} has id {id}, outside config.json's \
                         text_config.vocab_size {vocab}: the tokenizer and the config are of \
                         different vocabularies"
                    ),
                ));
            }
        }
        if self.token(cfg.image_token_id).is_none() {
            return Err(ExportError::config(
                path,
                format!(
                    "no token with config.json's image_token_id {}",
                    cfg.image_token_id
                ),
            ));
        }
        Ok(self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_say_generation_pruning_and_model() {
        assert_eq!(
            display_name(Generation::V1, FULL_VOCAB, None),
            "LightOnOCR v1 (1B-1025), vocabulary 151 936"
        );
        assert_eq!(
            display_name(Generation::V1, 16_384, None),
            "LightOnOCR v1 pruned 16k (0.9B-16k-1025), vocabulary 16 384"
        );
        assert_eq!(
            display_name(Generation::V1, 32_768, None),
            "LightOnOCR v1 pruned 32k (0.9B-32k-1025), vocabulary 32 768"
        );
        assert_eq!(
            display_name(
                Generation::V2,
                FULL_VOCAB,
                Some("lightonai/LightOnOCR-2-1B-bbox")
            ),
            "LightOnOCR v2 (2-1B-bbox), vocabulary 151 936"
        );
        assert_eq!(
            display_name(Generation::V2, 384, None),
            "LightOnOCR v2, vocabulary 384"
        );
        assert_eq!(
            display_name(Generation::Unknown, 1000, None),
            "LightOnOCR, vocabulary 1 000"
        );
    }

    /// `tests/fixtures/family/hub-v1`: the JSON files of lightonai/LightOnOCR-1B-1025.
    fn hub_v1() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/family/hub-v1")
    }

    #[test]
    fn the_v1_hub_config_is_v2s_model_but_for_positions_and_eos() {
        let dir = hub_v1();
        let v1 = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        let mut v2 = ModelConfig::from_json(
            &serde_json::from_str(crate::config::LIGHTONOCR_2_1B_CONFIG).unwrap(),
            Path::new("config.json"),
        )
        .unwrap();
        // v1 has no top-level eos/pad ids (generation_config.json has them) and 8192
        // positions instead of 16384; every shape, θ and epsilon is the same.
        assert_eq!(
            (v2.text.max_position_embeddings, v2.eos_token_ids.clone()),
            (16384, vec![151645])
        );
        v2.text.max_position_embeddings = 8192;
        v2.eos_token_ids.clear();
        v2.pad_token_id = None;
        assert_eq!(v1, v2);
        let v = Variant::detect(&dir, &v1).unwrap();
        assert_eq!(v.generation, Generation::V1);
        assert_eq!(v.name, "LightOnOCR v1 (1B-1025), vocabulary 151 936");
        assert_eq!(v.tokenizer_size, None);
    }

    /// `tests/fixtures/family/hub-0.9B-16k`: lightonai/LightOnOCR-0.9B-16k-1025's JSON files:
    /// `image_token_index` 7 (its special tokens come first), no tie flag (untied), the same
    /// shapes as v1 with 16 384 rows.
    #[test]
    fn the_pruned_hub_config_reads_as_v1_with_its_vocabulary() {
        let dir =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/family/hub-0.9B-16k");
        let pruned = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        let mut v1 = ModelConfig::from_file(&hub_v1().join("config.json")).unwrap();
        assert_eq!((pruned.image_token_id, pruned.text.vocab_size), (7, 16384));
        v1.image_token_id = 7;
        v1.text.vocab_size = 16384;
        // No tie flag: an lm_head of its own, as transformers reads it.
        assert!(!pruned.text.tie_word_embeddings);
        v1.text.tie_word_embeddings = false;
        assert_eq!(pruned, v1);
        let v = Variant::detect(&dir, &pruned).unwrap();
        assert_eq!(v.generation, Generation::V1);
        assert_eq!(
            v.name,
            "LightOnOCR v1 pruned 16k (0.9B-16k-1025), vocabulary 16 384"
        );
    }

    #[test]
    fn generation_follows_the_context_length_then_the_layout() {
        let d = tempfile::tempdir().unwrap();
        let v2: Value = serde_json::from_str(crate::config::LIGHTONOCR_2_1B_CONFIG).unwrap();
        let v1: Value =
            serde_json::from_str(&std::fs::read_to_string(hub_v1().join("config.json")).unwrap())
                .unwrap();
        let gen = |v: &Value, f| generation_of_files(v, d.path(), f);
        assert_eq!(gen(&v2, Flavour::Hub), Generation::V2);
        assert_eq!(gen(&v1, Flavour::Hub), Generation::V1);
        // Re-saved by transformers 5: the positions still tell.
        let mut resaved = v1.clone();
        resaved["model_type"] = "lighton_ocr".into();
        resaved["text_config"]["rope_parameters"] = serde_json::json!({"rope_theta": 1e6});
        assert_eq!(gen(&resaved, Flavour::Transformers), Generation::V1);
        // Other lengths: the layout.
        let mut other = v1.clone();
        other["text_config"]["max_position_embeddings"] = 4096.into();
        assert_eq!(gen(&other, Flavour::Hub), Generation::V1);
        assert_eq!(gen(&other, Flavour::Transformers), Generation::Unknown);
        std::fs::write(
            d.path().join("processor_config.json"),
            r#"{"image_processor": {}}"#,
        )
        .unwrap();
        assert_eq!(gen(&other, Flavour::Hub), Generation::V2);
    }

    #[test]
    fn a_tokenizer_beyond_the_vocabulary_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let cfg = ModelConfig::from_file(&hub_v1().join("config.json")).unwrap();
        let tok = d.path().join("tokenizer.json");
        let write = |max: u32| {
            let v = serde_json::json!({"model": {"vocab": {"a": 0, "b": max}},
                "added_tokens": [{"id": 151655, "content": "<|image_pad|>"}]});
            std::fs::write(&tok, v.to_string()).unwrap();
        };
        write(151935);
        assert_eq!(
            Tokens::read(&tok).unwrap().check_fits(&tok, &cfg).unwrap(),
            3
        );
        write(151936);
        let e = Tokens::read(&tok)
            .unwrap()
            .check_fits(&tok, &cfg)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tokenizer.json") && e.contains("vocab_size 151936"),
            "{e}"
        );
        let mut small = cfg.clone();
        small.image_token_id = 7;
        write(10);
        let e = Tokens::read(&tok)
            .unwrap()
            .check_fits(&tok, &small)
            .unwrap_err()
            .to_string();
        assert!(e.contains("image_token_id 7"), "{e}");
    }

    #[test]
    fn the_repo_is_read_from_a_hub_cache_path_and_decides_the_generation() {
        let root = tempfile::tempdir().unwrap();
        let snap = root
            .path()
            .join("models--lightonai--LightOnOCR-0.9B-16k-1025/snapshots/abc");
        std::fs::create_dir_all(&snap).unwrap();
        let repo = repo_of(&snap).unwrap();
        assert_eq!(repo, "lightonai/LightOnOCR-0.9B-16k-1025");
        assert_eq!(generation_of_repo(&repo), Some(Generation::V1));
        assert_eq!(
            generation_of_repo("lightonai/LightOnOCR-2-1B-ocr-soup"),
            Some(Generation::V2)
        );
        assert_eq!(generation_of_repo("me/my-ocr"), None);
        assert_eq!(repo_of(root.path()), None);
    }
}
