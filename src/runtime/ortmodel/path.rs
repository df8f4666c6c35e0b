//! The decoder paths of an [`OrtModel`](super::OrtModel): one type per decoder graph, each
//! owning its session, its KV cache and its prefill and step code, behind [`Decoder`].
//! [`DecoderPath`] holds the one a load chose; the model's [`Backend`] methods dispatch
//! through it once per call, with the parts every path shares ([`Common`]).
//!
//! - [`MergedDecoder`] (`decoder_model_merged`): each sequence's cache grows with it; a batch
//!   step pads the caches into one, repacked when sequences join or leave
//!   ([`KvCapacity::Unbounded`]).
//! - [`GqaDecoder`] (`decoder_gqa`): one slot of `max_sequence_length` positions per
//!   sequence in buffers allocated once and updated in place ([`KvCapacity::Slots`]); the only
//!   path with sequences to reserve for a prefill stage and with device-side token choice.
//!
//! - [`PagedDecoder`] (`decoder_paged`, CUDA only): a pool of fixed-size blocks handed to
//!   sequences as they grow ([`KvCapacity::Blocks`]), so pages in flight follow memory.
//!
//! [`Backend`]: crate::runtime::backend::Backend

use super::gqa::GqaDecoder;
use super::merged::MergedDecoder;
use super::paged::PagedDecoder;
use super::{Common, OrtCache};
use crate::runtime::backend::{BackendError, BatchLogits, KvCapacity, RowNeed, StepLogits};
use ndarray::Array2;
use ocrctl_exporters::export::DecoderVariant;

/// What a decoder path does for the model's [`crate::runtime::backend::Backend`] methods of
/// the same names (see there for the contracts).
pub(super) trait Decoder {
    /// The decoder graph this path runs.
    fn variant(&self) -> DecoderVariant;

    /// What the KV cache holds and has free now.
    fn kv_capacity(&self) -> KvCapacity;

    /// `embeds [S, hidden]` after the positions held in `cache` (none: a new sequence).
    fn forward(
        &mut self,
        c: &mut Common,
        embeds: Array2<f32>,
        cache: Option<OrtCache>,
    ) -> Result<(Vec<f32>, OrtCache), BackendError>;

    /// One decode step of `tokens[i]` after `caches[i]`, full logits for every row (by
    /// default [`Decoder::decode_batch_select`] asked for full rows).
    fn decode_batch(
        &mut self,
        c: &mut Common,
        tokens: &[u32],
        caches: Vec<OrtCache>,
    ) -> Result<BatchLogits<OrtCache>, BackendError> {
        let (rows, caches) = self.decode_batch_select(c, tokens, caches, &[])?;
        let logits = rows
            .into_iter()
            .map(|r| match r {
                StepLogits::Full(l) => l,
                _ => unreachable!("full logits were asked for"),
            })
            .collect();
        Ok((logits, caches))
    }

    /// [`Decoder::decode_batch`], each row giving what `need` says.
    fn decode_batch_select(
        &mut self,
        c: &mut Common,
        tokens: &[u32],
        caches: Vec<OrtCache>,
        need: &[RowNeed],
    ) -> Result<(Vec<StepLogits>, Vec<OrtCache>), BackendError>;

    /// Row `row`'s full logits of the last [`Decoder::decode_batch_select`] step.
    fn step_logits(&mut self, c: &mut Common, row: usize) -> Result<Vec<f32>, BackendError>;
}

/// The decoder path a model runs.
pub(super) enum DecoderPath {
    Merged(MergedDecoder),
    Gqa(GqaDecoder),
    Paged(PagedDecoder),
}

impl DecoderPath {
    pub fn get(&self) -> &dyn Decoder {
        match self {
            DecoderPath::Merged(d) => d,
            DecoderPath::Gqa(d) => d,
            DecoderPath::Paged(d) => d,
        }
    }

    pub fn get_mut(&mut self) -> &mut dyn Decoder {
        match self {
            DecoderPath::Merged(d) => d,
            DecoderPath::Gqa(d) => d,
            DecoderPath::Paged(d) => d,
        }
    }

    /// The GQA path, for what only it has (slots, a prefill stage).
    pub fn gqa(&self) -> Option<&GqaDecoder> {
        match self {
            DecoderPath::Gqa(d) => Some(d),
            DecoderPath::Merged(_) | DecoderPath::Paged(_) => None,
        }
    }
}
