//! The merged decoder's steps over its KV cache ([`MergedDecoder`]): the decoder's inputs, a
//! sequence's own cache cut out of the batch cache, repacking (in the decoder's memory with
//! the repack graph on the bound path, on the host otherwise), and the padded batch step.

use super::binding::Inputs;
use super::kv::{self, BatchKv, MergedKv, RowSrc};
use super::merged::MergedDecoder;
use super::tensors::i64_tensor;
use super::{Common, KvPath, OrtCache};
use crate::runtime::backend::BackendError;
use half::f16;
use ocrctl_exporters::contract::{graph, tensor};
use ocrctl_exporters::graph::DType;
use ort::value::DynTensor;

impl MergedDecoder {
    /// The decoder's inputs for `b` rows of `s` new positions each: row `i` has `pasts[i]`
    /// cached positions (right-aligned in a past of `mask.len() / b - s`), `mask` is the
    /// `[b, p + s]` attention mask, and `past` the per-tensor past values.
    pub(super) fn decoder_inputs(
        &self,
        embeds: DynTensor,
        mask: Vec<i64>,
        b: usize,
        pasts: Vec<usize>,
        s: usize,
        past: Vec<DynTensor>,
    ) -> Result<Inputs, BackendError> {
        const PART: &str = graph::DECODER_MERGED;
        let width = (mask.len() / b) as i64;
        let pos: Vec<i64> = pasts
            .iter()
            .flat_map(|p| *p as i64..(p + s) as i64)
            .collect();
        let mut inputs: Inputs = Vec::with_capacity(4 + past.len());
        inputs.push((tensor::INPUTS_EMBEDS.into(), embeds));
        inputs.push((
            tensor::ATTENTION_MASK.into(),
            i64_tensor(vec![b as i64, width], mask, PART)?,
        ));
        if self.takes_positions {
            inputs.push((
                tensor::POSITION_IDS.into(),
                i64_tensor(vec![b as i64, s as i64], pos, PART)?,
            ));
        }
        inputs.push((
            tensor::NUM_LOGITS_TO_KEEP.into(),
            i64_tensor(vec![], vec![1], PART)?,
        ));
        inputs.extend(self.past_names.iter().cloned().zip(past));
        Ok(inputs)
    }

    /// The per-layer values of a sequence of `len` positions, cut out of the batch cache if
    /// they live there.
    pub(super) fn own_kv(
        &mut self,
        common: &mut Common,
        MergedKv { id, kv }: MergedKv,
        len: usize,
    ) -> Result<Vec<DynTensor>, BackendError> {
        if let Some(kv) = kv {
            return Ok(kv);
        }
        let batch = self.batch.take();
        let r = batch
            .as_ref()
            .and_then(|b| b.row(id))
            .ok_or_else(|| gone(id));
        let kv =
            r.and_then(|r| self.repack(common, &[(RowSrc::Batch(r), len)], batch.as_ref(), len));
        self.batch = batch;
        kv
    }

    /// A padded cache for `rows` (see [`kv::pack`]): in the decoder's memory on the bound
    /// path, through host memory on the host path or when the repack graph is unavailable.
    fn repack(
        &mut self,
        c: &mut Common,
        rows: &[(RowSrc, usize)],
        old: Option<&BatchKv>,
        p: usize,
    ) -> Result<Vec<DynTensor>, BackendError> {
        const PART: &str = graph::DECODER_MERGED;
        c.stats.repacks += 1;
        if let (KvPath::Bound, Some(r)) = (c.kv_path, self.repacker.as_mut()) {
            match r.pack(rows, old, p, self.dims) {
                Ok(kv) => {
                    c.stats.device_repacks += 1;
                    return Ok(kv);
                }
                Err(e) => {
                    tracing::warn!("repacking the KV cache in {} memory failed ({e}); repacking through host memory", c.placement.kv.allocation_device().as_str());
                    self.repacker = None;
                }
            }
        }
        match c.act {
            DType::F16 => kv::pack::<f16>(rows, old, p, self.dims, PART),
            _ => kv::pack::<f32>(rows, old, p, self.dims, PART),
        }
    }

    /// A padded batch step: each sequence's cache is left-padded to the longest one (masked
    /// out through `attention_mask`) and positions continue each sequence's own count, so a
    /// sequence's result does not depend on what else is in the batch. The padded presents
    /// are kept as the next step's past while the batch stays the same (same sequences, same
    /// order); caches are repacked (see [`kv`]) only when sequences join or leave.
    pub(super) fn decode_batch_padded(
        &mut self,
        common: &mut Common,
        tokens: &[u32],
        caches: Vec<OrtCache>,
    ) -> Result<(Vec<Vec<f32>>, Vec<OrtCache>), BackendError> {
        let b = tokens.len();
        if b != caches.len() || b == 0 {
            return Err(BackendError::Invalid(format!(
                "decode_batch: {b} tokens for {} caches",
                caches.len()
            )));
        }
        let caches = caches
            .into_iter()
            .map(OrtCache::into_merged)
            .collect::<Result<Vec<_>, _>>()?;
        let ids: Vec<u64> = caches.iter().map(|(m, _)| m.id).collect();
        let lens: Vec<usize> = caches.iter().map(|(_, len)| *len).collect();
        let same_batch = self
            .batch
            .as_ref()
            .is_some_and(|bk| bk.ids == ids && bk.lens == lens)
            && caches.iter().all(|(m, _)| m.kv.is_none());
        let old = self.batch.take();
        let (p, past) = match old {
            Some(bk) if same_batch => (bk.p, bk.kv),
            old => {
                let p = *lens.iter().max().expect("non-empty batch");
                let mut rows = Vec::with_capacity(b);
                for (m, len) in caches {
                    let src = match m.kv {
                        Some(kv) => RowSrc::Own(kv),
                        None => RowSrc::Batch(
                            old.as_ref()
                                .and_then(|o| o.row(m.id))
                                .ok_or_else(|| gone(m.id))?,
                        ),
                    };
                    rows.push((src, len));
                }
                (p, self.repack(common, &rows, old.as_ref(), p)?)
            }
        };
        let embeds = common.embed_ids(vec![b as i64, 1], tokens)?;
        let mut mask = vec![0i64; b * (p + 1)];
        for (i, l) in lens.iter().enumerate() {
            mask[i * (p + 1) + p - l..(i + 1) * (p + 1)].fill(1);
        }
        let inputs = self.decoder_inputs(embeds, mask, b, lens.clone(), 1, past)?;
        let (logits, kv) = self.run_decoder(common, inputs)?;
        let new_lens: Vec<usize> = lens.iter().map(|l| l + 1).collect();
        let caches = ids
            .iter()
            .zip(&new_lens)
            .map(|(id, l)| OrtCache::merged(MergedKv { id: *id, kv: None }, *l))
            .collect();
        self.batch = Some(BatchKv {
            ids,
            lens: new_lens,
            p: p + 1,
            kv,
        });
        Ok((logits, caches))
    }
}

/// The error for a sequence whose rows the batch cache no longer holds.
fn gone(id: u64) -> BackendError {
    BackendError::Invalid(format!("KV cache of sequence {id} is gone"))
}
