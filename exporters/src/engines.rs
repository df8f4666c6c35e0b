//! Ahead-of-time engines recorded in an export's manifest (`ocrctl.json` → `engines`).
//!
//! `ocrctl build-engines` builds TensorRT-RTX engines for one profile from the
//! `--target tensorrt` graphs and records here what they were built from: the builder's
//! version, the compute capabilities they run on, a digest of the profile values that shape an
//! engine, and the digest of every source graph (the sha256 the export recorded for the graph
//! and its external data). The runner uses an engine set only when all of these still match
//! and says which one does not otherwise.

use crate::export::Precision;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Which builder made an engine set (the only one so far).
pub const TENSORRT_RTX: &str = "tensorrt-rtx";

/// The engines built for one profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineSet {
    /// [`TENSORRT_RTX`].
    pub builder: String,
    /// TensorRT-RTX version that built the engines (`1.7.1.116`); engines load only in the
    /// same TensorRT-RTX release.
    pub builder_version: String,
    /// Compute capabilities the engines run on (`sm86`, `sm89`, `sm120`).
    pub compute_capabilities: Vec<String>,
    /// The profile's name.
    pub profile: String,
    /// sha256 over the profile values that shape an engine (precision, shape ranges,
    /// workspace, optimisation level, compute capabilities).
    pub profile_digest: String,
    /// The graphs' precision.
    pub precision: Precision,
    /// Folder of the engines and their EPContext models, relative to the export.
    pub dir: String,
    /// Part (`vision_encoder`, `embed_tokens`, `decoder_model_merged`) → its engine.
    pub graphs: BTreeMap<String, EngineGraph>,
}

/// One graph's engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineGraph {
    /// Source graph, relative to the export (`onnx/decoder_model_merged_q4f16.onnx`).
    pub source: String,
    /// sha256 over the source graph's and its external data's recorded digests.
    pub source_digest: String,
    /// The EPContext model, relative to [`EngineSet::dir`].
    pub context_model: String,
    /// The serialized engine, relative to [`EngineSet::dir`].
    pub engine: String,
    /// Engine size, bytes.
    pub engine_bytes: u64,
    /// sha256 of the engine file.
    pub engine_sha256: String,
    /// Seconds the build took.
    pub build_seconds: f64,
}
