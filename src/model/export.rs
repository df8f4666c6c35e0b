//! An export directory opened once: [`Export::open`] reads `ocrctl.json` (the manifest and the
//! model's normalised config), `generation_config.json`, the processor settings and the
//! tokenizer with its chat template, and the value is then handed to whatever runs the
//! export (the runtime's sessions, the page pipeline, the server, the commands), so that no
//! part reads the folder again.
//!
//! ```no_run
//! use ocrctl::model::export::Export;
//! let export = Export::open(std::path::Path::new("out/tiny"))?;
//! println!("{} (stop ids {:?})", export.manifest.source, export.stop_ids);
//! # Ok::<(), anyhow::Error>(())
//! ```

use crate::model::preprocess::{PreprocessConfig, PreprocessError};
use crate::model::prompt::{PromptError, Prompter};
use ocrctl_exporters::config::ModelConfig;
use ocrctl_exporters::export::Manifest;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The file of an export's (and a checkpoint's) generation settings.
pub const GENERATION_CONFIG: &str = "generation_config.json";

/// Why an export directory could not be opened. Each error names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// No readable `ocrctl.json` (not an export, a checkpoint, a missing folder...).
    #[error(transparent)]
    Manifest(#[from] ocrctl_exporters::ExportError),
    #[error(transparent)]
    Prompt(#[from] PromptError),
    #[error(transparent)]
    Preprocess(#[from] PreprocessError),
    /// `generation_config.json` is unreadable or not JSON.
    #[error("{0}")]
    GenerationConfig(String),
}

/// Everything of an export that is read from its folder (see the module documentation).
#[derive(Debug)]
pub struct Export {
    /// The folder, for the graphs' files the runtime opens itself.
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// `generation_config.json`, when the export has one (its sampling defaults are read from
    /// it by [`crate::generation::pipeline::PagePipeline`]).
    pub generation_config: Option<Value>,
    /// End-of-sequence ids: `generation_config.json`'s `eos_token_id`, else the config's.
    pub stop_ids: Vec<u32>,
    /// Image preprocessing as the export's processor files describe it.
    pub preprocess: PreprocessConfig,
    /// Chat template and tokenizer; shared with the threads that detokenise.
    pub prompter: Arc<Prompter>,
}

impl Export {
    /// Reads the export in `dir`: the manifest first (so that a wrong folder is named as
    /// such before anything else is looked for), then the files the page recipe needs.
    pub fn open(dir: &Path) -> Result<Export, OpenError> {
        let manifest = Manifest::load(dir)?;
        let cfg = &manifest.model;
        let generation_config = read_generation_config(dir)?;
        Ok(Export {
            stop_ids: stop_ids(generation_config.as_ref(), &cfg.eos_token_ids),
            preprocess: PreprocessConfig::for_model(dir, cfg)?,
            prompter: Arc::new(Prompter::from_model_dir(dir, cfg.image_token_id)?),
            generation_config,
            dir: dir.to_path_buf(),
            manifest,
        })
    }

    /// The model's normalised configuration (from the manifest).
    pub fn config(&self) -> &ModelConfig {
        &self.manifest.model
    }

    /// Where `generation_config.json` is (for messages about it).
    pub fn generation_config_path(&self) -> PathBuf {
        self.dir.join(GENERATION_CONFIG)
    }
}

/// `generation_config.json` of `dir` parsed, `None` when there is none; errors name the file.
fn read_generation_config(dir: &Path) -> Result<Option<Value>, OpenError> {
    let path = dir.join(GENERATION_CONFIG);
    match std::fs::read_to_string(&path) {
        Ok(t) => serde_json::from_str(&t).map(Some).map_err(|e| {
            OpenError::GenerationConfig(format!("{}: invalid JSON: {e}", path.display()))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(OpenError::GenerationConfig(format!(
            "{}: {e}",
            path.display()
        ))),
    }
}

/// Stop ids: the generation config's `eos_token_id` (a number or a list) when it has one,
/// else `fallback` (the model config's).
pub fn stop_ids(generation_config: Option<&Value>, fallback: &[u32]) -> Vec<u32> {
    let from_gen = generation_config.and_then(|v| match v.get("eos_token_id") {
        Some(Value::Array(a)) => Some(
            a.iter()
                .filter_map(|x| x.as_u64().map(|n| n as u32))
                .collect(),
        ),
        Some(x) => x.as_u64().map(|n| vec![n as u32]),
        None => None,
    });
    from_gen
        .filter(|v: &Vec<u32>| !v.is_empty())
        .unwrap_or_else(|| fallback.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stop_ids_come_from_the_generation_config_else_the_model_config() {
        let fallback = [2u32];
        assert_eq!(stop_ids(Some(&json!({"eos_token_id": 7})), &fallback), [7]);
        assert_eq!(
            stop_ids(Some(&json!({"eos_token_id": [7, 8]})), &fallback),
            [7, 8]
        );
        assert_eq!(stop_ids(Some(&json!({"eos_token_id": []})), &fallback), [2]);
        assert_eq!(stop_ids(Some(&json!({})), &fallback), [2]);
        assert_eq!(stop_ids(None, &fallback), [2]);
    }

    #[test]
    fn a_folder_that_is_not_an_export_is_named_before_anything_else() {
        let d = tempfile::tempdir().unwrap();
        let e = Export::open(d.path()).unwrap_err();
        assert!(matches!(e, OpenError::Manifest(_)), "{e}");
        assert!(e.to_string().contains("ocrctl.json"), "{e}");
    }
}
