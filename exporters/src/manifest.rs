//! `ocrctl.json`, the manifest of an export: what was exported, from which checkpoint files,
//! with which settings, every graph's I/O contract, and the size and digest of every file the
//! export wrote.

use crate::config::ModelConfig;
use crate::export::{Precision, MANIFEST};
use crate::graph::GraphInfo;
use crate::layers::{Quant, Target};
use crate::ExportError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// One source file's identity in the manifest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SourceFile {
    pub name: String,
    pub bytes: u64,
    pub sha256: String,
}

/// `ocrctl.json`: what was exported, from what, and the graphs' I/O contract.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub ocrctl_version: String,
    pub source: String,
    pub source_dtype: String,
    pub source_files: Vec<SourceFile>,
    /// sha256 over the source files' digests, in name order.
    pub checkpoint_digest: String,
    pub target: Target,
    pub ir_version: i64,
    pub opset: i64,
    pub precisions: Vec<Precision>,
    /// INT4 settings, when an int4 precision was exported.
    pub int4: Option<Quant>,
    /// AWQ-style scale choices per Linear group, when calibrated (`None`: round-to-nearest).
    #[serde(default)]
    pub awq: Option<Vec<crate::awq::GroupChoice>>,
    pub model: ModelConfig,
    /// The family member exported (exports before it was recorded: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<crate::family::Variant>,
    /// precision → part (`vision_encoder`, `embed_tokens`, `decoder_model_merged`) → graph.
    pub graphs: BTreeMap<Precision, BTreeMap<String, GraphInfo>>,
    /// Size and sha256 of every file the export wrote but this manifest (names relative to
    /// the export, `/`-separated), checked before loading (see [`crate::verify`]). Empty
    /// in exports made before it was recorded.
    #[serde(default)]
    pub files: Vec<SourceFile>,
    /// The GQA decoder's KV cache type (`--kv-cache`; exports before it: the activation
    /// type). The runtime reads the type from the graph's inputs; this says how it was made.
    #[serde(default, skip_serializing_if = "is_activation")]
    pub kv_cache: crate::kv_cache::KvCache,
    /// The 8-bit cache's scale per decoder layer when calibrated (`kv_cache` then holds the
    /// largest); empty: `kv_cache`'s scale serves every layer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kv_layer_scales: Vec<f32>,
    /// Engines built ahead of time by `ocrctl build-engines`, by profile name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub engines: BTreeMap<String, crate::engines::EngineSet>,
}

fn is_activation(k: &crate::kv_cache::KvCache) -> bool {
    *k == crate::kv_cache::KvCache::Activation
}

impl Manifest {
    /// Reads `<dir>/ocrctl.json`. A `dir` that is not an export gets an error that says what
    /// it is (missing, a file, a checkpoint, another folder) and what to run.
    pub fn load(dir: &Path) -> Result<Manifest, ExportError> {
        let p = dir.join(MANIFEST);
        if !p.is_file() {
            return Err(ExportError::Invalid(not_an_export(dir)));
        }
        let text = std::fs::read_to_string(&p).map_err(|e| ExportError::io(&p, e))?;
        serde_json::from_str(&text)
            .map_err(|e| ExportError::config(&p, format!("not an ocrctl manifest: {e}")))
    }

    /// Writes the manifest back to `<dir>/ocrctl.json` (through a temporary file, so a reader
    /// never sees half of it).
    pub fn save(&self, dir: &Path) -> Result<(), ExportError> {
        let p = dir.join(MANIFEST);
        let tmp = dir.join(format!(".{MANIFEST}.{}", std::process::id()));
        let text = serde_json::to_string_pretty(self).expect("manifest serialises");
        std::fs::write(&tmp, text).map_err(|e| ExportError::io(&tmp, e))?;
        std::fs::rename(&tmp, &p).map_err(|e| ExportError::io(&p, e))
    }

    /// The recorded digest of graph `file` (under `onnx/`) together with its external data
    /// `data_file`: sha256 over both recorded sha256s. `None` when the export recorded none.
    pub fn graph_digest(&self, file: &str, data_file: Option<&str>) -> Option<String> {
        use sha2::{Digest, Sha256};
        let find = |name: &str| {
            let rel = format!("onnx/{name}");
            self.files
                .iter()
                .find(|f| f.name == rel)
                .map(|f| f.sha256.clone())
        };
        let mut h = Sha256::new();
        h.update(find(file)?.as_bytes());
        if let Some(d) = data_file {
            h.update(find(d)?.as_bytes());
        }
        Some(format!("{:x}", h.finalize()))
    }
}

/// An export beside a `dir` that does not exist whose name is within two edits of it
/// (`model-int4` for `model-in4`).
fn nearest_export(dir: &Path) -> Option<std::path::PathBuf> {
    let name = dir.file_name()?.to_str()?;
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::read_dir(parent)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join(MANIFEST).is_file())
        .filter_map(|e| {
            let n = e.file_name().to_str()?.to_string();
            Some((edit_distance(name, &n), n))
        })
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, n)| dir.with_file_name(n))
}

/// Levenshtein distance between `a` and `b` (characters inserted, removed or replaced).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let here = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(here + 1);
            prev = here;
        }
    }
    row[b.len()]
}

/// Why `dir` is not an export, and what to do about it.
fn not_an_export(dir: &Path) -> String {
    let d = dir.display();
    let export = format!("ocrctl export --checkpoint CHECKPOINT --out {d}");
    if !dir.exists() {
        let hint = nearest_export(dir).map_or(String::new(), |n| {
            format!(" (did you mean {}?)", n.display())
        });
        format!("{d}: no such directory{hint}; --model takes a folder written by `{export}`")
    } else if !dir.is_dir() {
        format!("{d} is a file; --model takes the folder an export wrote (`{export}`)")
    } else if dir.join("config.json").is_file()
        && std::fs::read_dir(dir).is_ok_and(|mut it| {
            it.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".safetensors")))
        })
    {
        format!(
            "{d} is a checkpoint, not an export: run `ocrctl export --checkpoint {d} --out OUT` \
             first, then pass --model OUT"
        )
    } else {
        format!("{d} is not an ocrctl export (it has no {MANIFEST}); make one with `{export}`")
    }
}

#[cfg(test)]
mod suggest_tests {
    use super::*;

    #[test]
    fn a_missing_model_folder_names_the_export_beside_it_that_it_is_close_to() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("model-int4")).unwrap();
        std::fs::write(t.path().join("model-int4").join(MANIFEST), "{}").unwrap();
        std::fs::create_dir(t.path().join("model-int8")).unwrap(); // not an export
        let e = not_an_export(&t.path().join("model-in4"));
        let want = format!("(did you mean {}?)", t.path().join("model-int4").display());
        assert!(e.contains(&want), "{e}");
        let far = not_an_export(&t.path().join("elsewhere"));
        assert!(!far.contains("did you mean"), "{far}");
        assert_eq!(edit_distance("16g", "16gb"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
