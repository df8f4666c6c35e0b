//! [`OrtModel`]: an exported model directory run with ONNX Runtime.
//!
//! Loads `onnx/{vision_encoder,embed_tokens,decoder_*}{suffix}.onnx` named by the export's
//! `ocrctl.json`, and implements [`Backend`]. fp16 graphs take and return float16 tensors;
//! conversion happens here so generation always sees float32. The model holds what every
//! decoder path shares (vision encoder, embeddings, `Common`) and one `DecoderPath`: a
//! type per decoder graph that owns its session, its KV cache and its prefill and step code
//! (`path`; the paged decoder's place is documented there).
//!
//! Submodules: `load` ([`OrtModel::load`]), `path` (the decoder paths' trait and enum),
//! `session` (sessions with provider fallback, the file digests checked before a load),
//! `weights` (a graph's external weights read into memory, so a replaced file cannot crash
//! a loaded model),
//! `tensors` (value helpers), `vision` (the vision encoder run, and its handle for a vision
//! stage's thread), `capture` (the lock that keeps other threads' GPU work out of a CUDA graph
//! capture; every GPU-touching entry point here holds it shared).
//!
//! The merged decoder (`merged::MergedDecoder`): `merged` (the type, its load and
//! dispatch), `kv` (per-sequence and padded batch KV caches, repacking on the host), `repack`
//! (the same repacking in the execution provider's memory with a small ONNX graph), `batch`
//! (decoder inputs, padded batch steps), `binding` (decoder runs that keep the KV cache in the
//! execution provider's memory with IoBinding, see [`KvPath`]).
//!
//! The GQA decoder (`gqa::GqaDecoder`): `gqa` (its slot cache, updated in place, its load,
//! steps and CUDA graphs), `stage` (the prefill stage's sessions, `--prefill-stage on`).

mod batch;
mod binding;
mod capture;
mod gqa;
mod kv;
mod load;
mod merged;
mod paged;
mod path;
mod repack;
mod session;
mod stage;
mod tensors;
mod vision;
mod weights;
use vision::{Vision, VisionHandle};

pub use binding::{KvPath, KvStats};
pub use kv::OrtCache;
pub use load::fast_8bit_caches;

use crate::runtime::backend::{
    Backend, BackendError, BatchLogits, KvCapacity, PagePrefill, RowNeed, StageHandles, StepLogits,
};
use crate::runtime::providers::{Provider, ProviderConfig};
use binding::Placement;
use ndarray::Array2;
use ocrctl_exporters::contract::{graph, tensor};
use ocrctl_exporters::export::{DecoderVariant, Manifest, Precision};
use ocrctl_exporters::graph::DType;
use ort::session::{Session, SessionInputValue};
use ort::value::DynTensor;
use path::DecoderPath;
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tensors::{as_tensor, i64_tensor, read_f};

/// Options for loading a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub precision: Precision,
    /// Intra-op threads (0 = ONNX Runtime's default).
    pub threads: usize,
    /// Explicit ONNX Runtime library path.
    pub ort_lib: Option<PathBuf>,
    /// `session.qdq_matmulnbits_accuracy_level` for INT4 QDQ graphs on the CPU (0: float
    /// compute, 4: int8 activations, ONNX Runtime's default).
    pub accuracy_level: u8,
    /// Execution providers to use, in order (default: CPU only).
    pub providers: ProviderConfig,
    /// Check the files this load reads against the export's sha256 digests first.
    pub verify: bool,
    /// Decoder graph to run; `None` takes `gqa` when the export has it, else `merged`.
    pub decoder: Option<DecoderVariant>,
    /// Sequences the GQA decoder's KV cache holds at once (the batch size).
    pub kv_slots: usize,
    /// Positions per sequence in the GQA decoder's KV cache (the most one sequence may hold
    /// in the paged decoder's); 0 = the model's `max_position_embeddings`, at most 8192.
    pub max_sequence_length: usize,
    /// Bytes of the paged decoder's block pool (a profile's `kv_cache_gb`); `None` = what
    /// `kv_slots` sequences of `max_sequence_length` take.
    pub kv_cache_bytes: Option<usize>,
    /// Positions per block of the paged decoder's pool (0 = 128).
    pub kv_block_size: usize,
    /// Offer the vision encoder to a vision stage (on a GPU): pages' images are encoded on
    /// a thread of their own while the decoder steps (see [`crate::generation::vision`]).
    pub vision_stage: bool,
    /// With the vision stage and the GQA decoder, also prefill pages on the stage's thread
    /// with a second decoder session, so prompts no longer stall the decode steps (see
    /// `stage`); costs a second copy of the decoder's weights. Off by default: no throughput
    /// gain was measured on an H200.
    pub prefill_stage: bool,
    /// Run the stages on the CPU provider too (tests: on the CPU they share its cores, which
    /// is why they are GPU-only otherwise).
    pub stages_on_cpu: bool,
}

impl LoadOptions {
    /// CPU defaults for `precision`.
    pub fn new(precision: Precision) -> LoadOptions {
        LoadOptions {
            precision,
            threads: 0,
            ort_lib: None,
            accuracy_level: 4,
            providers: ProviderConfig::default(),
            verify: true,
            decoder: None,
            kv_slots: 1,
            max_sequence_length: 0,
            kv_cache_bytes: None,
            kv_block_size: 0,
            vision_stage: true,
            prefill_stage: false,
            stages_on_cpu: false,
        }
    }
}

/// Errors loading an export.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Manifest(#[from] ocrctl_exporters::ExportError),
    /// The export's folder could not be read ([`OrtModel::load`] opens it).
    #[error(transparent)]
    Open(#[from] crate::model::export::OpenError),
    #[error(transparent)]
    OrtLib(#[from] crate::runtime::ortlib::OrtLibError),
    #[error("{dir}: precision {precision} was not exported (available: {available})")]
    NoPrecision {
        dir: PathBuf,
        precision: String,
        available: String,
    },
    #[error("{path}: {message}")]
    Session { path: PathBuf, message: String },
}

/// An export's sessions plus what generation needs to know about them: the parts every
/// decoder path shares (vision encoder, embeddings, `Common`) and the decoder path the load
/// chose (`DecoderPath`), which owns the decoder session and its KV cache.
pub struct OrtModel {
    pub manifest: Manifest,
    pub dir: PathBuf,
    /// The vision encoder, shared with the [`VisionHandle`]s given to a vision stage.
    vision: Arc<Mutex<Vision>>,
    /// The decoder session's main execution provider.
    provider: Provider,
    /// Whether [`Backend::stage_handles`] may offer the encoder ([`LoadOptions::vision_stage`],
    /// and a GPU provider or [`LoadOptions::stages_on_cpu`]).
    vision_stage: bool,
    hidden: usize,
    common: Common,
    path: DecoderPath,
}

/// What the decoder paths share with the rest of the model: the embedding session, the
/// activation type, where outputs are bound, the counters and the calibration tap. A path's
/// methods take it beside their own state ([`path::Decoder`]).
pub(super) struct Common {
    act: DType,
    embed: Session,
    placement: Placement,
    /// How merged decoder runs move the KV cache (the GQA path's cache never moves).
    kv_path: KvPath,
    stats: KvStats,
    tap: Option<Tap>,
}

impl Common {
    /// Embeddings of `ids` shaped `shape` (`[B, S]`) as a value of the graph's dtype.
    fn embed_ids(&mut self, shape: Vec<i64>, ids: &[u32]) -> Result<DynTensor, BackendError> {
        embed_with(&mut self.embed, shape, ids)
    }
}

use session::verify_files;
pub use session::write_optimized_graph;

impl OrtModel {
    /// The decoder graph this model runs.
    pub fn decoder_variant(&self) -> DecoderVariant {
        self.path.get().variant()
    }

    /// Sequences and positions per sequence of the GQA decoder's KV cache (`None` on the
    /// merged decoder, whose caches grow with each sequence).
    pub fn kv_slots(&self) -> Option<(usize, usize)> {
        self.path.gqa().map(|g| (g.cache.slots, g.cache.max_seq))
    }

    /// Bytes of the GQA decoder's KV cache or the paged decoder's block pool (`None` on the
    /// merged decoder): positions × layers × 2 × KV heads × head_dim × the graph's cache
    /// element size (one byte for an `--kv-cache fp8|int8` export).
    pub fn kv_cache_bytes(&self) -> Option<usize> {
        match &self.path {
            DecoderPath::Gqa(g) => Some(g.cache.bytes()),
            DecoderPath::Paged(p) => Some(p.pool_bytes()),
            DecoderPath::Merged(_) => None,
        }
    }

    /// The execution provider the decoder session got (after any fallback).
    pub fn decoder_provider(&self) -> Provider {
        self.provider
    }

    /// How decoder runs move the KV cache (after any fallback).
    pub fn kv_path(&self) -> KvPath {
        self.common.kv_path
    }

    /// Chooses how later decoder runs move the KV cache. Caches made on either path stay
    /// valid on the other.
    pub fn set_kv_path(&mut self, path: KvPath) {
        self.common.kv_path = path;
    }

    /// Counters of the decoder runs so far.
    pub fn kv_stats(&self) -> &KvStats {
        &self.common.stats
    }

    /// Where the vision encoder's pixels upload from: `"pinned"` (a page-locked staging buffer,
    /// CUDA) or `"lent"` (the caller's memory, as it lies).
    pub fn vision_pixels(&self) -> &'static str {
        vision::pixels_source(&self.vision)
    }

    /// Prefills the prefill stage has run (`None` without one, [`LoadOptions::prefill_stage`]).
    pub fn prefill_stage_runs(&self) -> Option<usize> {
        let parts = self.path.gqa()?.prefill_stage.as_ref()?;
        Some(parts.lock().unwrap_or_else(|e| e.into_inner()).runs)
    }
}

/// Receives calibration outputs: weight name, shape and values.
pub type Tap = Box<dyn FnMut(&str, &[usize], &[f32]) + Send>;

impl OrtModel {
    /// Sends every `calib.*` output of later runs (calibration exports only) to `tap`.
    pub fn set_tap(&mut self, tap: Option<Tap>) {
        self.common.tap = tap;
    }
}

pub(super) fn tap_outputs(
    tap: &mut Option<Tap>,
    out: &ort::session::SessionOutputs<'_>,
    part: &str,
) -> Result<(), BackendError> {
    if let Some(tap) = tap.as_mut() {
        for (name, v) in out.iter() {
            if let Some(weight) = name.strip_prefix(ocrctl_exporters::layers::CALIB_PREFIX) {
                let (shape, data) = read_f(&v, part)?;
                tap(weight, &shape, &data);
            }
        }
    }
    Ok(())
}

/// Name of the manifest inside an export (re-exported for error messages).
pub const MANIFEST_NAME: &str = ocrctl_exporters::export::MANIFEST;

impl Backend for OrtModel {
    type Cache = OrtCache;

    fn hidden_size(&self) -> usize {
        self.hidden
    }

    fn encode_image(
        &mut self,
        pixel_values: &crate::model::preprocess::Pixels,
    ) -> Result<Array2<f32>, BackendError> {
        vision::run(&self.vision, pixel_values, &mut self.common.tap)
    }

    fn stage_handles(&self) -> Option<StageHandles<OrtCache>> {
        // Only on a GPU (on the CPU both would share the same cores), unless switched off,
        // and never while a calibration tap reads the encoder's outputs on this thread.
        if !self.vision_stage || self.common.tap.is_some() {
            return None;
        }
        let prefill = self.path.gqa().and_then(|g| g.prefill_stage.as_ref());
        Some(StageHandles {
            encoder: Box::new(VisionHandle {
                vision: self.vision.clone(),
            }),
            prefill: prefill.map(|parts| {
                Box::new(stage::PrefillHandle {
                    parts: parts.clone(),
                }) as Box<dyn PagePrefill<OrtCache>>
            }),
        })
    }

    fn reserve(&mut self, positions: usize) -> Option<OrtCache> {
        match &mut self.path {
            DecoderPath::Gqa(g) => g.reserve(positions),
            DecoderPath::Merged(_) | DecoderPath::Paged(_) => None,
        }
    }

    fn embed(&mut self, ids: &[u32]) -> Result<Array2<f32>, BackendError> {
        let _gpu = capture::shared();
        embed_rows(&mut self.common.embed, ids)
    }

    fn forward(
        &mut self,
        embeds: Array2<f32>,
        cache: Option<OrtCache>,
    ) -> Result<(Vec<f32>, OrtCache), BackendError> {
        let _gpu = capture::shared();
        self.path.get_mut().forward(&mut self.common, embeds, cache)
    }

    fn kv_capacity(&self) -> KvCapacity {
        self.path.get().kv_capacity()
    }

    fn decode_batch_select(
        &mut self,
        tokens: &[u32],
        caches: Vec<OrtCache>,
        need: &[RowNeed],
    ) -> Result<(Vec<StepLogits>, Vec<OrtCache>), BackendError> {
        let _gpu = capture::shared();
        let path = self.path.get_mut();
        path.decode_batch_select(&mut self.common, tokens, caches, need)
    }

    fn step_logits(&mut self, row: usize) -> Result<Vec<f32>, BackendError> {
        let _gpu = capture::shared();
        self.path.get_mut().step_logits(&mut self.common, row)
    }

    fn decode_batch(
        &mut self,
        tokens: &[u32],
        caches: Vec<OrtCache>,
    ) -> Result<BatchLogits<OrtCache>, BackendError> {
        let _gpu = capture::shared();
        self.path
            .get_mut()
            .decode_batch(&mut self.common, tokens, caches)
    }
}

/// One sequence's embeddings `[S, hidden]` of `ids` by the embedding session `embed`, as
/// float32 ([`Backend::embed`]).
fn embed_rows(embed: &mut Session, ids: &[u32]) -> Result<Array2<f32>, BackendError> {
    const PART: &str = graph::EMBED;
    let v = embed_with(embed, vec![1, ids.len() as i64], ids)?;
    let (shape, data) = read_f(&v, PART)?;
    Array2::from_shape_vec((shape[1], shape[2]), data).map_err(|e| BackendError::runtime(PART, e))
}

/// Embeddings of `ids` shaped `shape` (`[B, S]`) by the embedding session `embed`, as a
/// value of the graph's dtype.
fn embed_with(
    embed: &mut Session,
    shape: Vec<i64>,
    ids: &[u32],
) -> Result<DynTensor, BackendError> {
    const PART: &str = graph::EMBED;
    let ids = i64_tensor(shape, ids.iter().map(|t| *t as i64).collect(), PART)?;
    let mut out = embed
        .run(vec![(
            Cow::from(tensor::INPUT_IDS),
            SessionInputValue::from(ids),
        )])
        .map_err(|e| BackendError::runtime(PART, e))?;
    let v = out
        .remove(tensor::INPUTS_EMBEDS)
        .ok_or_else(|| BackendError::runtime(PART, "no inputs_embeds output"))?;
    as_tensor(v, PART)
}

#[cfg(test)]
mod tests;
