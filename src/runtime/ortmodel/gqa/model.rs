//! [`super::super::OrtModel`]'s `forward` and batched decode steps on the GQA path: a
//! prefill in a new (or reserved) slot, and one run over slots `0..=highest` per step.

use super::PART;
use crate::runtime::backend::{BackendError, RowNeed, StepLogits};

impl super::super::OrtModel {
    /// [`crate::runtime::backend::Backend::forward`] on the GQA path: `embeds [S, hidden]` after the
    /// sequence's cached positions (a new slot for a prefill), as one B = 1 run.
    pub(in crate::runtime::ortmodel) fn gqa_forward(
        &mut self,
        embeds: ndarray::Array2<f32>,
        cache: Option<super::super::OrtCache>,
    ) -> Result<(Vec<f32>, super::super::OrtCache), BackendError> {
        let (s, d) = (embeds.nrows(), embeds.ncols());
        let g = self.gqa.as_mut().expect("the GQA path has its cache");
        let mut cache = match cache {
            Some(c) => c,
            None => super::super::OrtCache::in_slot(g.take()?),
        };
        let slot = slot_of(&cache)?;
        let data = super::super::tensors::into_row_major(embeds);
        let e =
            super::super::tensors::float_tensor(self.act, vec![1, s as i64, d as i64], data, PART)?;
        let (mut logits, _, _) = g.run(
            &mut self.decoder,
            &self.placement.host,
            slot,
            e,
            &[cache.len],
            s,
            &[(0, RowNeed::Full)],
        )?;
        cache.len += s;
        g.set_len(slot, cache.len);
        self.stats.bound_runs += 1;
        match logits.pop() {
            Some(StepLogits::Full(l)) => Ok((l, cache)),
            _ => Err(BackendError::runtime(PART, "no logits for the run's row")),
        }
    }

    /// [`crate::runtime::backend::Backend::decode_batch_select`] on the GQA path: one run over slots
    /// `0..=highest` of the step's sequences; each row gets what `need` says (full logits
    /// where `need` is shorter than the step).
    pub(in crate::runtime::ortmodel) fn gqa_decode_batch(
        &mut self,
        tokens: &[u32],
        mut caches: Vec<super::super::OrtCache>,
        need: &[RowNeed],
    ) -> Result<(Vec<StepLogits>, Vec<super::super::OrtCache>), BackendError> {
        let step = caches
            .iter()
            .map(|c| Ok((slot_of(c)?, c.len)))
            .collect::<Result<Vec<_>, BackendError>>()?;
        let g = self.gqa.as_ref().expect("the GQA path has its cache");
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
        let g = self.gqa.as_mut().expect("the GQA path has its cache");
        let (out, run_ns, read_ns) = if g.graphs_enabled() {
            g.graph_step(&mut self.decoder, &mut self.embed, &ids, &lens, &want)?
        } else {
            let t = std::time::Instant::now();
            let embeds = self.embed_ids(vec![ids.len() as i64, 1], &ids)?;
            self.stats.step_embed_ns += t.elapsed().as_nanos() as u64;
            let g = self.gqa.as_mut().expect("the GQA path has its cache");
            let host = &self.placement.host;
            g.run(&mut self.decoder, host, 0, embeds, &lens, 1, &want)?
        };
        let g = self.gqa.as_mut().expect("the GQA path has its cache");
        for (c, (slot, len)) in caches.iter_mut().zip(&step) {
            c.len = len + 1;
            g.set_len(*slot, c.len);
        }
        self.stats.bound_runs += 1;
        self.stats.step_run_ns += run_ns;
        self.stats.step_logits_ns += read_ns;
        Ok((out, caches))
    }
}

fn slot_of(c: &super::super::OrtCache) -> Result<usize, BackendError> {
    c.slot.as_ref().map(|s| s.index).ok_or_else(|| {
        BackendError::Invalid(
            "a KV cache made by the merged decoder reached the GQA decoder".into(),
        )
    })
}
