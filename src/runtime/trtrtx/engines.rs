//! Prebuilt TensorRT-RTX engines: what a profile asks to build ([`BuildSpec`]) and whether a
//! recorded engine set still fits it ([`check`]), with the reason when it does not.
//!
//! An engine is specific to the graph it was built from, the shape ranges of the profile,
//! the TensorRT-RTX release and the GPU architectures it targets. The export's manifest keeps
//! one [`EngineSet`] per profile; [`check`] compares each of those against what is there now,
//! so a runner never loads an engine built for other graphs or other shapes.

use crate::profile::{trt_shapes, ModelDims, Profile};
use ocrctl_exporters::contract::graph;
use ocrctl_exporters::engines::EngineSet;
use ocrctl_exporters::export::{Manifest, Precision};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Why a profile has no [`BuildSpec`] for an export.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The profile (its name) has no `tensorrt_rtx` section.
    #[error("profile {0} has no tensorrt_rtx section (the 16gb and 24gb profiles have one)")]
    NoSection(String),
    #[error(
        "the export is --target ort (contrib ops TensorRT-RTX cannot parse); export \
         with --target tensorrt for engines"
    )]
    OrtTarget,
    /// The export lacks the profile's precision.
    #[error(
        "the export has no {precision} graphs, which profile {profile} runs (export with \
         --precision {precision})"
    )]
    NoPrecision {
        precision: &'static str,
        profile: String,
    },
    /// The export lacks a graph (its part).
    #[error("the export has no {0} graph")]
    NoGraph(&'static str),
    /// The manifest has no digest of a graph (its file name).
    #[error(
        "the manifest records no digest of onnx/{0} (an export older than the \
         digests; export again)"
    )]
    NoDigest(String),
}

/// Why a recorded engine set does not fit a [`BuildSpec`]: the first thing that differs.
#[derive(Debug, thiserror::Error)]
pub enum Mismatch {
    /// No set for the profile; `model` is the export's folder, for the command to build one.
    #[error(
        "no engines were built for profile {profile} (ocrctl build-engines --model {} --profile \
         {profile})",
        .model.display()
    )]
    NotBuilt { profile: String, model: PathBuf },
    #[error(
        "the engines were built with TensorRT-RTX {built} and the plugin bundles {runtime}; \
         build them again with the same release"
    )]
    Release { built: String, runtime: String },
    /// The profile's values changed (its name).
    #[error(
        "profile {0}'s shape ranges, precision, targets or workspace changed since the \
         engines were built"
    )]
    ProfileChanged(String),
    /// No engine for a graph (its part).
    #[error("no engine was built for {0}")]
    NoEngine(String),
    /// A source graph (its path in the export) changed.
    #[error("{0} changed since its engine was built")]
    SourceChanged(String),
    /// An engine file cannot be read.
    #[error("{}: {err}", .path.display())]
    Unreadable { path: PathBuf, err: std::io::Error },
    /// An engine file's size differs from the recorded one.
    #[error("{}: {len} bytes, {built} were built", .path.display())]
    Size { path: PathBuf, len: u64, built: u64 },
}

/// Why an EPContext model is not what the runner expects.
#[derive(Debug, thiserror::Error)]
pub enum ContextModelError {
    #[error("{}: {err}", .path.display())]
    Unreadable { path: PathBuf, err: std::io::Error },
    #[error("{}: not an ONNX model", .0.display())]
    NotOnnx(PathBuf),
    #[error("{}: has no node", .0.display())]
    NoNode(PathBuf),
    /// A node (its `domain.op_type`) that is not an EPContext node.
    #[error(
        "{}: holds a {node} node; an EPContext model holds EPContext nodes only",
        .path.display()
    )]
    OtherNode { path: PathBuf, node: String },
    /// Initializers (their number).
    #[error(
        "{}: holds {count} initializers; the weights belong in the engine",
        .path.display()
    )]
    Weights { path: PathBuf, count: usize },
}

/// One graph to build.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GraphSpec {
    /// `vision_encoder`, `embed_tokens` or `decoder_model_merged`.
    pub part: String,
    /// The graph's file stem (`decoder_model_merged_q4f16`): the key the runner uses.
    pub stem: String,
    /// Source graph relative to the export (`onnx/decoder_model_merged_q4f16.onnx`).
    pub source: String,
    /// The source graph's recorded digest ([`Manifest::graph_digest`]).
    #[serde(skip)]
    pub source_digest: String,
    /// Shape ranges, in ONNX Runtime's `name:AxB,…` form.
    pub min: String,
    pub opt: String,
    pub max: String,
}

/// What `build-engines` builds for one profile and export.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BuildSpec {
    /// The profile's name.
    pub profile: String,
    pub precision: Precision,
    /// `sm86`, `sm89`, `sm120`, … (the builder's targets).
    pub compute_capabilities: Vec<String>,
    /// Builder workspace limit, bytes.
    pub workspace_bytes: Option<u64>,
    /// Folder for the engines, relative to the export (`trt-rtx/16gb`).
    #[serde(skip)]
    pub dir: String,
    pub graphs: Vec<GraphSpec>,
}

impl BuildSpec {
    /// The spec of `profile` for the export in `dir` (whose manifest is `m`). Fails when the
    /// profile has no `tensorrt_rtx` section, the export is not `--target tensorrt`, or it
    /// lacks the profile's precision.
    pub fn new(m: &Manifest, profile: &Profile) -> Result<BuildSpec, SpecError> {
        let rtx = (profile.tensorrt_rtx.as_ref())
            .ok_or_else(|| SpecError::NoSection(profile.name.clone()))?;
        if m.target != ocrctl_exporters::layers::Target::TensorRt {
            return Err(SpecError::OrtTarget);
        }
        let graphs_of = m
            .graphs
            .get(&profile.precision)
            .ok_or_else(|| SpecError::NoPrecision {
                precision: profile.precision.name(),
                profile: profile.name.clone(),
            })?;
        let shapes = trt_shapes(profile, &ModelDims::from_config(&m.model));
        let mut graphs = Vec::new();
        for (part, r) in [
            (graph::VISION, shapes.vision_encoder),
            (graph::EMBED, shapes.embed_tokens),
            (graph::DECODER_MERGED, shapes.decoder),
        ] {
            let g = graphs_of.get(part).ok_or(SpecError::NoGraph(part))?;
            let source_digest = m
                .graph_digest(&g.file, g.data_file.as_deref())
                .ok_or_else(|| SpecError::NoDigest(g.file.clone()))?;
            graphs.push(GraphSpec {
                part: part.to_string(),
                stem: g.file.trim_end_matches(".onnx").to_string(),
                source: format!("{}/{}", graph::DIR, g.file),
                source_digest,
                min: r.min,
                opt: r.opt,
                max: r.max,
            });
        }
        Ok(BuildSpec {
            profile: profile.name.clone(),
            precision: profile.precision,
            compute_capabilities: rtx.compute_capabilities.clone(),
            workspace_bytes: (rtx.workspace_gb > 0.0)
                .then_some((rtx.workspace_gb * (1u64 << 30) as f64) as u64),
            dir: format!(
                "{}/{}",
                rtx.engines_dir.display().to_string().trim_end_matches('/'),
                profile.name
            ),
            graphs,
        })
    }

    /// sha256 over the values that shape an engine: precision, targets, workspace and every
    /// graph's shape ranges (not the source digests, checked one by one).
    pub fn profile_digest(&self) -> String {
        let text = serde_json::to_string(self).expect("the spec serialises");
        format!("{:x}", Sha256::digest(text.as_bytes()))
    }
}

/// Whether the engine set `set` was built for `spec` and is usable with TensorRT-RTX
/// `runtime_version` (the plugin's bundled release, when known). `Err` says the first thing
/// that differs. Files are checked for presence and size (the runner then hashes them).
pub fn check(
    set: Option<&EngineSet>,
    spec: &BuildSpec,
    runtime_version: Option<&str>,
    dir: &Path,
) -> Result<(), Mismatch> {
    let set = set.ok_or_else(|| Mismatch::NotBuilt {
        profile: spec.profile.clone(),
        model: dir.to_path_buf(),
    })?;
    if let Some(v) = runtime_version {
        if !same_release(&set.builder_version, v) {
            return Err(Mismatch::Release {
                built: set.builder_version.clone(),
                runtime: v.to_string(),
            });
        }
    }
    if set.profile_digest != spec.profile_digest() || set.precision != spec.precision {
        return Err(Mismatch::ProfileChanged(spec.profile.clone()));
    }
    for g in &spec.graphs {
        let e = (set.graphs.get(&g.part)).ok_or_else(|| Mismatch::NoEngine(g.part.clone()))?;
        if e.source_digest != g.source_digest || e.source != g.source {
            return Err(Mismatch::SourceChanged(g.source.clone()));
        }
        for (f, bytes) in [(&e.engine, Some(e.engine_bytes)), (&e.context_model, None)] {
            let path = dir.join(&set.dir).join(f);
            let len = match std::fs::metadata(&path) {
                Ok(m) => m.len(),
                Err(err) => return Err(Mismatch::Unreadable { path, err }),
            };
            if bytes.is_some_and(|b| b != len) {
                let built = e.engine_bytes;
                return Err(Mismatch::Size { path, len, built });
            }
        }
    }
    Ok(())
}

/// The EPContext models of a matching set, by graph stem.
pub fn context_models(set: &EngineSet, spec: &BuildSpec, dir: &Path) -> Vec<(String, PathBuf)> {
    spec.graphs
        .iter()
        .filter_map(|g| {
            let e = set.graphs.get(&g.part)?;
            Some((g.stem.clone(), dir.join(&set.dir).join(&e.context_model)))
        })
        .collect()
}

/// `1.7.1.116` and `1.7.1` are the same release: engines load only in the release (major,
/// minor, patch) that built them.
pub fn same_release(a: &str, b: &str) -> bool {
    let three = |v: &str| v.split('.').take(3).collect::<Vec<_>>().join(".");
    three(a) == three(b)
}

/// Checks that an EPContext model is what the runner expects: nodes that are all
/// `com.microsoft.EPContext` (at least one) and no weights.
pub fn check_context_model(path: &Path) -> Result<(), ContextModelError> {
    let path_buf = || path.to_path_buf();
    let bytes = std::fs::read(path).map_err(|err| ContextModelError::Unreadable {
        path: path_buf(),
        err,
    })?;
    let (nodes, inits) = ocrctl_exporters::proto::read::summarize(&bytes)
        .ok_or_else(|| ContextModelError::NotOnnx(path_buf()))?;
    if nodes.is_empty() {
        return Err(ContextModelError::NoNode(path_buf()));
    }
    if let Some(n) = nodes
        .iter()
        .find(|n| n.domain != "com.microsoft" || n.op_type != "EPContext")
    {
        return Err(ContextModelError::OtherNode {
            path: path_buf(),
            node: format!("{}.{}", n.domain, n.op_type),
        });
    }
    if !inits.is_empty() {
        return Err(ContextModelError::Weights {
            path: path_buf(),
            count: inits.len(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
