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
//! Where the backend offers an image encoder ([`Backend::image_encoder`], a GPU), the engine
//! runs a [`VisionStage`]: `admit` hands a request's images to it and the request waits in
//! the batch, holding its place and its cache sequence, while `step` goes on decoding the
//! others; `step` prefills it once its features are back.
//!
//! ```
//! use ocrctl::generation::engine::{Batch, Engine, Event, Flow};
//! # use ocrctl::runtime::backend::{Backend, BackendError};
//! # use ndarray::{Array2, Array4};
//! # struct Echo;
//! # impl Backend for Echo {
//! #     type Cache = ();
//! #     fn hidden_size(&self) -> usize { 1 }
//! #     fn encode_image(&mut self, _: &Array4<f32>) -> Result<Array2<f32>, BackendError> { unreachable!() }
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
    argmax_and_top_k, log_sum_exp, prefill, FinishReason, Generation,
};
use crate::generation::sampling::Sampler;
use crate::generation::vision::{PrefillJob, Staged, VisionStage};
use crate::runtime::backend::{Backend, BackendError, RowNeed, StepLogits};

mod need;
mod request;
pub use request::{EngineError, Event, Flow, GenRequest};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};

struct Active<C> {
    index: usize,
    req: GenRequest,
    sampler: Sampler,
    logits: Vec<f32>,
    /// The next token when it was chosen from the device's argmax or candidates (`logits`
    /// is then empty).
    device_choice: Option<need::Chosen>,
    cache: C,
    out: Generation,
}

/// A request admitted while its images are encoded (and perhaps its prompt prefilled) on the
/// vision stage.
struct Waiting {
    index: usize,
    req: GenRequest,
    sampler: Sampler,
    ticket: u64,
    /// Whether its cache sequence was reserved at admission (the stage prefills it);
    /// otherwise the prefill takes one when the features are back.
    reserved: bool,
}

/// The requests being decoded together, with their caches, and those admitted whose images
/// the vision stage is still encoding (they hold their place in the batch).
pub struct Batch<C> {
    active: Vec<Active<C>>,
    waiting: VecDeque<Waiting>,
}

impl<C> Default for Batch<C> {
    fn default() -> Self {
        Batch {
            active: Vec::new(),
            waiting: VecDeque::new(),
        }
    }
}

impl<C> Batch<C> {
    /// An empty batch.
    pub fn new() -> Self {
        Batch::default()
    }

    /// Requests in the batch (decoding, or waiting for their image features).
    pub fn len(&self) -> usize {
        self.active.len() + self.waiting.len()
    }

    /// Whether no request is in the batch.
    pub fn is_empty(&self) -> bool {
        self.active.is_empty() && self.waiting.is_empty()
    }

    /// Requests admitted whose image features are still being computed.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The caller ids of the requests in the batch (decoding first, then waiting).
    pub fn indices(&self) -> Vec<usize> {
        let waiting = self.waiting.iter().map(|w| w.index);
        self.active.iter().map(|a| a.index).chain(waiting).collect()
    }

    /// Removes request `index`, returning what it generated so far.
    pub fn remove(&mut self, index: usize) -> Option<Generation> {
        if let Some(pos) = self.waiting.iter().position(|w| w.index == index) {
            self.waiting.remove(pos);
            return Some(empty_generation());
        }
        let pos = self.active.iter().position(|a| a.index == index)?;
        Some(self.active.remove(pos).out)
    }
}

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

/// The scheduler. `max_batch` bounds how many requests decode together.
pub struct Engine<B: Backend> {
    pub backend: B,
    pub max_batch: usize,
    pub image_token_id: u32,
    /// Encodes admitted requests' images, and prefills them where the backend offers a
    /// [`crate::runtime::backend::PagePrefill`], on another thread while the batch decodes
    /// ([`crate::generation::vision`]); `None` does both during admission.
    pub vision: Option<VisionStage<B::Cache>>,
}

impl<B: Backend> Engine<B> {
    /// An engine over `backend`, with a vision stage when the backend offers an image
    /// encoder for one ([`Backend::image_encoder`]), which also prefills when the backend
    /// offers that ([`Backend::page_prefill`]).
    pub fn new(backend: B, max_batch: usize, image_token_id: u32) -> Engine<B> {
        let vision = backend
            .image_encoder()
            .map(|enc| VisionStage::start(enc, backend.page_prefill()));
        Engine {
            backend,
            max_batch,
            image_token_id,
            vision,
        }
    }

    fn prefill(&mut self, req: &GenRequest) -> Result<(Vec<f32>, B::Cache), BackendError> {
        let feats = req
            .images
            .iter()
            .map(|p| self.backend.encode_image(p))
            .collect::<Result<Vec<_>, _>>()?;
        prefill(
            &mut self.backend,
            &req.prompt_ids,
            self.image_token_id,
            &feats,
        )
    }

    /// Whether `batch` has room for another request: fewer than `max_batch` decoding or
    /// waiting for image features, and a free sequence in the backend's cache for each
    /// waiting one without a reserved sequence and this one when it has a fixed cache (a full
    /// cache makes new requests wait for a running one to finish instead of failing).
    pub fn has_room(&mut self, batch: &Batch<B::Cache>) -> bool {
        self.reap(batch);
        let unreserved = batch.waiting.iter().filter(|w| !w.reserved).count();
        batch.len() < self.max_batch.max(1)
            && self
                .backend
                .free_sequences()
                .is_none_or(|free| free > unreserved)
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
            let starved = batch.is_empty() && self.backend.free_sequences() == Some(0);
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
            let w = batch.waiting.remove(pos).expect("found above");
            let started = done.result.and_then(|staged| match staged {
                Staged::Prefilled { logits, cache } => Ok((logits, cache)),
                Staged::Features(f) => prefill(
                    &mut self.backend,
                    &w.req.prompt_ids,
                    self.image_token_id,
                    &f,
                ),
            });
            match started {
                Ok((logits, cache)) => batch.active.push(Active {
                    index: w.index,
                    req: w.req,
                    sampler: w.sampler,
                    logits,
                    device_choice: None,
                    cache,
                    out: empty_generation(),
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
        mut req: GenRequest,
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
        // back, so it needs no position).
        if let Some(cap) = self.backend.max_positions() {
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
        if let Some(stage) = self.vision.as_mut().filter(|_| !req.images.is_empty()) {
            // The stage prefills too when it can and the backend sets a sequence aside.
            let prefill = stage
                .prefills()
                .then(|| self.backend.reserve(req.prompt_ids.len()))
                .flatten()
                .map(|cache| PrefillJob {
                    prompt_ids: req.prompt_ids.clone(),
                    image_token_id: self.image_token_id,
                    cache,
                });
            let reserved = prefill.is_some();
            let ticket = stage.submit(std::mem::take(&mut req.images), prefill);
            batch.waiting.push_back(Waiting {
                index,
                req,
                sampler,
                ticket,
                reserved,
            });
            return;
        }
        match self.prefill(&req) {
            Ok((logits, cache)) => batch.active.push(Active {
                index,
                req,
                sampler,
                logits,
                device_choice: None,
                cache,
                out: empty_generation(),
            }),
            Err(e) => {
                on_event(Event::Done {
                    index,
                    result: &Err(EngineError::Runtime(e.to_string())),
                });
            }
        }
    }

    /// One step: first the prefill of waiting requests whose image features are back (it
    /// waits for the vision stage only when nothing else is decoding), then a token for every
    /// request in `batch`, finished requests retired (`Done`), then one decoder step for the
    /// rest. A decoder failure fails every request of the step.
    pub fn step(&mut self, batch: &mut Batch<B::Cache>, on_event: &mut dyn FnMut(Event) -> Flow) {
        self.start_encoded(batch, on_event);
        let mut keep = Vec::with_capacity(batch.active.len());
        for mut a in batch.active.drain(..) {
            // Log-probabilities are of the raw distribution: read them before the sampler
            // applies penalties and temperature in place (only when the request asks).
            // A panic while choosing one request's token (a bug, or logits a backend got
            // wrong) fails that request only; the others and the engine go on.
            let chosen = catch_unwind(AssertUnwindSafe(|| {
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
            }));
            let (id, logprob, top) = match chosen {
                Ok(c) => c,
                Err(panic) => {
                    on_event(Event::Done {
                        index: a.index,
                        result: &Err(EngineError::Internal(panic_message(panic.as_ref()))),
                    });
                    continue;
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
                continue;
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
            } else {
                keep.push(a);
            }
        }
        if keep.is_empty() {
            return;
        }
        let tokens: Vec<u32> = keep
            .iter()
            .map(|a| *a.out.token_ids.last().expect("one token chosen"))
            .collect();
        let need: Vec<RowNeed> = keep.iter().map(|a| need::row_need(&a.req)).collect();
        let mut metas = Vec::with_capacity(keep.len());
        let mut caches = Vec::with_capacity(keep.len());
        for a in keep {
            caches.push(a.cache);
            metas.push((a.index, a.req, a.sampler, a.out));
        }
        match self.backend.decode_batch_select(&tokens, caches, &need) {
            Ok((logits, caches)) => {
                for (row, ((mut m, l), c)) in metas.into_iter().zip(logits).zip(caches).enumerate()
                {
                    let (logits, device_choice) = match l {
                        StepLogits::Full(l) => (l, None),
                        StepLogits::Argmax(id) => (
                            Vec::new(),
                            Some(need::Chosen {
                                id,
                                logprob: None,
                                top: Vec::new(),
                            }),
                        ),
                        StepLogits::Candidates { top, vocab, lse } => {
                            let history = &m.3.token_ids;
                            let b = &mut self.backend;
                            let (r, s) = (&m.1, &mut m.2);
                            match need::from_candidates(b, r, s, &top, vocab, lse, history, row) {
                                Ok(choice) => choice,
                                Err(e) => {
                                    on_event(Event::Done {
                                        index: m.0,
                                        result: &Err(EngineError::Runtime(e.to_string())),
                                    });
                                    continue;
                                }
                            }
                        }
                    };
                    batch.active.push(Active {
                        index: m.0,
                        req: m.1,
                        sampler: m.2,
                        logits,
                        device_choice,
                        cache: c,
                        out: m.3,
                    });
                }
            }
            Err(e) => {
                let r = Err(EngineError::Runtime(e.to_string()));
                for m in metas {
                    on_event(Event::Done {
                        index: m.0,
                        result: &r,
                    });
                }
            }
        }
    }

    /// Runs all `requests` to completion, pulling them lazily (at most `max_batch` are
    /// held at once); `on_event` sees every token and completion. Results are in request
    /// order.
    pub fn run(
        &mut self,
        requests: impl IntoIterator<Item = GenRequest>,
        on_event: &mut dyn FnMut(Event),
    ) -> Vec<Result<Generation, EngineError>> {
        let mut results: Vec<Option<Result<Generation, EngineError>>> = Vec::new();
        let mut pending = requests.into_iter().enumerate().peekable();
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
        while pending.peek().is_some() || !batch.is_empty() {
            while self.has_room(&batch) {
                let Some((index, req)) = pending.next() else {
                    break;
                };
                self.admit(&mut batch, index, req, &mut record);
            }
            if !batch.is_empty() {
                self.step(&mut batch, &mut record);
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or(Err(EngineError::NeverScheduled)))
            .collect()
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::generation::sampling::SamplingParams;
    use crate::runtime::fake::FakeBackend;
    use ndarray::Array4;

    fn req(prompt: Vec<u32>, max: usize, w: usize) -> GenRequest {
        GenRequest {
            prompt_ids: prompt,
            images: vec![Array4::zeros((1, 3, 1, w))],
            params: SamplingParams::greedy(),
            max_new_tokens: max,
            stop_ids: vec![0],
            ignore_eos: false,
            logprobs: true,
            top_logprobs: 2,
        }
    }

    /// `reqs` run to completion through `b` at batch 4: each request's generation, and how
    /// many rows the backend answered with candidates and how many full rows were fetched.
    fn run_fake(b: FakeBackend, reqs: &[GenRequest]) -> (Vec<Generation>, usize, usize) {
        let mut e = Engine::new(b, 4, 99);
        let r = e.run(reqs.to_vec(), &mut |_| {});
        let gens = r.into_iter().map(|g| g.unwrap()).collect();
        (
            gens,
            e.backend.candidate_rows,
            e.backend.step_logits_fetches,
        )
    }

    #[test]
    fn batched_results_equal_one_at_a_time_and_requests_join_and_leave() {
        let reqs: Vec<GenRequest> = (0..7)
            .map(|i| req(vec![1, 99, 2 + i], 3 + i as usize * 2, 5 + i as usize))
            .collect();
        let run = |max_batch| {
            let mut e = Engine::new(FakeBackend::sum(97), max_batch, 99);
            let mut tokens = 0;
            let r = e.run(reqs.clone(), &mut |ev| {
                if let Event::Token { .. } = ev {
                    tokens += 1
                }
            });
            (r, e.backend.max_batch_seen, tokens)
        };
        let (one, seen1, _) = run(1);
        let (four, seen4, tokens) = run(4);
        assert_eq!(seen1, 1);
        assert_eq!(seen4, 4);
        let ids = |r: &Vec<Result<Generation, EngineError>>| {
            r.iter()
                .map(|g| g.as_ref().unwrap().token_ids.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&one), ids(&four));
        assert_eq!(tokens, ids(&four).iter().map(|v| v.len()).sum::<usize>());
        for (i, g) in four.iter().enumerate() {
            assert_eq!(
                g.as_ref().unwrap().token_ids.len(),
                3 + i * 2,
                "request {i} ran to its own max_new_tokens"
            );
        }
    }

    #[test]
    fn sampling_from_device_candidates_equals_sampling_from_full_logits() {
        // Seeded sampling requests among greedy ones and one that wants log-probabilities,
        // through a backend that answers sampling rows with 8 candidates: the same tokens as
        // from full logits. A peaked model is decided by the candidates; a flat one falls
        // back to the step's full row for every sampling row.
        let reqs: Vec<GenRequest> = (0..6)
            .map(|i| {
                let mut r = req(vec![1, 99, 2 + i], 12, 5 + i as usize);
                r.logprobs = i == 5;
                r.top_logprobs = 0;
                if i % 3 != 0 {
                    r.params = SamplingParams {
                        temperature: 0.7,
                        top_p: 0.9,
                        seed: Some(i as u64),
                        ..SamplingParams::greedy()
                    };
                }
                r
            })
            .collect();
        let run = |b: FakeBackend| {
            let (gens, rows, fetches) = run_fake(b, &reqs);
            let ids: Vec<Vec<u32>> = gens.into_iter().map(|g| g.token_ids).collect();
            (ids, rows, fetches)
        };
        for peak in [10.0, 0.05] {
            let (full, rows, _) = run(FakeBackend::sum(97).peak(peak));
            assert_eq!(rows, 0);
            let (cands, rows, fetches) = run(FakeBackend::sum(97).peak(peak).candidates(8));
            assert_eq!(full, cands, "peak {peak}");
            assert!(rows > 10, "peak {peak}: {rows} candidate rows");
            let expected = if peak > 1.0 { 0 } else { rows };
            assert_eq!(fetches, expected, "peak {peak}");
        }
    }

    #[test]
    fn log_probabilities_and_penalties_from_candidates_equal_the_full_path() {
        // Greedy and sampling requests with log-probabilities (top 2, and top 12: more than
        // the 8 candidates), repetition penalties above and below 1 and presence and
        // frequency penalties of both signs, through a backend
        // that answers with 8 candidates (with and without the log-normaliser): the same
        // tokens, log-probabilities and top lists as from full logits.
        let reqs: Vec<GenRequest> = (0..8)
            .map(|i| {
                let mut r = req(vec![1, 99, 2 + i], 12, 5 + i as usize);
                r.logprobs = i % 2 == 0;
                r.top_logprobs = [2, 0, 12, 0][i as usize % 4];
                r.params = SamplingParams {
                    temperature: if i < 4 { 0.0 } else { 0.7 },
                    top_p: 0.9,
                    repetition_penalty: [1.0, 1.3, 0.8, 1.1][i as usize % 4],
                    presence_penalty: [0.0, 0.0, 0.6, -0.4, 1.0, -1.5, 0.0, 2.0][i as usize],
                    frequency_penalty: [0.0, 0.5, 0.0, 0.3, -0.2, 0.0, 0.0, -2.0][i as usize],
                    seed: Some(i as u64),
                    ..SamplingParams::greedy()
                };
                r
            })
            .collect();
        type Out = (
            Vec<u32>,
            Vec<f32>,
            Vec<Vec<crate::generation::generate::TokenLogprob>>,
        );
        let run = |b: FakeBackend| {
            let (gens, rows, fetches) = run_fake(b, &reqs);
            let out: Vec<Out> = gens
                .into_iter()
                .map(|g| (g.token_ids, g.logprobs, g.top_logprobs))
                .collect();
            (out, rows, fetches)
        };
        for peak in [10.0, 0.05] {
            let (full, rows, _) = run(FakeBackend::sum(97).peak(peak));
            assert_eq!(rows, 0);
            assert!(full.iter().all(|o| o.0.len() == 12), "{full:?}");
            let (cands, rows, fetches) = run(FakeBackend::sum(97).peak(peak).candidates(8));
            assert_eq!(full, cands, "peak {peak}");
            assert_eq!(rows, 8 * 11, "peak {peak}: every step after the first");
            // Peaked: only the top-12 rows (more than 8 candidates) need their full rows.
            if peak > 1.0 {
                assert_eq!(fetches, 2 * 11, "peak {peak}");
            } else {
                assert!(fetches > 2 * 11, "peak {peak}: {fetches}");
            }
            let (no_lse, _, fetches) = run(FakeBackend::sum(97)
                .peak(peak)
                .candidates(8)
                .without_logsumexp());
            assert_eq!(full, no_lse, "peak {peak}, no logsumexp");
            // Without the normaliser, every row with log-probabilities needs its full row.
            assert!(fetches >= 4 * 11, "peak {peak}: {fetches}");
        }
    }

    #[test]
    fn logit_biases_from_candidates_equal_the_full_path() {
        // Every even id banned (-100), small raises and lowerings, +100 on one id, each with
        // and without penalties, greedy and sampled, through a backend that answers with 8
        // candidates: the same tokens and (raw) log-probabilities as from full logits.
        let biases: [Vec<(u32, f32)>; 4] = [
            (0..97).step_by(2).map(|j| (j, -100.0)).collect(),
            vec![(3, 2.5), (40, -1.0), (41, 0.7)],
            vec![(11, 100.0)],
            vec![(5, -0.5), (6, 0.25)],
        ];
        let reqs: Vec<GenRequest> = (0..8)
            .map(|i| {
                let mut r = req(vec![1, 99, 2 + i], 12, 5 + i as usize);
                r.logprobs = i % 3 == 0;
                r.params = SamplingParams {
                    temperature: if i < 4 { 0.0 } else { 0.7 },
                    top_p: 0.9,
                    repetition_penalty: [1.0, 1.0, 1.0, 1.2, 0.9, 1.0, 1.0, 1.0][i as usize],
                    presence_penalty: [0.0, 0.5, 0.0, 0.0, 0.0, -0.5, 0.0, 0.0][i as usize],
                    logit_bias: crate::generation::sampling::logit_bias(
                        biases[i as usize % 4].iter().copied(),
                    ),
                    seed: Some(i as u64),
                    ..SamplingParams::greedy()
                };
                r
            })
            .collect();
        let run = |b: FakeBackend| {
            let (gens, rows, fetches) = run_fake(b, &reqs);
            let out: Vec<(Vec<u32>, Vec<f32>)> = gens
                .into_iter()
                .map(|g| (g.token_ids, g.logprobs))
                .collect();
            (out, rows, fetches)
        };
        for peak in [10.0, 0.05] {
            let (full, _, _) = run(FakeBackend::sum(97).peak(peak));
            let (cands, rows, fetches) = run(FakeBackend::sum(97).peak(peak).candidates(8));
            assert_eq!(full, cands, "peak {peak}");
            assert_eq!(rows, 8 * 11, "peak {peak}: every step after the first");
            // Decided from the candidates at least sometimes, not always (the +100 id lies
            // outside them).
            assert!(
                fetches > 0 && fetches < rows,
                "peak {peak}: {fetches} of {rows}"
            );
            // The bans hold, and +100 wins every greedy step without penalties (row 2).
            for i in [0, 4] {
                assert!(full[i].0.iter().all(|t| t % 2 == 1), "{i}: {:?}", full[i].0);
            }
            assert!(full[2].0.iter().all(|&t| t == 11), "{:?}", full[2].0);
        }
    }

    #[test]
    fn invalid_sampling_fails_only_that_request() {
        let mut bad = req(vec![1, 99, 2], 3, 5);
        bad.params.top_p = 2.0;
        let mut e = Engine::new(FakeBackend::sum(97), 2, 99);
        let r = e.run(vec![bad, req(vec![1, 99, 3], 3, 5)], &mut |_| {});
        let err = r[0].as_ref().unwrap_err();
        assert!(
            matches!(err, EngineError::InvalidParams(m) if m.contains("top_p")),
            "{err}"
        );
        assert!(err.is_client_error());
        assert_eq!(r[1].as_ref().unwrap().token_ids.len(), 3);
    }

    #[test]
    fn a_panic_while_sampling_fails_only_that_request() {
        let mut e = Engine::new(
            // A prompt holding id 66 gets empty logits: the sampler's precondition fails (a
            // panic) for that request alone.
            FakeBackend::sum(97).empty_logits_for(66),
            3,
            99,
        );
        let reqs = vec![
            req(vec![1, 99, 2], 4, 5),
            req(vec![66, 99, 2], 4, 5),
            req(vec![1, 99, 3], 4, 5),
        ];
        let r = e.run(reqs, &mut |_| {});
        let err = r[1].as_ref().unwrap_err();
        assert!(matches!(err, EngineError::Internal(_)), "{err:?}");
        assert!(
            err.to_string()
                .contains("internal error while choosing a token"),
            "{err}"
        );
        assert_eq!(r[0].as_ref().unwrap().token_ids.len(), 4);
        assert_eq!(r[2].as_ref().unwrap().token_ids.len(), 4);
        // The engine still serves after the panic.
        let again = e.run(vec![req(vec![1, 99, 2], 4, 5)], &mut |_| {});
        assert_eq!(
            again[0].as_ref().unwrap().token_ids,
            r[0].as_ref().unwrap().token_ids
        );
    }
}

#[cfg(test)]
mod flow_tests {
    use super::*;
    use crate::runtime::fake::FakeBackend;
    use ndarray::Array4;

    /// Next token = (last input + 1) mod 50; an image contributes its width as a feature, so
    /// merged image rows are visible in the output.
    fn engine() -> Engine<FakeBackend> {
        Engine::new(FakeBackend::successor(50).peak(3.0), 4, 9)
    }

    #[test]
    fn images_are_merged_in_prompt_order() {
        let mut r = GenRequest::text(vec![1, 9, 9], 2);
        r.images = vec![Array4::zeros((1, 3, 1, 20)), Array4::zeros((1, 3, 1, 30))];
        let out = engine().run(vec![r], &mut |_| {});
        // The last prompt row is the second image's feature (30) → 31, 32.
        assert_eq!(out[0].as_ref().unwrap().token_ids, vec![31, 32]);
        let mut bad = GenRequest::text(vec![1, 9, 9], 2);
        bad.images = vec![Array4::zeros((1, 3, 1, 20))];
        let out = engine().run(vec![bad], &mut |_| {});
        assert!(
            out[0]
                .as_ref()
                .unwrap_err()
                .to_string()
                .contains("2 image tokens"),
            "{out:?}"
        );
    }

    #[test]
    fn finish_and_cancel_leave_the_batch_and_others_continue() {
        let mut e = engine();
        let mut batch = Batch::new();
        let mut done: Vec<(usize, Result<Generation, EngineError>)> = Vec::new();
        let mut seen = [0usize; 3];
        for i in 0..3 {
            e.admit(
                &mut batch,
                i,
                GenRequest::text(vec![10 * i as u32], 6),
                &mut |_| Flow::Continue,
            );
        }
        assert_eq!(batch.indices(), vec![0, 1, 2]);
        while !batch.is_empty() {
            e.step(&mut batch, &mut |ev| match ev {
                Event::Token { index, .. } => {
                    seen[index] += 1;
                    match (index, seen[index]) {
                        (0, 2) => Flow::Finish,
                        (1, 3) => Flow::Cancel,
                        _ => Flow::Continue,
                    }
                }
                Event::Done { index, result } => {
                    done.push((index, result.clone()));
                    Flow::Continue
                }
            });
        }
        done.sort_by_key(|d| d.0);
        let g0 = done[0].1.as_ref().unwrap();
        assert_eq!(g0.token_ids, vec![1, 2]);
        assert_eq!(g0.finish_reason, FinishReason::Stop);
        assert_eq!(done[1].1.as_ref().unwrap_err(), &EngineError::Cancelled);
        let g2 = done[2].1.as_ref().unwrap();
        assert_eq!(g2.token_ids, vec![21, 22, 23, 24, 25, 26]);
        assert_eq!(g2.finish_reason, FinishReason::Length);
    }

    #[test]
    fn chosen_logprob_is_reported_even_outside_the_top_k() {
        let mut r = GenRequest::text(vec![4], 1);
        r.logprobs = true;
        r.params.temperature = 50.0; // nearly uniform: usually not the argmax
        r.params.seed = Some(3);
        let out = engine().run(vec![r], &mut |_| {});
        let g = out[0].as_ref().unwrap();
        let mut l = vec![0.0f32; 50];
        l[5] = 3.0;
        assert_eq!(g.logprobs.len(), 1);
        assert!((g.logprobs[0] - logprob_of(&l, g.token_ids[0])).abs() < 1e-6);
        let z: f64 = l.iter().map(|v| (*v as f64).exp()).sum();
        assert!((logprob_of(&l, 5) as f64 - (3.0 - z.ln())).abs() < 1e-6);
    }
}
