//! The GQA decoder's prefill on a vision stage's thread ([`PrefillHandle`], a
//! [`PagePrefill`]).
//!
//! The model's decoder session captures CUDA graphs, and ONNX Runtime's CUDA provider then runs
//! every call of that session on one stream: a prefill there would wait for the decode steps
//! and stall them. So the stage gets a second decoder session (and embedding session) of the
//! same graphs, without graphs: its runs go on a stream of their own, concurrently with the
//! steps, into a slot [`super::gqa::GqaCache::reserve`] set aside in the shared buffers. The
//! price is a second copy of the decoder's weights in GPU memory. It is built only when
//! [`crate::runtime::ortmodel::LoadOptions::prefill_stage`] asks for it: on an H200 the decode
//! steps slowed down as much as the prefills overlapping them gained, so it is off by
//! default (docs/benchmarks/2026-12-02-h200.md).

use super::gqa::GqaCache;
use super::tensors::float_tensor;
use super::{embed_rows, graph, session, LoadOptions, OrtCache};
use crate::runtime::backend::{BackendError, PagePrefill, RowNeed, StepLogits};
use ndarray::Array2;
use ocrctl_exporters::graph::DType;
use ort::memory::MemoryInfo;
use ort::session::Session;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The stage's sessions and its copy of the KV cache.
pub(super) struct PrefillParts {
    pub embed: Session,
    pub decoder: Session,
    pub cache: GqaCache,
    pub act: DType,
    pub host: MemoryInfo<'static>,
    /// Prefills run so far.
    pub runs: usize,
}

/// The stage's sessions of `paths` (the GQA decoder, the embeddings) without CUDA graphs,
/// so that its runs get streams of their own, over `cache`'s buffers; `None`, with a
/// warning, when they cannot be made (pages then prefill between decode steps).
pub(super) fn build(
    env: &ort::environment::Environment,
    paths: (&Path, &Path),
    opts: &LoadOptions,
    decoder_tweaks: session::Tweaks<'_>,
    cache: &GqaCache,
    act: DType,
    host: &MemoryInfo<'static>,
) -> Option<Arc<Mutex<PrefillParts>>> {
    let mut plain = opts.clone();
    plain.providers.cuda.cuda_graphs = false;
    let built = session::build(env, paths.0, &plain, decoder_tweaks).and_then(|d| {
        let e = session::build(env, paths.1, &plain, Default::default())?;
        Ok((d.session, e.session))
    });
    match built {
        Ok((decoder, embed)) => Some(Arc::new(Mutex::new(PrefillParts {
            embed,
            decoder,
            cache: cache.for_stage(),
            act,
            host: host.clone(),
            runs: 0,
        }))),
        Err(e) => {
            tracing::warn!("prefill stage unavailable ({e}); pages prefill between decode steps");
            None
        }
    }
}

/// A [`PagePrefill`] over [`PrefillParts`] (shared so the model can hand out more than one;
/// runs take turns through the mutex).
pub(super) struct PrefillHandle {
    pub parts: Arc<Mutex<PrefillParts>>,
}

impl PagePrefill<OrtCache> for PrefillHandle {
    fn embed(&mut self, ids: &[u32]) -> Result<Array2<f32>, BackendError> {
        let _gpu = super::capture::shared();
        let mut p = self.parts.lock().unwrap_or_else(|e| e.into_inner());
        embed_rows(&mut p.embed, ids)
    }

    fn prefill(
        &mut self,
        embeds: Array2<f32>,
        mut cache: OrtCache,
    ) -> Result<(Vec<f32>, OrtCache), BackendError> {
        const PART: &str = graph::DECODER_GQA;
        let _gpu = super::capture::shared();
        let slot = match (cache.slot(), cache.len) {
            (Some(s), 0) => s,
            _ => {
                return Err(BackendError::Invalid(
                    "a stage prefill needs a reserved, empty KV cache slot".into(),
                ))
            }
        };
        let (s, d) = (embeds.nrows(), embeds.ncols());
        let mut guard = self.parts.lock().unwrap_or_else(|e| e.into_inner());
        let p = &mut *guard;
        let data = super::tensors::into_row_major(embeds);
        let e = float_tensor(p.act, vec![1, s as i64, d as i64], data, PART)?;
        let (mut out, _, _) = p.cache.run(
            &mut p.decoder,
            &p.host,
            slot,
            e,
            &[0],
            s,
            &[(0, RowNeed::Full)],
        )?;
        cache.len = s;
        p.runs += 1;
        match out.pop() {
            Some(StepLogits::Full(l)) => Ok((l, cache)),
            _ => Err(BackendError::runtime(
                PART,
                "no logits for the prefill's row",
            )),
        }
    }
}
