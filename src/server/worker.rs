//! The engine thread: a bounded queue of [`Job`]s feeding the continuous-batching
//! [`Engine`], and per-request text assembly (incremental UTF-8 detokenisation, stop
//! strings, log-probabilities) sent back to the HTTP handlers over channels.
//!
//! The model is loaded on this thread (ONNX Runtime sessions never cross threads). A job
//! whose client went away (its receiver dropped) is dropped from the queue, or cancelled at
//! the next step when it is already decoding; a job past its deadline gets a timeout.

use super::error::ApiError;
use super::metrics::Metrics;
use super::outbox::EventTx;
use super::queue::EngineSlot;
pub use super::queue::{ModelState, Shared};
use super::stops::StopMatcher;
use crate::generation::engine::{Batch, Engine, EngineError, Event, Flow, GenRequest};
use crate::generation::generate::{FinishReason, TokenLogprob};
use crate::model::prompt::{Prompter, StreamDecoder};
use crate::runtime::backend::Backend;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One request for the engine.
pub struct Job {
    /// The response id (`chatcmpl-…`, `ocr-…-pN`), for logs.
    pub id: String,
    pub req: GenRequest,
    /// Stop strings: generation ends before the first one the text contains.
    pub stop: Vec<String>,
    /// When the request was accepted (for time-to-first-token).
    pub accepted: Instant,
    pub deadline: Instant,
    /// Where the request's [`JobEvent`]s go; dropping the receiver, or leaving too much of
    /// them unread, cancels the job.
    pub events: EventTx,
}

/// A token as text, with its log-probability.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub id: u32,
    /// The token alone, detokenised.
    pub token: String,
    /// NaN when the engine gave none (it is then reported as `null`).
    pub logprob: f32,
}

/// A generated token and the likeliest alternatives at its step: what the handlers report
/// as a `logprobs.content` entry ([`super::openai::TokenLogprob`]). Detokenised here, where
/// the prompter lives, so that a handler needs no tokenizer.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub chosen: Candidate,
    pub top: Vec<Candidate>,
}

impl TokenLogprobs {
    /// Token `id` with `logprob` (if the engine gave one) and the alternatives `top`, their
    /// texts from `name`.
    fn of(
        id: u32,
        logprob: Option<f32>,
        top: &[TokenLogprob],
        name: &dyn Fn(u32) -> String,
    ) -> Self {
        let candidate = |id: u32, logprob: f32| Candidate {
            id,
            token: name(id),
            logprob,
        };
        TokenLogprobs {
            chosen: candidate(id, logprob.unwrap_or(f32::NAN)),
            top: top.iter().map(|t| candidate(t.id, t.logprob)).collect(),
        }
    }
}

/// What a handler hears about its job.
#[derive(Debug)]
pub enum JobEvent {
    /// More text (possibly empty while a multi-byte character is incomplete) and the
    /// log-probabilities of the tokens behind it (when the request asked for them).
    Delta {
        text: String,
        logprobs: Vec<TokenLogprobs>,
    },
    /// The job finished.
    Done {
        finish_reason: &'static str,
        /// The stop string that ended it, or why it was cut short (`repetition`).
        stop_reason: Option<String>,
        completion_tokens: usize,
    },
    /// The job failed.
    Failed(ApiError),
}

/// Text assembly of one running job.
struct Running {
    events: EventTx,
    decoder: StreamDecoder,
    text: String,
    /// Bytes of `text` already sent.
    sent: usize,
    stop: StopMatcher,
    stop_hit: Option<String>,
    want_logprobs: bool,
    pending_logprobs: Vec<TokenLogprobs>,
    accepted: Instant,
    last_token: Option<Instant>,
    deadline: Instant,
    tokens: usize,
    /// The response id, for logs.
    id: String,
    /// Tokens this job added to its engine's load (prompt + max new tokens).
    cost: u64,
}

impl Running {
    /// Appends a decoded piece; returns true when a stop string matched (the text is then
    /// cut where it starts). Work is proportional to the piece, not to the stop strings.
    fn push_text(&mut self, piece: &str) -> bool {
        let offset = self.text.len();
        self.text.push_str(piece);
        if let Some((at, i)) = self.stop.push(offset, piece) {
            self.stop_hit = Some(self.stop.stop(i).to_string());
            self.text.truncate(at.max(self.sent));
            return true;
        }
        false
    }

    /// Sends what is safe to send (all of it when `final_`).
    fn flush(&mut self, final_: bool) -> bool {
        let end = if final_ {
            self.text.len()
        } else {
            self.text.len() - self.stop.held_back()
        };
        if end <= self.sent && self.pending_logprobs.is_empty() {
            return true;
        }
        let text = self.text[self.sent..end.max(self.sent)].to_string();
        self.sent = end.max(self.sent);
        let logprobs = std::mem::take(&mut self.pending_logprobs);
        self.events.send(JobEvent::Delta { text, logprobs })
    }
}

/// How engine `me`'s thread runs: the loaded engine, the prompter for detokenisation.
pub fn run_worker<B: Backend>(
    mut engine: Engine<B>,
    prompter: Arc<Prompter>,
    shared: Arc<Shared>,
    me: usize,
) {
    shared.set_ready(me);
    // If this thread dies (a panic in a runtime), say so on /health; when no engine is left,
    // every queued job fails instead of leaving its client waiting; running jobs fail as
    // their senders drop.
    struct Guard<'a>(&'a Shared, usize);
    impl Drop for Guard<'_> {
        fn drop(&mut self) {
            self.0
                .set_failed(self.1, "the engine thread stopped unexpectedly".into());
        }
    }
    let _guard = Guard(&shared, me);
    let slot = &shared.engines[me];
    let mut batch: Batch<B::Cache> = Batch::new();
    let mut running: HashMap<usize, Running> = HashMap::new();
    let mut next_index = 0usize;
    let name = |id: u32| prompter.decode(&[id], false).unwrap_or_default();
    loop {
        loop {
            let room = engine.has_room(&batch);
            shared.set_room(me, room);
            if !room {
                break;
            }
            let idle = batch.is_empty();
            let Some(job) = shared.next_job(me, idle, Duration::from_millis(200)) else {
                break;
            };
            let index = next_index;
            next_index += 1;
            slot.admitted.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                request = %job.id,
                device = %slot.label,
                prompt_tokens = job.req.prompt_ids.len(),
                max_new_tokens = job.req.max_new_tokens,
                waited_ms = job.accepted.elapsed().as_millis() as u64,
                "admitted"
            );
            shared
                .metrics
                .prompt_tokens
                .fetch_add(job.req.prompt_ids.len() as u64, Ordering::Relaxed);
            running.insert(
                index,
                Running {
                    events: job.events,
                    decoder: prompter.stream_decoder(true),
                    text: String::new(),
                    sent: 0,
                    stop: StopMatcher::new(&job.stop),
                    stop_hit: None,
                    want_logprobs: job.req.logprobs,
                    pending_logprobs: Vec::new(),
                    accepted: job.accepted,
                    id: job.id,
                    last_token: None,
                    deadline: job.deadline,
                    tokens: 0,
                    cost: (job.req.prompt_ids.len() + job.req.max_new_tokens) as u64,
                },
            );
            engine.admit(&mut batch, index, job.req, &mut |ev| {
                on_event(&mut running, &shared, slot, me, &name, ev)
            });
            slot.batch_size.store(batch.len(), Ordering::Relaxed);
        }
        if batch.is_empty() {
            continue;
        }
        let n = batch.len();
        let t = Instant::now();
        let span = tracing::trace_span!("step", device = %slot.label, batch = n).entered();
        engine.step(&mut batch, &mut |ev| {
            on_event(&mut running, &shared, slot, me, &name, ev)
        });
        let secs = t.elapsed().as_secs_f64();
        tracing::trace!(ms = secs * 1e3, "decoder step");
        drop(span);
        if secs > 0.0 {
            shared
                .metrics
                .step_tokens_per_s
                .store((n as f64 / secs).to_bits(), Ordering::Relaxed);
        }
        slot.batch_size.store(batch.len(), Ordering::Relaxed);
        publish_activity(slot, &engine, &batch);
        shared.prune();
    }
}

/// Publishes where engine `slot`'s pages are and its counters, for `/metrics`.
fn publish_activity<B: Backend>(slot: &EngineSlot, engine: &Engine<B>, batch: &Batch<B::Cache>) {
    let a = super::queue::Activity {
        decoding: batch.decoding(),
        staging: batch.waiting(),
        queued_for_kv: batch.queued(),
        kv_free: engine.backend.kv_capacity().free(),
        stats: engine.stats,
    };
    *slot.activity.lock().unwrap_or_else(|e| e.into_inner()) = a;
}

fn on_event(
    running: &mut HashMap<usize, Running>,
    shared: &Shared,
    slot: &EngineSlot,
    me: usize,
    name: &dyn Fn(u32) -> String,
    ev: Event,
) -> Flow {
    let metrics: &Metrics = &shared.metrics;
    match ev {
        Event::Token {
            index,
            id,
            logprob,
            top,
        } => {
            let Some(r) = running.get_mut(&index) else {
                return Flow::Cancel;
            };
            let now = Instant::now();
            match r.last_token {
                None => metrics
                    .time_to_first_token
                    .observe((now - r.accepted).as_secs_f64()),
                Some(t) => metrics.inter_token_latency.observe((now - t).as_secs_f64()),
            }
            r.last_token = Some(now);
            r.tokens += 1;
            metrics.generated_tokens.fetch_add(1, Ordering::Relaxed);
            slot.generated.fetch_add(1, Ordering::Relaxed);
            if (r.tokens as u64) < r.cost {
                slot.load_tokens.fetch_sub(1, Ordering::AcqRel);
            }
            if now > r.deadline {
                let secs = r.deadline.saturating_duration_since(r.accepted).as_secs();
                let _ = r.events.send(JobEvent::Failed(ApiError::Timeout { secs }));
                return Flow::Cancel;
            }
            let piece = match r.decoder.push(id) {
                Ok(p) => p.unwrap_or_default(),
                Err(e) => {
                    let _ = r
                        .events
                        .send(JobEvent::Failed(ApiError::Engine(e.to_string())));
                    return Flow::Cancel;
                }
            };
            if r.want_logprobs {
                r.pending_logprobs
                    .push(TokenLogprobs::of(id, logprob, top, name));
            }
            let stopped = r.push_text(&piece);
            if !r.flush(false) {
                return Flow::Cancel;
            }
            if stopped {
                Flow::Finish
            } else {
                Flow::Continue
            }
        }
        Event::Done { index, result } => {
            let Some(mut r) = running.remove(&index) else {
                return Flow::Continue;
            };
            shared.release(me, r.cost.saturating_sub(r.tokens as u64));
            tracing::debug!(
                request = %r.id,
                device = %slot.label,
                tokens = r.tokens,
                seconds = r.accepted.elapsed().as_secs_f64(),
                outcome = match &result {
                    Ok(_) => "done",
                    Err(EngineError::Cancelled) => "cancelled",
                    Err(_) => "failed",
                },
                "finished"
            );
            metrics
                .request_duration
                .observe(r.accepted.elapsed().as_secs_f64());
            match result {
                Ok(g) => {
                    if r.stop_hit.is_none() {
                        if let Ok(Some(rest)) = r.decoder.finish() {
                            r.push_text(&rest);
                        }
                    }
                    r.flush(true);
                    let (finish_reason, stop_reason) = match (g.finish_reason, &r.stop_hit) {
                        (_, Some(s)) => ("stop", Some(s.clone())),
                        (FinishReason::Stop, None) => ("stop", None),
                        (FinishReason::Length, None) => ("length", None),
                        (FinishReason::Repetition, None) => ("length", Some("repetition".into())),
                    };
                    let _ = r.events.send(JobEvent::Done {
                        finish_reason,
                        stop_reason,
                        completion_tokens: g.token_ids.len(),
                    });
                }
                Err(EngineError::Cancelled) => {}
                Err(e) if e.is_client_error() => {
                    let _ = r
                        .events
                        .send(JobEvent::Failed(ApiError::invalid(e.to_string())));
                }
                Err(e) => {
                    let _ = r
                        .events
                        .send(JobEvent::Failed(ApiError::Engine(e.to_string())));
                }
            }
            Flow::Continue
        }
    }
}

/// Runs engine `me`'s loop `f` (which never returns while the server lives) and, should it
/// stop, by a panic or otherwise, marks that engine failed and calls `on_death` with the
/// reason. `serve` exits the process there, non-zero, when no engine is left, so that a
/// supervisor (systemd, Kubernetes) restarts it instead of leaving a live process that
/// answers 503 for ever.
pub fn supervise(shared: &Shared, me: usize, f: impl FnOnce(), on_death: impl FnOnce(String)) {
    let why = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(()) => "the engine loop returned".to_string(),
        Err(p) => format!(
            "the engine thread panicked: {}",
            crate::generation::engine::panic_message(p.as_ref())
        ),
    };
    shared.set_failed(me, why.clone());
    on_death(why);
}

#[cfg(test)]
mod tests;
