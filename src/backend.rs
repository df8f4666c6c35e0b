//! The seam between generation logic and a model runtime.
//!
//! [`Backend`] is what generation needs from a model: image features, token embeddings
//! and one decoder step with a cache. [`crate::ortmodel::OrtModel`] implements it with ONNX
//! Runtime; tests implement it with small fakes so prompts and decoding logic run without
//! a model.

use ndarray::{Array2, Array4};

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

/// A loaded model that can run one request (batch 1).
pub trait Backend {
    /// Per-request decoder state (the KV cache).
    type Cache;

    /// Hidden size of the decoder (width of embeddings and image features).
    fn hidden_size(&self) -> usize;

    /// `pixel_values [1, 3, H, W]` → image features `[N, hidden]`.
    fn encode_image(&mut self, pixel_values: &Array4<f32>) -> Result<Array2<f32>, BackendError>;

    /// Token ids → embeddings `[S, hidden]`.
    fn embed(&mut self, ids: &[u32]) -> Result<Array2<f32>, BackendError>;

    /// Runs the decoder on `embeds [S, hidden]` after the tokens held in `cache` (none for
    /// the prefill). Returns the last position's logits and the extended cache.
    fn forward(
        &mut self,
        embeds: Array2<f32>,
        cache: Option<Self::Cache>,
    ) -> Result<(Vec<f32>, Self::Cache), BackendError>;
}
