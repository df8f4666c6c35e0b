//! The engine thread: a bounded queue of [`Job`]s feeding the continuous-batching
//! [`Engine`], and per-request text assembly (incremental UTF-8 detokenisation, stop
//! strings, log-probabilities) sent back to the HTTP handlers over channels.
//!
//! The model is loaded on this thread (ONNX Runtime sessions never cross threads). A job
//! whose client went away (its receiver dropped) is dropped from the queue, or cancelled at
//! the next step when it is already decoding; a job past its deadline gets a timeout.

use super::error::ApiError;
use super::metrics::Metrics;
use super::queue::EngineSlot;
pub use super::queue::{ModelState, Shared};
use super::stops::StopMatcher;
use crate::generation::engine::{Batch, Engine, EngineError, Event, Flow, GenRequest};
use crate::generation::generate::FinishReason;
use crate::model::prompt::{Prompter, StreamDecoder};
use crate::runtime::backend::Backend;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

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
    /// Where the request's [`JobEvent`]s go; dropping the receiver cancels the job.
    pub events: UnboundedSender<JobEvent>,
}

/// What a handler hears about its job.
#[derive(Debug)]
pub enum JobEvent {
    /// More text (possibly empty while a multi-byte character is incomplete) and the
    /// OpenAI `logprobs.content` entries of the tokens behind it.
    Delta { text: String, logprobs: Vec<Value> },
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
    events: UnboundedSender<JobEvent>,
    decoder: StreamDecoder,
    text: String,
    /// Bytes of `text` already sent.
    sent: usize,
    stop: StopMatcher,
    stop_hit: Option<String>,
    want_logprobs: bool,
    pending_logprobs: Vec<Value>,
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
        self.events.send(JobEvent::Delta { text, logprobs }).is_ok()
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
        shared.prune();
    }
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
                let lp = logprob.unwrap_or(f32::NAN);
                r.pending_logprobs
                    .push(super::openai::logprob_entry(&name(id), lp, top, name));
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
mod tests {
    use super::*;
    use crate::runtime::fake::FakeBackend;
    use tokio::sync::mpsc::error::TryRecvError;

    /// Counts up from the last prompt id through the fixture tokenizer's digits ('0'..'9' are
    /// ids 15..24), one forward per `delay`.
    fn slow(delay: Duration) -> FakeBackend {
        FakeBackend::new(384, |h| 15 + (h[h.len() - 1] as u32 + 1 - 15) % 10)
            .peak(5.0)
            .delay(delay)
    }

    /// Panics in its first decoder step.
    fn panics() -> FakeBackend {
        FakeBackend::new(2, |_| 1).peak(1.0).panic_at_decode(1)
    }

    /// Runs `backend` on a worker thread over `shared`, with the fixture's tokenizer.
    fn spawn<B: Backend + Send + 'static>(
        backend: B,
        batch: usize,
        shared: &Arc<Shared>,
    ) -> std::thread::JoinHandle<()> {
        spawn_engine(backend, batch, shared, 0)
    }

    /// Like `spawn`, as engine `me` of `shared`.
    fn spawn_engine<B: Backend + Send + 'static>(
        backend: B,
        batch: usize,
        shared: &Arc<Shared>,
        me: usize,
    ) -> std::thread::JoinHandle<()> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/tiny-lightonocr/checkpoint");
        let prompter = Arc::new(Prompter::from_model_dir(&dir, 326).unwrap());
        let s = shared.clone();
        std::thread::spawn(move || {
            let engine = Engine::new(backend, batch, 326);
            run_worker(engine, prompter, s, me);
        })
    }

    fn start(delay_ms: u64, batch: usize, queue: usize) -> Arc<Shared> {
        let shared = Arc::new(Shared::new(queue));
        let delay = Duration::from_millis(delay_ms);
        spawn(slow(delay), batch, &shared);
        shared
    }

    fn job(
        max: usize,
        stop: &[&str],
        timeout: Duration,
    ) -> (Job, tokio::sync::mpsc::UnboundedReceiver<JobEvent>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let now = Instant::now();
        (
            Job {
                id: "test".into(),
                req: GenRequest::text(vec![15], max),
                stop: stop.iter().map(|s| s.to_string()).collect(),
                accepted: now,
                deadline: now + timeout,
                events: tx,
            },
            rx,
        )
    }

    /// Waits for the next event (blocking, with a bound).
    fn next(rx: &mut tokio::sync::mpsc::UnboundedReceiver<JobEvent>) -> JobEvent {
        let t = Instant::now();
        loop {
            match rx.try_recv() {
                Ok(e) => return e,
                Err(TryRecvError::Empty) if t.elapsed() < Duration::from_secs(20) => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => panic!("no event: {e:?}"),
            }
        }
    }

    fn text_of(rx: &mut tokio::sync::mpsc::UnboundedReceiver<JobEvent>) -> (String, JobEvent) {
        let mut text = String::new();
        loop {
            match next(rx) {
                JobEvent::Delta { text: t, .. } => text.push_str(&t),
                other => return (text, other),
            }
        }
    }

    /// Waits (bounded) until `cond` holds.
    fn eventually(what: &str, cond: impl Fn() -> bool) {
        let t = Instant::now();
        while !cond() {
            assert!(t.elapsed() < Duration::from_secs(20), "never: {what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn jobs_go_to_the_engine_with_the_fewest_tokens_in_hand() {
        let shared = Arc::new(Shared::with_engines(
            8,
            vec!["cpu:0".into(), "cpu:1".into()],
        ));
        for me in 0..2 {
            spawn_engine(slow(Duration::from_millis(2)), 2, &shared, me);
        }
        eventually("both engines ready", || {
            shared
                .engines
                .iter()
                .all(|e| e.state() == ModelState::Ready)
        });
        // One long job: whichever engine takes it holds ~100k tokens from then on.
        let (big, _keep) = job(100_000, &[], Duration::from_secs(600));
        shared.submit(big).unwrap();
        let admitted = |i: usize| shared.engines[i].admitted.load(Ordering::Relaxed);
        eventually("the long job admitted", || admitted(0) + admitted(1) == 1);
        let busy = if admitted(0) == 1 { 0 } else { 1 };
        assert!(shared.engines[busy].load_tokens.load(Ordering::Relaxed) > 90_000);
        // Short jobs, one at a time: both engines have room, so each goes to the idle one.
        for _ in 0..5 {
            let (j, mut rx) = job(3, &[], Duration::from_secs(30));
            shared.submit(j).unwrap();
            let (text, done) = text_of(&mut rx);
            assert_eq!(text, "123");
            assert!(matches!(done, JobEvent::Done { .. }));
        }
        assert_eq!(admitted(busy), 1);
        assert_eq!(admitted(1 - busy), 5);
        // Finished work leaves the load: the idle engine holds nothing now.
        eventually("the short jobs released", || {
            shared.engines[1 - busy].load_tokens.load(Ordering::Relaxed) == 0
        });
        // Two more long jobs: the first to the idle engine (0 tokens in hand), the second
        // back to the busy one, which has worked part of its ~100k tokens off by now.
        let mut keep = Vec::new();
        for want in [(1 - busy, 6), (busy, 2)] {
            let (j, rx) = job(100_000, &[], Duration::from_secs(600));
            keep.push(rx);
            shared.submit(j).unwrap();
            eventually("the long job admitted", || admitted(want.0) == want.1);
        }
        // The busy engine's batch is full now: a short job goes to the other, whatever it holds.
        let (j, mut rx) = job(3, &[], Duration::from_secs(30));
        shared.submit(j).unwrap();
        assert_eq!(text_of(&mut rx).0, "123");
        assert_eq!((admitted(busy), admitted(1 - busy)), (2, 7));
    }

    /// An engine leaves a job to a less loaded one with room; when that one's room goes,
    /// the waiting engine is woken and takes the job (no timed re-check to wait for).
    #[test]
    fn a_room_change_wakes_the_engine_that_deferred() {
        let shared = Arc::new(Shared::with_engines(8, vec!["a".into(), "b".into()]));
        shared.set_ready(0);
        shared.set_ready(1);
        shared.set_room(0, true);
        shared.set_room(1, true);
        shared.engines[1].load_tokens.store(500, Ordering::Relaxed);
        let (j, _rx) = job(3, &[], Duration::from_secs(600));
        shared.submit(j).unwrap();
        // Engine 1 holds more tokens than engine 0, which has room: it defers.
        assert!(shared.next_job(1, false, Duration::ZERO).is_none());
        let s = shared.clone();
        let waiting = std::thread::spawn(move || {
            let t = Instant::now();
            let job = s.next_job(1, true, Duration::from_secs(60));
            (job.is_some(), t.elapsed())
        });
        std::thread::sleep(Duration::from_millis(100));
        shared.set_room(0, false);
        let (took, waited) = waiting.join().unwrap();
        assert!(took);
        // Woken by the change, not by the end of its 60 s wait.
        assert!(waited < Duration::from_secs(30), "{waited:?}");
    }

    #[test]
    fn the_server_is_ready_while_one_engine_is_and_fails_when_none_is() {
        let shared = Shared::with_engines(4, vec!["gpu:0".into(), "cpu:0".into()]);
        assert_eq!(shared.state(), ModelState::Loading);
        shared.set_failed(0, "no such device".into());
        assert_eq!(shared.state(), ModelState::Loading);
        let (j, mut rx) = job(3, &[], Duration::from_secs(30));
        shared.submit(j).unwrap();
        shared.set_ready(1);
        assert_eq!(shared.state(), ModelState::Ready);
        assert_eq!(shared.failures().unwrap(), "gpu:0: no such device");
        // The last engine going too fails what still waits, naming why.
        shared.set_failed(1, "the engine thread stopped".into());
        assert_eq!(shared.state(), ModelState::Failed);
        match next(&mut rx) {
            JobEvent::Failed(e) => assert!(e.to_string().contains("stopped"), "{e}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(shared.queue_depth(), 0);
    }

    #[test]
    fn text_streams_and_stop_strings_span_tokens() {
        let shared = start(0, 2, 4);
        let (j, mut rx) = job(12, &[], Duration::from_secs(30));
        shared.submit(j).unwrap();
        let (text, done) = text_of(&mut rx);
        assert_eq!(text, "123456789012");
        assert!(
            matches!(
                done,
                JobEvent::Done {
                    finish_reason: "length",
                    completion_tokens: 12,
                    ..
                }
            ),
            "{done:?}"
        );
        // "67" spans two tokens; nothing of it is sent.
        let (j, mut rx) = job(12, &["67", "9"], Duration::from_secs(30));
        shared.submit(j).unwrap();
        let (text, done) = text_of(&mut rx);
        assert_eq!(text, "12345");
        match done {
            JobEvent::Done {
                finish_reason,
                stop_reason,
                completion_tokens,
            } => {
                assert_eq!(
                    (finish_reason, stop_reason.as_deref(), completion_tokens),
                    ("stop", Some("67"), 7)
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn deadline_fails_the_request_and_frees_the_slot() {
        let shared = start(5, 1, 4);
        let (j, mut rx) = job(10_000, &[], Duration::from_millis(60));
        shared.submit(j).unwrap();
        let (_, end) = text_of(&mut rx);
        assert!(
            matches!(end, JobEvent::Failed(ApiError::Timeout { .. })),
            "{end:?}"
        );
        let (j, mut rx) = job(3, &[], Duration::from_secs(30));
        shared.submit(j).unwrap();
        assert_eq!(text_of(&mut rx).0, "123");
    }

    #[test]
    fn a_client_that_goes_away_frees_its_slot_at_the_next_step() {
        let shared = start(5, 1, 4);
        let (j, mut rx) = job(100_000, &[], Duration::from_secs(600));
        shared.submit(j).unwrap();
        assert!(matches!(next(&mut rx), JobEvent::Delta { .. }));
        // The only batch slot is taken; a second job waits in the queue.
        let (j2, mut rx2) = job(2, &[], Duration::from_secs(30));
        shared.submit(j2).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        assert!(matches!(rx2.try_recv(), Err(TryRecvError::Empty)));
        drop(rx);
        assert_eq!(text_of(&mut rx2).0, "12");
    }

    #[test]
    fn a_dying_engine_thread_fails_its_requests_and_health() {
        let shared = Arc::new(Shared::new(4));
        let (j, mut rx) = job(5, &[], Duration::from_secs(30));
        let (j2, mut rx2) = job(5, &[], Duration::from_secs(30));
        shared.submit(j).unwrap();
        shared.submit(j2).unwrap();
        let t = spawn(panics(), 1, &shared);
        assert!(t.join().is_err(), "the worker panicked");
        assert_eq!(shared.state(), ModelState::Failed);
        assert!(shared.failures().unwrap().contains("stopped"));
        // Both clients hear the end of their channel instead of waiting forever.
        for rx in [&mut rx, &mut rx2] {
            loop {
                match rx.try_recv() {
                    Ok(_) => continue,
                    Err(e) => {
                        assert_eq!(e, TryRecvError::Disconnected);
                        break;
                    }
                }
            }
        }
    }

    /// Issue 10.1: after the engine thread dies the process must exit non-zero;
    /// `supervise` reports the death (serve exits in `on_death`).
    #[test]
    fn a_dead_engine_is_reported_so_that_serve_exits() {
        let shared = Arc::new(Shared::new(4));
        let (j, mut rx) = job(5, &[], Duration::from_secs(30));
        shared.submit(j).unwrap();
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/tiny-lightonocr/checkpoint");
        let prompter = Arc::new(Prompter::from_model_dir(&dir, 326).unwrap());
        let engine = Engine::new(panics(), 1, 326);
        let mut died = None;
        let s2 = shared.clone();
        supervise(
            &shared,
            0,
            || run_worker(engine, prompter, s2, 0),
            |why| died = Some(why),
        );
        let why = died.expect("on_death was called");
        assert!(
            why.contains("panicked") && why.contains("a bug in a runtime"),
            "{why}"
        );
        assert_eq!(shared.state(), ModelState::Failed);
        // The client hears the end of its channel instead of waiting for ever.
        while rx.try_recv().is_ok() {}
        assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Disconnected);
        // A loop that merely returns is a death too.
        let mut died = None;
        supervise(&shared, 0, || {}, |why| died = Some(why));
        assert!(died.unwrap().contains("returned"));
    }

    #[test]
    fn a_full_queue_refuses_and_pruned_clients_free_queue_slots() {
        let shared = start(20, 1, 1);
        let (running, _keep) = job(100_000, &[], Duration::from_secs(600));
        shared.submit(running).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let (waiting, rx_wait) = job(1, &[], Duration::from_secs(600));
        shared.submit(waiting).unwrap();
        let (refused, _r) = job(1, &[], Duration::from_secs(600));
        assert!(matches!(
            shared.submit(refused),
            Err(ApiError::QueueFull { queued: 1 })
        ));
        drop(rx_wait);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(shared.queue_depth(), 0, "the abandoned job was pruned");
        let (again, _r2) = job(1, &[], Duration::from_secs(600));
        shared.submit(again).unwrap();
    }
}
