//! The one request queue of a server and the engines that draw from it.
//!
//! Handlers [`Shared::submit`] jobs into one bounded queue (429 when full). Each engine
//! thread (one per device of `serve --devices`) takes jobs when its batch has room. When
//! several engines have room, the job goes to the one with the least work in hand, counted in
//! tokens (the prompt plus the new tokens a request may still produce), not in requests: an
//! engine that would take a job while another ready engine with room holds fewer tokens
//! leaves it to that one. Drawing from one queue rather than assigning at submit time means a
//! job never waits behind a slow or dead engine while another is free.
//!
//! Each engine has an [`EngineSlot`]: its device label, state (`/health`), batch size, load
//! and counters (`/metrics`, label `device`). The server is ready while one engine is.

use super::error::ApiError;
use super::worker::Job;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::metrics::Metrics;
pub use super::worker::JobEvent;

/// Lifecycle of a model (one engine's, or the server's: ready when one engine is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ModelState {
    Loading = 0,
    Ready = 1,
    Failed = 2,
}

/// One engine as the queue, `/health` and `/metrics` see it.
pub struct EngineSlot {
    /// The device it runs on (`cpu:0`, `gpu:1`, …), the `device` label of its metrics.
    pub label: String,
    state: AtomicU8,
    /// Why it failed to load, or why its thread stopped.
    error: Mutex<Option<String>>,
    /// Requests in its decode batch.
    pub batch_size: AtomicUsize,
    /// Whether its batch can take another request now.
    room: AtomicBool,
    /// Tokens in hand: prompt + remaining new tokens of its running requests.
    pub load_tokens: AtomicU64,
    /// Requests it admitted since start.
    pub admitted: AtomicU64,
    /// Tokens it generated since start.
    pub generated: AtomicU64,
    /// Where its pages are and what its engine has done, as of its last step.
    pub activity: Mutex<Activity>,
}

/// An engine's pages by stage and its counters, published after each step for `/metrics`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Activity {
    /// Pages in the decode batch.
    pub decoding: usize,
    /// Pages whose images are being encoded (or prompts prefilled) beside it.
    pub staging: usize,
    /// Pages waiting for KV blocks (new, or preempted).
    pub queued_for_kv: usize,
    /// Free KV slots or blocks (`None`: caches grow without a pool).
    pub kv_free: Option<usize>,
    pub stats: crate::generation::engine::EngineStats,
}

impl EngineSlot {
    fn new(label: String) -> EngineSlot {
        EngineSlot {
            label,
            state: AtomicU8::new(ModelState::Loading as u8),
            error: Mutex::new(None),
            batch_size: AtomicUsize::new(0),
            room: AtomicBool::new(false),
            load_tokens: AtomicU64::new(0),
            admitted: AtomicU64::new(0),
            generated: AtomicU64::new(0),
            activity: Mutex::new(Activity::default()),
        }
    }

    /// This engine's state.
    pub fn state(&self) -> ModelState {
        match self.state.load(Ordering::Acquire) {
            1 => ModelState::Ready,
            2 => ModelState::Failed,
            _ => ModelState::Loading,
        }
    }

    /// Why it failed, if it did.
    pub fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn load(&self) -> u64 {
        self.load_tokens.load(Ordering::Acquire)
    }

    fn wants_work(&self) -> bool {
        self.state() == ModelState::Ready && self.room.load(Ordering::Acquire)
    }
}

/// State shared between the engine threads and the handlers.
pub struct Shared {
    queue: Mutex<VecDeque<Job>>,
    wake: Condvar,
    /// Jobs the queue may hold.
    pub queue_size: usize,
    /// The engines, one per device.
    pub engines: Vec<EngineSlot>,
    pub metrics: Metrics,
}

impl Shared {
    /// An empty queue holding at most `queue_size` waiting jobs, for one engine.
    pub fn new(queue_size: usize) -> Shared {
        Shared::with_engines(queue_size, vec!["0".into()])
    }

    /// An empty queue for engines on the devices `labels` (at least one).
    pub fn with_engines(queue_size: usize, labels: Vec<String>) -> Shared {
        assert!(!labels.is_empty(), "a server has at least one engine");
        Shared {
            queue: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            queue_size,
            engines: labels.into_iter().map(EngineSlot::new).collect(),
            metrics: Metrics::default(),
        }
    }

    /// The server's state: ready while one engine is; loading while one may still become
    /// ready; failed when every engine failed.
    pub fn state(&self) -> ModelState {
        let states: Vec<ModelState> = self.engines.iter().map(EngineSlot::state).collect();
        if states.contains(&ModelState::Ready) {
            ModelState::Ready
        } else if states.contains(&ModelState::Loading) {
            ModelState::Loading
        } else {
            ModelState::Failed
        }
    }

    /// Why the engines that failed did, `device: reason` joined (None when none failed).
    pub fn failures(&self) -> Option<String> {
        let v: Vec<String> = self
            .engines
            .iter()
            .filter_map(|e| e.error().map(|why| format!("{}: {why}", e.label)))
            .collect();
        if v.is_empty() {
            None
        } else if self.engines.len() == 1 {
            self.engines[0].error()
        } else {
            Some(v.join("; "))
        }
    }

    /// Marks engine `engine` ready.
    pub fn set_ready(&self, engine: usize) {
        self.engines[engine]
            .state
            .store(ModelState::Ready as u8, Ordering::Release);
        self.notify();
    }

    /// Whether engine `engine`'s batch has room now (set by its engine thread); a change
    /// wakes the engines waiting in [`Shared::next_job`], which weigh the others' room.
    pub fn set_room(&self, engine: usize, room: bool) {
        if self.engines[engine].room.swap(room, Ordering::AcqRel) != room {
            self.notify();
        }
    }

    /// Wakes the engines waiting for a job. The queue's lock is taken first so that no
    /// waiter can be between its check and its wait (it would miss this wake-up): every
    /// change the waiters weigh is stored before this is called.
    fn notify(&self) {
        let _q = self.lock();
        self.wake.notify_all();
    }

    /// Marks engine `engine` unavailable (it failed to load, or its thread died), with the
    /// reason `/health` reports. When no engine remains that could run them, queued jobs fail.
    pub fn set_failed(&self, engine: usize, why: String) {
        let e = &self.engines[engine];
        *e.error.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.clone());
        e.room.store(false, Ordering::Release);
        e.state.store(ModelState::Failed as u8, Ordering::Release);
        if self.state() == ModelState::Failed {
            let jobs: Vec<Job> = self.lock().drain(..).collect();
            for j in jobs {
                let _ = j
                    .events
                    .send(JobEvent::Failed(ApiError::Unavailable(why.clone())));
            }
        }
        self.notify();
    }

    /// Requests in all decode batches.
    pub fn batch_size(&self) -> usize {
        self.engines
            .iter()
            .map(|e| e.batch_size.load(Ordering::Relaxed))
            .sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Job>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Jobs waiting for a batch slot.
    pub fn queue_depth(&self) -> usize {
        self.lock().len()
    }

    /// Queues `job`, or refuses it (429) when `queue_size` jobs already wait.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        let mut q = self.lock();
        if q.len() >= self.queue_size {
            return Err(ApiError::QueueFull { queued: q.len() });
        }
        q.push_back(job);
        drop(q);
        self.wake.notify_all();
        Ok(())
    }

    /// Queues the retry of a page already taken (`/v1/ocr`, issue 38), at the back and past
    /// `queue_size`: it replaces its finished attempt, so a request never holds more jobs
    /// than the pages it was admitted with, and other requests keep their turn.
    pub fn requeue(&self, job: Job) {
        self.lock().push_back(job);
        self.wake.notify_all();
    }

    /// Whether another ready engine with room holds fewer tokens than `engine`.
    fn better_engine_than(&self, engine: usize) -> bool {
        let mine = self.engines[engine].load();
        self.engines
            .iter()
            .enumerate()
            .any(|(i, e)| i != engine && e.wants_work() && e.load() < mine)
    }

    /// Next job for engine `engine`: waits up to `wait` when `block`, else returns at once.
    /// A job is left to a less loaded engine that has room (see the module's docs). Jobs
    /// whose client is gone are dropped; jobs past their deadline are failed.
    pub(crate) fn next_job(&self, engine: usize, block: bool, wait: Duration) -> Option<Job> {
        let until = Instant::now() + wait;
        let mut q = self.lock();
        loop {
            if !self.better_engine_than(engine) {
                while let Some(job) = q.pop_front() {
                    if job.events.is_closed() {
                        continue;
                    }
                    if Instant::now() > job.deadline {
                        let secs = job
                            .deadline
                            .saturating_duration_since(job.accepted)
                            .as_secs();
                        let _ = job
                            .events
                            .send(JobEvent::Failed(ApiError::Timeout { secs }));
                        continue;
                    }
                    let cost = (job.req.prompt_ids.len() + job.req.max_new_tokens) as u64;
                    self.engines[engine]
                        .load_tokens
                        .fetch_add(cost, Ordering::AcqRel);
                    if !q.is_empty() {
                        // The others re-weigh the rest against this engine's new load.
                        self.wake.notify_all();
                    }
                    return Some(job);
                }
            }
            let now = Instant::now();
            if !block || now >= until {
                return None;
            }
            // Every change `better_engine_than` weighs (room, state, load) wakes this.
            let (g, _) = self
                .wake
                .wait_timeout(q, until - now)
                .unwrap_or_else(|e| e.into_inner());
            q = g;
        }
    }

    /// Drops queued jobs whose clients are gone (frees their queue slots).
    pub(crate) fn prune(&self) {
        self.lock().retain(|j| !j.events.is_closed());
    }

    /// Engine `engine` finished (or cut) work it had counted: `tokens` leave its load.
    pub(crate) fn release(&self, engine: usize, tokens: u64) {
        let l = &self.engines[engine].load_tokens;
        let _ = l.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
            Some(v.saturating_sub(tokens))
        });
        self.notify();
    }
}
