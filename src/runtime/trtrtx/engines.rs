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
    pub fn new(m: &Manifest, profile: &Profile) -> Result<BuildSpec, String> {
        let rtx = profile.tensorrt_rtx.as_ref().ok_or_else(|| {
            format!(
                "profile {} has no tensorrt_rtx section (the 16gb and 24gb profiles have one)",
                profile.name
            )
        })?;
        if m.target != ocrctl_exporters::layers::Target::TensorRt {
            return Err(
                "the export is --target ort (contrib ops TensorRT-RTX cannot parse); export \
                 with --target tensorrt for engines"
                    .into(),
            );
        }
        let graphs_of = m.graphs.get(&profile.precision).ok_or_else(|| {
            format!(
                "the export has no {} graphs, which profile {} runs (export with --precision {})",
                profile.precision.name(),
                profile.name,
                profile.precision.name()
            )
        })?;
        let shapes = trt_shapes(profile, &ModelDims::from_config(&m.model));
        let mut graphs = Vec::new();
        for (part, r) in [
            (graph::VISION, shapes.vision_encoder),
            (graph::EMBED, shapes.embed_tokens),
            (graph::DECODER_MERGED, shapes.decoder),
        ] {
            let g = graphs_of
                .get(part)
                .ok_or_else(|| format!("the export has no {part} graph"))?;
            let source_digest =
                m.graph_digest(&g.file, g.data_file.as_deref())
                    .ok_or_else(|| {
                        format!(
                            "the manifest records no digest of onnx/{} (an export older than the \
                         digests; export again)",
                            g.file
                        )
                    })?;
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
) -> Result<(), String> {
    let set = set.ok_or_else(|| {
        format!(
            "no engines were built for profile {} (ocrctl build-engines --model {} --profile {})",
            spec.profile,
            dir.display(),
            spec.profile
        )
    })?;
    if let Some(v) = runtime_version {
        if !same_release(&set.builder_version, v) {
            return Err(format!(
                "the engines were built with TensorRT-RTX {} and the plugin bundles {v}; \
                 build them again with the same release",
                set.builder_version
            ));
        }
    }
    if set.profile_digest != spec.profile_digest() || set.precision != spec.precision {
        return Err(format!(
            "profile {}'s shape ranges, precision, targets or workspace changed since the \
             engines were built",
            spec.profile
        ));
    }
    for g in &spec.graphs {
        let e = set
            .graphs
            .get(&g.part)
            .ok_or_else(|| format!("no engine was built for {}", g.part))?;
        if e.source_digest != g.source_digest || e.source != g.source {
            return Err(format!("{} changed since its engine was built", g.source));
        }
        for (f, bytes) in [(&e.engine, Some(e.engine_bytes)), (&e.context_model, None)] {
            let p = dir.join(&set.dir).join(f);
            let len = std::fs::metadata(&p)
                .map_err(|err| format!("{}: {err}", p.display()))?
                .len();
            if bytes.is_some_and(|b| b != len) {
                return Err(format!(
                    "{}: {len} bytes, {} were built",
                    p.display(),
                    e.engine_bytes
                ));
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
pub fn check_context_model(path: &Path) -> Result<(), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let (nodes, inits) = ocrctl_exporters::proto::read::summarize(&bytes)
        .ok_or_else(|| format!("{}: not an ONNX model", path.display()))?;
    if nodes.is_empty() {
        return Err(format!("{}: has no node", path.display()));
    }
    if let Some(n) = nodes
        .iter()
        .find(|n| n.domain != "com.microsoft" || n.op_type != "EPContext")
    {
        return Err(format!(
            "{}: holds a {}.{} node; an EPContext model holds EPContext nodes only",
            path.display(),
            n.domain,
            n.op_type
        ));
    }
    if !inits.is_empty() {
        return Err(format!(
            "{}: holds {} initializers; the weights belong in the engine",
            path.display(),
            inits.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
