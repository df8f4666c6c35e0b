//! The GQA path ([`GqaDecoder`]): its load (the slot cache, CUDA graphs of the decode steps,
//! the prefill stage's sessions), a prefill in a new (or reserved) slot, and one run over
//! slots `0..=highest` per decode step.

use super::{GqaCache, PART};
use crate::runtime::backend::{BackendError, KvCapacity, RowNeed, StepLogits};
use crate::runtime::ortmodel::binding::Placement;
use crate::runtime::ortmodel::path::Decoder;
use crate::runtime::ortmodel::stage::{self, PrefillParts};
use crate::runtime::ortmodel::{capture, session, tensors};
use crate::runtime::ortmodel::{Common, LoadError, LoadOptions, OrtCache};
use crate::runtime::providers::Provider;
use ocrctl_exporters::config::TextConfig;
use ocrctl_exporters::export::DecoderVariant;
use ocrctl_exporters::graph::DType;
use ort::session::Session;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The GQA decoder's session, its slot cache and the prefill stage's sessions, if any.
pub(in crate::runtime::ortmodel) struct GqaDecoder {
    decoder: Session,
    pub(in crate::runtime::ortmodel) cache: GqaCache,
    /// The prefill stage's sessions, when it has them ([`LoadOptions::prefill_stage`]).
    pub(in crate::runtime::ortmodel) prefill_stage: Option<Arc<Mutex<PrefillParts>>>,
}

/// What loading the GQA path needs beside its decoder session.
pub(in crate::runtime::ortmodel) struct GqaLoad<'a> {
    pub env: &'a ort::environment::Environment,
    pub opts: &'a LoadOptions,
    pub text: &'a TextConfig,
    /// The decoder's and the embeddings' graph files (the prefill stage loads both again).
    pub paths: (&'a Path, &'a Path),
    pub tweaks: session::Tweaks<'a>,
    pub act: DType,
    pub placement: &'a Placement,
    /// Whether the model runs stages (a GPU, or [`LoadOptions::stages_on_cpu`]).
    pub stages: bool,
}

impl GqaDecoder {
    /// The path over `decoder` (on `provider`, created with CUDA graphs enabled when
    /// `graphs_on`): allocates the slot cache, captures the decode steps' graphs with `embed`
    /// (a failed capture leaves them uncaptured, with a warning; `gpu` is released for it) and
    /// builds the prefill stage when the options ask for one.
    pub fn load(
        l: &GqaLoad<'_>,
        (mut decoder, provider): (Session, Provider),
        graphs_on: bool,
        embed: &mut Session,
        gpu: &mut capture::Shared,
    ) -> Result<GqaDecoder, LoadError> {
        let t = l.text;
        let max_pos = t.max_position_embeddings.max(1);
        let max_seq = match l.opts.max_sequence_length {
            0 => max_pos.min(8192),
            n => n.min(max_pos),
        };
        let kv = l.placement.kv.clone();
        let (heads, slots) = (t.num_kv_heads, l.opts.kv_slots.max(1));
        let layers = t.num_layers;
        let mut cache = GqaCache::new(
            &decoder, kv, l.act, heads, t.head_dim, slots, max_seq, layers,
        )
        .map_err(|e| LoadError::Session {
            path: l.paths.0.to_path_buf(),
            message: e.to_string(),
        })?;
        if graphs_on && provider == Provider::Cuda {
            let time = std::time::Instant::now();
            // The capture takes the lock alone (see `capture`).
            let (hidden, vocab) = (t.hidden_size, t.vocab_size);
            let captured = gpu.released(|| cache.enable_graphs(&mut decoder, embed, hidden, vocab));
            match captured {
                Ok(()) => tracing::info!(
                    "CUDA graphs for decode steps of 1 to {} sequences captured in {:.1} s",
                    cache.slots,
                    time.elapsed().as_secs_f64()
                ),
                Err(e) => {
                    tracing::warn!("CUDA graphs unavailable ({e}); decode steps run without them")
                }
            }
        }
        tracing::info!(
            "GQA decoder, KV cache of {} sequences x {} positions ({:.2} GiB, {:?}) in {} memory",
            cache.slots,
            cache.max_seq,
            cache.bytes() as f64 / (1u64 << 30) as f64,
            cache.element_type(),
            l.placement.kv.allocation_device().as_str()
        );
        let prefill_stage = if l.stages && l.opts.prefill_stage {
            let host = &l.placement.host;
            stage::build(l.env, l.paths, l.opts, l.tweaks, &cache, l.act, host)
        } else {
            None
        };
        Ok(GqaDecoder {
            decoder,
            cache,
            prefill_stage,
        })
    }

    /// [`crate::runtime::backend::Backend::reserve`]: a slot for a prompt of `positions`,
    /// only when a prefill stage will write it.
    pub fn reserve(&mut self, positions: usize) -> Option<OrtCache> {
        self.prefill_stage.as_ref()?;
        let slot = self.cache.reserve(positions)?;
        Some(OrtCache::in_slot(slot))
    }
}

impl Decoder for GqaDecoder {
    fn variant(&self) -> DecoderVariant {
        DecoderVariant::Gqa
    }

    fn kv_capacity(&self) -> KvCapacity {
        KvCapacity::Slots {
            free: self.cache.free(),
            positions: self.cache.max_seq,
        }
    }

    /// `embeds [S, hidden]` after the sequence's cached positions (a new slot for a
    /// prefill), as one B = 1 run.
    fn forward(
        &mut self,
        c: &mut Common,
        embeds: ndarray::Array2<f32>,
        cache: Option<OrtCache>,
    ) -> Result<(Vec<f32>, OrtCache), BackendError> {
        let (s, d) = (embeds.nrows(), embeds.ncols());
        let g = &mut self.cache;
        let mut cache = match cache {
            Some(c) => c,
            None => OrtCache::in_slot(g.take()?),
        };
        let slot = slot_of(&cache)?;
        let data = tensors::into_row_major(embeds);
        let e = tensors::float_tensor(c.act, vec![1, s as i64, d as i64], data, PART)?;
        let (mut logits, _, _) = g.run(
            &mut self.decoder,
            &c.placement.host,
            slot,
            e,
            &[cache.len],
            s,
            &[(0, RowNeed::Full)],
        )?;
        cache.len += s;
        g.set_len(slot, cache.len);
        c.stats.bound_runs += 1;
        match logits.pop() {
            Some(StepLogits::Full(l)) => Ok((l, cache)),
            _ => Err(BackendError::runtime(PART, "no logits for the run's row")),
        }
    }

    /// One run over slots `0..=highest` of the step's sequences; each row gets what `need`
    /// says (full logits where `need` is shorter than the step).
    fn decode_batch_select(
        &mut self,
        c: &mut Common,
        tokens: &[u32],
        mut caches: Vec<OrtCache>,
        need: &[RowNeed],
    ) -> Result<(Vec<StepLogits>, Vec<OrtCache>), BackendError> {
        let step = caches
            .iter()
            .map(|c| Ok((slot_of(c)?, c.len)))
            .collect::<Result<Vec<_>, BackendError>>()?;
        let g = &mut self.cache;
        let mut lens = g.step_lens(&step);
        // Rows outside the step write a dummy position; keep it inside the cache.
        for (i, l) in lens.iter_mut().enumerate() {
            if !step.iter().any(|(s, _)| *s == i) {
                *l = (*l).min(g.max_seq.saturating_sub(1));
            }
        }
        let mut ids = vec![0u32; lens.len()];
        for ((slot, _), t) in step.iter().zip(tokens) {
            ids[*slot] = *t;
        }
        let want: Vec<(usize, RowNeed)> = step
            .iter()
            .enumerate()
            .map(|(i, (slot, _))| (*slot, need.get(i).copied().unwrap_or(RowNeed::Full)))
            .collect();
        let (out, run_ns, read_ns) = if g.graphs_enabled() {
            g.graph_step(&mut self.decoder, &mut c.embed, &ids, &lens, &want)?
        } else {
            let t = std::time::Instant::now();
            let embeds = c.embed_ids(vec![ids.len() as i64, 1], &ids)?;
            c.stats.step_embed_ns += t.elapsed().as_nanos() as u64;
            let host = &c.placement.host;
            g.run(&mut self.decoder, host, 0, embeds, &lens, 1, &want)?
        };
        for (cache, (slot, len)) in caches.iter_mut().zip(&step) {
            cache.len = len + 1;
            g.set_len(*slot, cache.len);
        }
        c.stats.bound_runs += 1;
        c.stats.step_run_ns += run_ns;
        c.stats.step_logits_ns += read_ns;
        Ok((out, caches))
    }

    fn step_logits(&mut self, c: &mut Common, row: usize) -> Result<Vec<f32>, BackendError> {
        c.stats.step_logits_fallbacks += 1;
        self.cache.last_step_row(row)
    }
}

fn slot_of(c: &OrtCache) -> Result<usize, BackendError> {
    c.slot().ok_or_else(|| {
        BackendError::Invalid(
            "a KV cache made by the merged decoder reached the GQA decoder".into(),
        )
    })
}
