//! Continuous batching over any [`Backend`]: requests join and leave a decode batch.
//!
//! The state of a running batch lives in a [`Batch`]; [`Engine::admit`] adds a request to it
//! (prefill: image features, embeddings with the image rows replaced, decoder over the
//! prompt, batch 1 — images differ in size) and [`Engine::step`] picks one token per active
//! request with its own [`Sampler`], retires finished ones (stop id, `max_new_tokens`, the
//! loop guard, or the caller's [`Flow`]), and runs one padded decoder step for all the rest
//! ([`Backend::decode_batch`]). [`Engine::run`] drives a whole list of requests with these;
//! the HTTP server drives them itself so requests can arrive, be cancelled and stream while
//! others decode. Log-probabilities are those of the raw model distribution (before
//! penalties and temperature), as vLLM reports them. A request that fails during its
//! prefill fails alone.
//!
//! Where the backend offers an image encoder ([`Backend::stage_handles`], a GPU), the engine
//! runs a [`VisionStage`]: `admit` hands a request's images to it and the request waits in
//! the batch, holding its place and its cache sequence, while `step` goes on decoding the
//! others; `step` prefills it once its features are back.
//!
//! ```
//! use ocrctl::generation::engine::{Batch, Engine, Event, Flow};
//! # use ocrctl::runtime::backend::{Backend, BackendError};
//! # use ndarray::Array2;
//! # struct Echo;
//! # impl Backend for Echo {
//! #     type Cache = ();
//! #     fn hidden_size(&self) -> usize { 1 }
//! #     fn encode_image(&mut self, _: &ocrctl::model::preprocess::Pixels) -> Result<Array2<f32>, BackendError> { unreachable!() }
//! #     fn embed(&mut self, ids: &[u32]) -> Result<Array2<f32>, BackendError> { Ok(Array2::zeros((ids.len(), 1))) }
//! #     fn forward(&mut self, _: Array2<f32>, _: Option<()>) -> Result<(Vec<f32>, ()), BackendError> { Ok((vec![0.0, 1.0], ())) }
//! # }
//! let mut engine = Engine::new(Echo, 4, 9);
//! let mut batch = Batch::new();
//! let req = ocrctl::generation::engine::GenRequest::text(vec![0], 3);
//! engine.admit(&mut batch, 7, req, &mut |_| Flow::Continue);
//! let mut tokens = 0;
//! while !batch.is_empty() {
//!     engine.step(&mut batch, &mut |ev| {
//!         if let Event::Token { .. } = ev { tokens += 1 }
//!         Flow::Continue
//!     });
//! }
//! assert_eq!(tokens, 3);
//! ```

use crate::generation::generate::{
    argmax_and_top_k, log_sum_exp, prefill_resumed, FinishReason, Generation, TokenLogprob,
};
use crate::generation::sampling::Sampler;
use crate::generation::vision::{Staged, VisionStage};
use crate::runtime::backend::{Backend, BackendError, RowNeed, StepLogits};

mod admission;
mod batch;
mod need;
mod request;
mod requeue;
pub use batch::Batch;
use batch::{Active, Waiting};
pub use request::{EngineError, Event, Flow, GenRequest};
use std::panic::{catch_unwind, AssertUnwindSafe};

fn empty_generation() -> Generation {
    Generation {
        token_ids: vec![],
        logprobs: vec![],
        top_logprobs: vec![],
        finish_reason: FinishReason::Length,
    }
}

/// The text of a caught panic's payload (`&str` or `String`), else a placeholder.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".into()
    }
}

/// Log-probability of token `id` under the softmax of `logits` (float64 accumulation).
pub fn logprob_of(logits: &[f32], id: u32) -> f32 {
    (logits[id as usize] as f64 - log_sum_exp(logits)) as f32
}

/// Counters of an [`Engine`]'s work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Decode steps run.
    pub steps: u64,
    /// Decode steps run while pages were on the vision stage (encoded or prefilled beside
    /// the decoding batch): how much of the stage's work overlapped decoding.
    pub overlapped_steps: u64,
    /// Pages a paged cache preempted (their blocks given back, their prompt and tokens
    /// recomputed later).
    pub preemptions: u64,
    /// Pages of a decode step that failed on a CUDA stream-capture collision, queued to be
    /// recomputed instead of failed (`engine/requeue.rs`).
    pub requeued: u64,
}

/// The scheduler. `max_batch` bounds how many requests decode together.
pub struct Engine<B: Backend> {
    pub backend: B,
    pub max_batch: usize,
    pub image_token_id: u32,
    /// Encodes admitted requests' images, and prefills them where the backend offers a
    /// [`crate::runtime::backend::PagePrefill`], on another thread while the batch decodes
    /// ([`crate::generation::vision`]); `None` does both during admission.
    pub vision: Option<VisionStage<B::Cache>>,
    /// What the engine has done so far, for `/metrics` and `bench`.
    pub stats: EngineStats,
    /// Arrival order of the next request.
    next_seq: u64,
    /// Times each request (by index) was queued again after a transient step failure.
    requeues: std::collections::HashMap<usize, u32>,
}

impl<B: Backend> Engine<B> {
    /// An engine over `backend`, with a vision stage when the backend offers an image
    /// encoder for one ([`Backend::stage_handles`]), which also prefills when the backend
    /// offers that.
    pub fn new(backend: B, max_batch: usize, image_token_id: u32) -> Engine<B> {
        let vision = backend
            .stage_handles()
            .map(|h| VisionStage::start(h.encoder, h.prefill));
        Engine {
            backend,
            max_batch,
            image_token_id,
            vision,
            stats: EngineStats::default(),
            next_seq: 0,
            requeues: std::collections::HashMap::new(),
        }
    }

    /// The prefill of `req` on this thread, after the `generated` tokens it had before a
    /// preemption (none for a new request).
    fn prefill(
        &mut self,
        req: &GenRequest,
        generated: &[u32],
    ) -> Result<(Vec<f32>, B::Cache), BackendError> {
        let feats = req
            .images
            .iter()
            .map(|p| self.backend.encode_image(p))
            .collect::<Result<Vec<_>, _>>()?;
        prefill_resumed(
            &mut self.backend,
            &req.prompt_ids,
            self.image_token_id,
            &feats,
            generated,
        )
    }

    /// Drops the vision stage's finished results of requests no longer in `batch` (removed
    /// while their pages were on the stage), so that the cache sequences they hold are free
    /// again; keeps the others for [`Engine::step`]. With an empty batch and a full cache the
    /// stage's outstanding work is all that can free a sequence, so it waits for it.
    fn reap(&mut self, batch: &Batch<B::Cache>) {
        let Some(stage) = self.vision.as_mut() else {
            return;
        };
        let mut kept = Vec::new();
        while stage.outstanding() > kept.len() {
            let starved = batch.is_empty() && self.backend.kv_capacity().free() == Some(0);
            let Some(done) = stage.next(starved) else {
                break;
            };
            if batch.waiting.iter().any(|w| w.ticket == done.ticket) {
                kept.push(done);
            }
        }
        kept.into_iter().for_each(|d| stage.hold(d));
    }

    /// Prefills the waiting requests whose image features are back and moves them into the
    /// decoding batch. Waits for the next one when nothing else could run (`wait` and no
    /// request decoding). A failed encoding or prefill fails that request alone.
    fn start_encoded(
        &mut self,
        batch: &mut Batch<B::Cache>,
        on_event: &mut dyn FnMut(Event) -> Flow,
    ) {
        let Some(stage) = self.vision.as_mut() else {
            return;
        };
        while !batch.waiting.is_empty() {
            let Some(done) = stage.next(batch.active.is_empty()) else {
                if batch.active.is_empty() {
                    // The stage stopped: nothing will come back for the waiting requests.
                    for w in batch.waiting.drain(..) {
                        on_event(Event::Done {
                            index: w.index,
                            result: &Err(EngineError::Internal("the vision stage stopped".into())),
                        });
                    }
                }
                return;
            };
            // Results of requests removed meanwhile have no waiting entry.
            let Some(pos) = batch.waiting.iter().position(|w| w.ticket == done.ticket) else {
                continue;
            };
            if !admission::has_blocks_for(self.backend.kv_capacity(), &batch.waiting[pos]) {
                // A lone page grew into the blocks set aside for this prompt: it waits until
                // blocks are given back.
                stage.hold(done);
                return;
            }
            let w = batch.waiting.remove(pos).expect("found above");
            let generated = &w.out.token_ids;
            let started = done.result.and_then(|staged| match staged {
                Staged::Prefilled { logits, cache } => Ok((logits, cache)),
                Staged::Features(f) => prefill_resumed(
                    &mut self.backend,
                    &w.req.prompt_ids,
                    self.image_token_id,
                    &f,
                    generated,
                ),
            });
            let cached = w.req.prompt_ids.len() + generated.len();
            match started {
                Ok((logits, cache)) => batch.active.push(Active {
                    index: w.index,
                    req: w.req,
                    sampler: w.sampler,
                    logits,
                    device_choice: None,
                    cache,
                    out: w.out,
                    seq: w.seq,
                    cached,
                }),
                Err(e) => {
                    on_event(Event::Done {
                        index: w.index,
                        result: &Err(EngineError::Runtime(e.to_string())),
                    });
                }
            }
        }
    }

    /// Adds request `index` to `batch` after running its prefill (or, with a vision stage
    /// and images, after queueing them: `step` prefills it later). A request that cannot
    /// start (invalid sampling parameters, a failing prefill) or needs no token
    /// (`max_new_tokens == 0`) is reported through `on_event` as `Done` right away.
    pub fn admit(
        &mut self,
        batch: &mut Batch<B::Cache>,
        index: usize,
        req: GenRequest,
        on_event: &mut dyn FnMut(Event) -> Flow,
    ) {
        let sampler = match Sampler::new(req.params.clone()) {
            Ok(s) => s,
            Err(e) => {
                on_event(Event::Done {
                    index,
                    result: &Err(EngineError::InvalidParams(e.to_string())),
                });
                return;
            }
        };
        if req.max_new_tokens == 0 {
            on_event(Event::Done {
                index,
                result: &Ok(empty_generation()),
            });
            return;
        }
        // A request that would outgrow a fixed-size cache fails now, alone, rather than
        // failing the decode step it would share with others (the last token is never fed
        // back, so it needs no position). A paged pool bounds it by the whole pool: such a
        // request can always finish, alone if need be.
        if let Some(cap) = self.backend.kv_capacity().max_positions() {
            let need = req.prompt_ids.len() + req.max_new_tokens - 1;
            if need > cap {
                on_event(Event::Done {
                    index,
                    result: &Err(EngineError::TooLong {
                        prompt: req.prompt_ids.len(),
                        max_new: req.max_new_tokens,
                        need,
                        cap,
                    }),
                });
                return;
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let queued = admission::Queued {
            index,
            req,
            sampler,
            out: empty_generation(),
            seq,
        };
        if self.backend.kv_capacity().block_size().is_some() {
            // Started now if its prompt's blocks are free, else when pages give theirs back.
            batch.queued.push_back(queued);
            self.start_queued(batch, on_event);
        } else {
            self.start(batch, queued, 0, on_event);
        }
    }

    /// One step: first the prefill of waiting requests whose image features are back (it
    /// waits for the vision stage only when nothing else is decoding), then a token for every
    /// request in `batch`, finished requests retired (`Done`), then one decoder step for the
    /// rest. A decoder failure fails every request of the step.
    pub fn step(&mut self, batch: &mut Batch<B::Cache>, on_event: &mut dyn FnMut(Event) -> Flow) {
        self.start_queued(batch, on_event);
        self.start_encoded(batch, on_event);
        let mut keep = Vec::with_capacity(batch.active.len());
        for a in batch.active.drain(..) {
            keep.extend(take_token(a, on_event));
        }
        let keep = self.preempt_for_growth(batch, keep);
        if keep.is_empty() {
            return;
        }
        self.decode_step(batch, keep, on_event);
    }

    /// One decoder step for the requests of `keep` (each fed its last token); they go back
    /// into `batch` with their next logits, or are requeued or failed when the step fails.
    fn decode_step(
        &mut self,
        batch: &mut Batch<B::Cache>,
        keep: Vec<Active<B::Cache>>,
        on_event: &mut dyn FnMut(Event) -> Flow,
    ) {
        let tokens: Vec<u32> = keep
            .iter()
            .map(|a| *a.out.token_ids.last().expect("one token chosen"))
            .collect();
        let need: Vec<RowNeed> = keep.iter().map(|a| need::row_need(&a.req)).collect();
        let mut rows = Vec::with_capacity(keep.len());
        let mut caches = Vec::with_capacity(keep.len());
        for a in keep {
            caches.push(a.cache);
            rows.push(StepRow {
                index: a.index,
                req: a.req,
                sampler: a.sampler,
                out: a.out,
                seq: a.seq,
                cached: a.cached + 1,
            });
        }
        self.stats.steps += 1;
        self.stats.overlapped_steps += u64::from(!batch.waiting.is_empty());
        match self.backend.decode_batch_select(&tokens, caches, &need) {
            Ok((logits, caches)) => {
                for (row, ((mut m, l), c)) in rows.into_iter().zip(logits).zip(caches).enumerate() {
                    let Some((logits, device_choice)) = self.row_logits(&mut m, l, row, on_event)
                    else {
                        continue;
                    };
                    batch.active.push(Active {
                        index: m.index,
                        req: m.req,
                        sampler: m.sampler,
                        logits,
                        device_choice,
                        cache: c,
                        out: m.out,
                        seq: m.seq,
                        cached: m.cached,
                    });
                }
            }
            Err(e) => self.fail_step(batch, rows, &e, on_event),
        }
    }

    /// Row `row`'s logits of a decode step, or its token already chosen from the device's
    /// argmax or candidates; `None` (the request failed, `Done` sent) when its candidates
    /// needed the full logits and the backend could not give them.
    fn row_logits(
        &mut self,
        m: &mut StepRow,
        l: StepLogits,
        row: usize,
        on_event: &mut dyn FnMut(Event) -> Flow,
    ) -> Option<(Vec<f32>, Option<need::Chosen>)> {
        match l {
            StepLogits::Full(l) => Some((l, None)),
            StepLogits::Argmax(id) => Some((
                Vec::new(),
                Some(need::Chosen {
                    id,
                    logprob: None,
                    top: Vec::new(),
                }),
            )),
            StepLogits::Candidates { top, vocab, lse } => {
                let history = &m.out.token_ids;
                let b = &mut self.backend;
                let (r, s) = (&m.req, &mut m.sampler);
                match need::from_candidates(b, r, s, &top, vocab, lse, history, row) {
                    Ok(choice) => Some(choice),
                    Err(e) => {
                        on_event(Event::Done {
                            index: m.index,
                            result: &Err(EngineError::Runtime(e.to_string())),
                        });
                        None
                    }
                }
            }
        }
    }

    /// A failed decode step: each of its requests queued again when the failure is one to
    /// recompute it after ([`Engine::requeue`]), else failed.
    fn fail_step(
        &mut self,
        batch: &mut Batch<B::Cache>,
        rows: Vec<StepRow>,
        e: &BackendError,
        on_event: &mut dyn FnMut(Event) -> Flow,
    ) {
        let r = Err(EngineError::Runtime(e.to_string()));
        for m in rows {
            let q = admission::Queued {
                index: m.index,
                req: m.req,
                sampler: m.sampler,
                out: m.out,
                seq: m.seq,
            };
            if let Some(q) = self.requeue(batch, q, e) {
                on_event(Event::Done {
                    index: q.index,
                    result: &r,
                });
            }
        }
    }

    /// Runs all `requests` to completion, pulling them lazily (at most `max_batch` are
    /// held at once); `on_event` sees every token and completion. Results are in request
    /// order. `requests` is asked again after each step once it has returned `None`: a
    /// caller may add requests from `on_event` (retries, [`crate::generation::outcome`]).
    pub fn run(
        &mut self,
        requests: impl IntoIterator<Item = GenRequest>,
        on_event: &mut dyn FnMut(Event),
    ) -> Vec<Result<Generation, EngineError>> {
        let mut results: Vec<Option<Result<Generation, EngineError>>> = Vec::new();
        let mut requests = requests.into_iter();
        // One request pulled ahead (as a peek would), never cached as `None`.
        let mut pending = requests.next();
        let mut index = 0;
        let mut batch = Batch::new();
        let mut record = |ev: Event| {
            if let Event::Done { index, result } = &ev {
                if results.len() <= *index {
                    results.resize_with(index + 1, || None);
                }
                results[*index] = Some((*result).clone());
            }
            on_event(ev);
            Flow::Continue
        };
        while pending.is_some() || !batch.is_empty() {
            while self.has_room(&batch) {
                let Some(req) = pending.take() else {
                    break;
                };
                self.admit(&mut batch, index, req, &mut record);
                index += 1;
                pending = requests.next();
            }
            if !batch.is_empty() {
                self.step(&mut batch, &mut record);
            }
            if pending.is_none() {
                pending = requests.next();
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or(Err(EngineError::NeverScheduled)))
            .collect()
    }
}

/// A request of a decode step while the backend holds its cache.
struct StepRow {
    index: usize,
    req: GenRequest,
    sampler: Sampler,
    out: Generation,
    seq: u64,
    /// Positions its cache holds once the step has fed its last token.
    cached: usize,
}

/// Request `a`'s next token: chosen, reported (`Token`), and the request retired (`Done`)
/// when it finished, was cancelled or its choice panicked; else it goes on decoding.
fn take_token<C>(mut a: Active<C>, on_event: &mut dyn FnMut(Event) -> Flow) -> Option<Active<C>> {
    // A panic while choosing one request's token (a bug, or logits a backend got wrong) fails
    // that request only; the others and the engine go on.
    let (id, logprob, top) = match catch_unwind(AssertUnwindSafe(|| choose_token(&mut a))) {
        Ok(c) => c,
        Err(panic) => {
            on_event(Event::Done {
                index: a.index,
                result: &Err(EngineError::Internal(panic_message(panic.as_ref()))),
            });
            return None;
        }
    };
    a.out.token_ids.push(id);
    let flow = on_event(Event::Token {
        index: a.index,
        id,
        logprob,
        top: &top,
    });
    if let Some(lp) = logprob {
        a.out.logprobs.push(lp);
    }
    if a.req.top_logprobs > 0 {
        a.out.top_logprobs.push(top);
    }
    if flow == Flow::Cancel {
        on_event(Event::Done {
            index: a.index,
            result: &Err(EngineError::Cancelled),
        });
        return None;
    }
    let stop = flow == Flow::Finish || (!a.req.ignore_eos && a.req.stop_ids.contains(&id));
    if stop {
        a.out.finish_reason = FinishReason::Stop;
    } else if a.sampler.loop_detected(&a.out.token_ids) {
        a.out.finish_reason = FinishReason::Repetition;
    }
    if stop
        || a.out.finish_reason == FinishReason::Repetition
        || a.out.token_ids.len() >= a.req.max_new_tokens
    {
        let out = std::mem::replace(&mut a.out, empty_generation());
        on_event(Event::Done {
            index: a.index,
            result: &Ok(out),
        });
        return None;
    }
    Some(a)
}

/// Request `a`'s next token with its log-probability and top log-probabilities (when asked):
/// the device's choice, else drawn by its sampler from its logits. Log-probabilities are of
/// the raw distribution: read before the sampler applies penalties and temperature in place.
fn choose_token<C>(a: &mut Active<C>) -> (u32, Option<f32>, Vec<TokenLogprob>) {
    // Chosen already, from the device's argmax or candidates.
    if let Some(c) = a.device_choice.take() {
        return (c.id, c.logprob, c.top);
    }
    let top = if a.req.top_logprobs > 0 {
        argmax_and_top_k(&a.logits, a.req.top_logprobs).1
    } else {
        Vec::new()
    };
    let raw = (a.req.logprobs || a.req.top_logprobs > 0)
        .then(|| (a.logits.clone(), log_sum_exp(&a.logits)));
    let id = a.sampler.next(&mut a.logits, &a.out.token_ids);
    let logprob = raw.map(|(l, lse)| (l[id as usize] as f64 - lse) as f32);
    (id, logprob, top)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod flow_tests;

#[cfg(test)]
mod paged_tests;
