//! The seam between generation logic and a model runtime.
//!
//! [`Backend`] is what generation needs from a model: image features, token embeddings
//! and one decoder step with a cache. [`crate::runtime::ortmodel::OrtModel`] implements it with ONNX
//! Runtime; tests implement it with small fakes so prompts and decoding logic run without
//! a model.

use crate::model::preprocess::Pixels;
use ndarray::Array2;

/// Errors from a backend, naming the model part or tensor at fault.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{part}: {message}")]
    Runtime { part: String, message: String },
    #[error("{0}")]
    Invalid(String),
}

impl BackendError {
    /// A runtime failure in `part` (e.g. `decoder_model_merged.onnx`).
    pub fn runtime(part: &str, e: impl std::fmt::Display) -> BackendError {
        BackendError::Runtime {
            part: part.to_string(),
            message: e.to_string(),
        }
    }
}

/// What a decode step gives for one sequence: its logits, or only its greedy choice when
/// the caller said that is all it needs (see [`Backend::decode_batch_select`]).
#[derive(Debug, Clone, PartialEq)]
pub enum StepLogits {
    /// The whole distribution over the vocabulary.
    Full(Vec<f32>),
    /// The argmax of the logits (the lowest id on ties).
    Argmax(u32),
    /// The largest logits with their ids, largest first (lower id first among equal values),
    /// for a sampler that can draw from them ([`crate::generation::sampling::Sampler::next_from_candidates`]);
    /// the full logits stay with the backend until the next step ([`Backend::step_logits`]).
    Candidates {
        /// `(logit, id)`, largest first.
        top: Vec<(f32, u32)>,
        /// The vocabulary size (how many logits the candidates were chosen from).
        vocab: usize,
        /// `log Σ exp(logits)` of the row, when the backend computes it: a candidate's
        /// log-probability is its logit minus this.
        lse: Option<f64>,
    },
}

/// What the caller of [`Backend::decode_batch_select`] needs of one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowNeed {
    /// The whole distribution.
    Full,
    /// Only the greedy choice.
    Argmax,
    /// The candidates (and the log-normaliser), with the full logits on request: for
    /// sampling, repetition penalties and log-probabilities whenever the candidates decide.
    Candidates,
}

/// Encodes images away from the engine's thread: a handle onto a backend's vision encoder
/// that a [`crate::generation::vision::VisionStage`] runs on its own thread, so that the next
/// pages' images are encoded on the GPU while the decoder steps the running ones.
pub trait ImageEncoder: Send {
    /// `pixel_values [1, 3, H, W]` → image features `[N, hidden]`, as
    /// [`Backend::encode_image`].
    fn encode(&mut self, pixel_values: &Pixels) -> Result<Array2<f32>, BackendError>;
}

/// Prefills pages away from the engine's thread, after their images are encoded there: a
/// handle onto a second decoder (its own session and stream on a GPU) writing into cache
/// sequences that [`Backend::reserve`] set aside, so the prompt's decoder run (~30 ms for an
/// A4 page on an H200) no longer stalls the running batch's decode steps. A
/// [`crate::generation::vision::VisionStage`] runs it on its own thread.
pub trait PagePrefill<C>: Send {
    /// Token ids → embeddings `[S, hidden]`, as [`Backend::embed`].
    fn embed(&mut self, ids: &[u32]) -> Result<Array2<f32>, BackendError>;

    /// Runs the decoder on `embeds [S, hidden]` into `cache`, a sequence from
    /// [`Backend::reserve`] holding no position yet. Returns the last position's logits and
    /// the cache, now holding `S` positions.
    fn prefill(&mut self, embeds: Array2<f32>, cache: C) -> Result<(Vec<f32>, C), BackendError>;
}

/// What a backend hands a [`crate::generation::vision::VisionStage`]
/// ([`Backend::stage_handles`]).
pub struct StageHandles<C> {
    /// Encodes images on another thread while the backend decodes (on a GPU the encoder is
    /// compute-bound, large-batch decode steps are memory-bound).
    pub encoder: Box<dyn ImageEncoder>,
    /// Prefills pages on the stage's thread, when the backend has a fixed cache to reserve
    /// sequences in and a second decoder for it; `None` prefills on the engine's thread.
    pub prefill: Option<Box<dyn PagePrefill<C>>>,
}

/// How a backend holds its KV cache, and what it has free now.
///
/// The merged decoder's caches grow per sequence; the GQA decoder allocates a slot of
/// `max_sequence_length` positions per sequence once; the paged decoder gives sequences blocks
/// as they grow, so pages in flight follow memory rather than the longest page allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvCapacity {
    /// Caches grow per sequence, with no fixed pool.
    Unbounded,
    /// A fixed number of sequences of `positions` each; `free` of them unused.
    Slots { free: usize, positions: usize },
    /// A pool of `total` blocks of `block_size` positions, `free` of them unused; one
    /// sequence holds at most `positions`.
    Blocks {
        free: usize,
        total: usize,
        block_size: usize,
        positions: usize,
    },
}

impl KvCapacity {
    /// Positions one sequence can ever hold (`None`: no bound from the cache). A paged pool
    /// smaller than `positions` bounds a sequence by the whole pool.
    pub fn max_positions(&self) -> Option<usize> {
        match *self {
            KvCapacity::Unbounded => None,
            KvCapacity::Slots { positions, .. } => Some(positions),
            KvCapacity::Blocks {
                total,
                block_size,
                positions,
                ..
            } => Some(positions.min(total * block_size)),
        }
    }

    /// Free sequences (slots) or blocks; `None` when unbounded.
    pub fn free(&self) -> Option<usize> {
        match *self {
            KvCapacity::Unbounded => None,
            KvCapacity::Slots { free, .. } | KvCapacity::Blocks { free, .. } => Some(free),
        }
    }

    /// Positions per block when the cache is paged.
    pub fn block_size(&self) -> Option<usize> {
        match *self {
            KvCapacity::Blocks { block_size, .. } => Some(block_size),
            _ => None,
        }
    }
}

/// Each sequence's logits and extended cache after a decode step, in order.
pub type BatchLogits<C> = (Vec<Vec<f32>>, Vec<C>);

/// A loaded model that can run one request (batch 1).
pub trait Backend {
    /// Per-request decoder state (the KV cache); it crosses to a stage's thread when that
    /// prefills ([`PagePrefill`]).
    type Cache: Send + 'static;

    /// Hidden size of the decoder (width of embeddings and image features).
    fn hidden_size(&self) -> usize;

    /// `pixel_values [1, 3, H, W]` → image features `[N, hidden]`.
    fn encode_image(&mut self, pixel_values: &Pixels) -> Result<Array2<f32>, BackendError>;

    /// Token ids → embeddings `[S, hidden]`.
    fn embed(&mut self, ids: &[u32]) -> Result<Array2<f32>, BackendError>;

    /// Runs the decoder on `embeds [S, hidden]` after the tokens held in `cache` (none for
    /// the prefill). Returns the last position's logits and the extended cache.
    fn forward(
        &mut self,
        embeds: Array2<f32>,
        cache: Option<Self::Cache>,
    ) -> Result<(Vec<f32>, Self::Cache), BackendError>;

    /// One decoding step for several sequences at once: `tokens[i]` follows `caches[i]`.
    /// Returns each sequence's logits and extended cache, in order. The default runs them
    /// one by one; backends override it with a padded batch.
    fn decode_batch(
        &mut self,
        tokens: &[u32],
        caches: Vec<Self::Cache>,
    ) -> Result<BatchLogits<Self::Cache>, BackendError> {
        let mut logits = Vec::with_capacity(tokens.len());
        let mut out = Vec::with_capacity(tokens.len());
        for (t, c) in tokens.iter().zip(caches) {
            let e = self.embed(&[*t])?;
            let (l, c) = self.forward(e, Some(c))?;
            logits.push(l);
            out.push(c);
        }
        Ok((logits, out))
    }

    /// The handles a vision stage runs on its own threads ([`StageHandles`]), when running
    /// them beside this backend's decode steps pays (a GPU); `None` (the default) keeps
    /// encoding and prefilling on the engine's thread.
    fn stage_handles(&self) -> Option<StageHandles<Self::Cache>> {
        None
    }

    /// Sets aside a cache sequence for a prompt of `positions` that a [`PagePrefill`] will
    /// write on another thread, while this backend's decode steps go on (they must neither
    /// write into the positions the prefill writes nor hand the sequence out again). `None`
    /// when it cannot (no free sequence, a prompt that fills the whole sequence, no fixed
    /// cache): the engine then prefills on its own thread.
    fn reserve(&mut self, positions: usize) -> Option<Self::Cache> {
        let _ = positions;
        None
    }

    /// What the KV cache holds and has free now: the one question the engine asks before it
    /// admits a request and before each decode step ([`KvCapacity`]).
    fn kv_capacity(&self) -> KvCapacity {
        KvCapacity::Unbounded
    }

    /// [`Backend::decode_batch`], where `need[i]` says what row `i` needs: a backend that
    /// picks the greedy token or the sampling candidates on the device moves only those to
    /// the host ([`StepLogits::Argmax`], [`StepLogits::Candidates`]). The default returns
    /// full logits for every row.
    fn decode_batch_select(
        &mut self,
        tokens: &[u32],
        caches: Vec<Self::Cache>,
        need: &[RowNeed],
    ) -> Result<(Vec<StepLogits>, Vec<Self::Cache>), BackendError> {
        let _ = need;
        let (logits, caches) = self.decode_batch(tokens, caches)?;
        Ok((logits.into_iter().map(StepLogits::Full).collect(), caches))
    }

    /// The full logits of row `row` of the last [`Backend::decode_batch_select`] step, for a
    /// row that came back as [`StepLogits::Candidates`] when the candidates did not decide
    /// the draw. Valid until the next decoder run.
    fn step_logits(&mut self, row: usize) -> Result<Vec<f32>, BackendError> {
        Err(BackendError::Invalid(format!(
            "this backend keeps no logits of the last step (row {row})"
        )))
    }
}
