//! The `decoder_model_merged` path ([`MergedDecoder`]): each sequence's KV cache is the
//! `present.*` values of its last run and grows with it; a batch step pads the caches into
//! one (`super::batch`), kept on the device between steps (`super::binding`) and repacked
//! when sequences join or leave (`super::kv`, `super::repack`).

use super::binding::Placement;
use super::kv::{BatchKv, KvDims, MergedKv};
use super::path::Decoder;
use super::repack::Repacker;
use super::tensors::{self, float_tensor};
use super::{embed_rows, Common, LoadOptions, OrtCache};
use crate::runtime::backend::{BackendError, BatchLogits, KvCapacity, RowNeed, StepLogits};
use crate::runtime::providers::Provider;
use ndarray::Array2;
use ocrctl_exporters::config::TextConfig;
use ocrctl_exporters::contract::{graph, tensor};
use ocrctl_exporters::export::DecoderVariant;
use ocrctl_exporters::graph::DType;
use ort::session::Session;

/// The merged decoder's session and its batch cache.
pub(in crate::runtime::ortmodel) struct MergedDecoder {
    pub(super) decoder: Session,
    /// Whether the graph takes `position_ids` (`--target tensorrt` graphs and older exports;
    /// the ONNX Runtime graph derives them from the mask).
    pub(super) takes_positions: bool,
    /// Repacks in the decoder's memory (`None` if its session could not be made or failed).
    pub(super) repacker: Option<Repacker>,
    /// Whether presents were found outside the memory they were bound to (logged once).
    pub(super) warned_placement: bool,
    pub(super) past_names: Vec<String>,
    pub(super) present_names: Vec<String>,
    pub(super) dims: KvDims,
    /// The padded cache of the last batch step (see [`super::kv`]).
    pub(super) batch: Option<BatchKv>,
}

impl MergedDecoder {
    /// The path over `decoder` (on `provider`) for a model of shape `text`, with its repack
    /// graph for activations of `act` (none, with a warning, when that graph cannot be made:
    /// batch caches are then repacked through host memory).
    pub fn new(
        env: &ort::environment::Environment,
        (decoder, provider): (Session, Provider),
        opts: &LoadOptions,
        act: DType,
        placement: &Placement,
        text: &TextConfig,
    ) -> MergedDecoder {
        let device_id = opts.providers.device_id;
        let layers = text.num_layers;
        let dims = KvDims {
            kv_heads: text.num_kv_heads,
            head_dim: text.head_dim,
            tensors: 2 * layers,
        };
        let repacker = match Repacker::new(env, provider, device_id, act, &placement.kv, &decoder) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!("KV repack graph unavailable ({e}); batch caches are repacked through host memory");
                None
            }
        };
        MergedDecoder {
            takes_positions: decoder
                .inputs()
                .iter()
                .any(|i| i.name() == tensor::POSITION_IDS),
            decoder,
            repacker,
            warned_placement: false,
            past_names: tensor::cache_names(layers, false),
            present_names: tensor::cache_names(layers, true),
            dims,
            batch: None,
        }
    }
}

impl Decoder for MergedDecoder {
    fn variant(&self) -> DecoderVariant {
        DecoderVariant::Merged
    }

    fn kv_capacity(&self) -> KvCapacity {
        KvCapacity::Unbounded
    }

    fn forward(
        &mut self,
        c: &mut Common,
        embeds: Array2<f32>,
        cache: Option<OrtCache>,
    ) -> Result<(Vec<f32>, OrtCache), BackendError> {
        const PART: &str = graph::DECODER_MERGED;
        let (s, d) = (embeds.nrows(), embeds.ncols());
        let past = cache.as_ref().map_or(0, |c| c.len);
        let data = tensors::into_row_major(embeds);
        let embeds = float_tensor(c.act, vec![1, s as i64, d as i64], data, PART)?;
        let kv = match cache {
            Some(cache) => {
                let (m, len) = cache.into_merged()?;
                self.own_kv(c, m, len)?
            }
            None => {
                let (kvh, hd) = (self.dims.kv_heads as i64, self.dims.head_dim as i64);
                (0..self.dims.tensors)
                    .map(|_| float_tensor(c.act, vec![1, kvh, 0, hd], Vec::new(), PART))
                    .collect::<Result<_, _>>()?
            }
        };
        let inputs = self.decoder_inputs(embeds, vec![1; past + s], 1, vec![past], s, kv)?;
        let (mut logits, kv) = self.run_decoder(c, inputs)?;
        let last = logits.pop().expect("one row of logits");
        Ok((last, OrtCache::own(kv, past + s)))
    }

    fn decode_batch(
        &mut self,
        c: &mut Common,
        tokens: &[u32],
        caches: Vec<OrtCache>,
    ) -> Result<BatchLogits<OrtCache>, BackendError> {
        if tokens.len() == 1 && caches.len() == 1 {
            // A batch of one needs no padding: feed its cache back as is. The batch cache,
            // if any, held only sequences that are gone now: free it.
            let cache = caches.into_iter().next().expect("one cache");
            let (m, len) = cache.into_merged()?;
            let id = m.id;
            let kv = Some(self.own_kv(c, m, len)?);
            self.batch = None;
            let e = embed_rows(&mut c.embed, tokens)?;
            let cache = OrtCache::merged(MergedKv { id, kv }, len);
            let (l, cache) = self.forward(c, e, Some(cache))?;
            return Ok((vec![l], vec![cache]));
        }
        self.decode_batch_padded(c, tokens, caches)
    }

    fn decode_batch_select(
        &mut self,
        c: &mut Common,
        tokens: &[u32],
        caches: Vec<OrtCache>,
        _need: &[RowNeed],
    ) -> Result<(Vec<StepLogits>, Vec<OrtCache>), BackendError> {
        let (logits, caches) = self.decode_batch(c, tokens, caches)?;
        Ok((logits.into_iter().map(StepLogits::Full).collect(), caches))
    }

    fn step_logits(&mut self, _c: &mut Common, _row: usize) -> Result<Vec<f32>, BackendError> {
        Err(BackendError::Invalid(
            "the merged decoder returns full logits only".into(),
        ))
    }
}
