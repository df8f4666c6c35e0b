//! The vision stage: image encoding, and the prompt's prefill after it, on a thread of its own.
//!
//! A page's vision encoder run (~60 ms for an A4 page on an H200) is compute-bound, while a
//! large batch's decode step is bound by reading the KV cache. Run one after the other on the
//! engine's thread, every admitted page stalls the whole batch for its encoder run. With a
//! stage, [`crate::generation::engine::Engine::admit`] hands the request's images to this
//! thread (the request waits in the batch, holding its place), the engine keeps stepping the
//! running requests, and the prefill starts once the features are back
//! (`Engine::step` collects them). On a GPU the two run concurrently on their sessions'
//! separate CUDA streams.
//!
//! Where the backend also offers a [`PagePrefill`] (a second decoder session writing into a
//! cache sequence that [`crate::runtime::backend::Backend::reserve`] set aside), a second
//! thread of the stage prefills each page once its features are made (while the next page is
//! encoded), and the engine's thread only adopts the finished sequence: the ~30 ms prompt run
//! of an A4 page then overlaps the decode steps as the encoder run does, instead of stalling
//! them.
//!
//! The thread works in submission order; each result carries its submission's ticket so the
//! engine can drop those of requests cancelled meanwhile (dropping a result frees the cache
//! sequence it holds). A panic while encoding or prefilling fails that request only. The
//! stage exists only where a backend offers an [`ImageEncoder`]
//! ([`crate::runtime::backend::Backend::stage_handles`]).
//!
//! ```
//! use ndarray::{Array2, Array4};
//! use ocrctl::generation::vision::{Staged, VisionStage};
//! use ocrctl::model::preprocess::Pixels;
//! use ocrctl::runtime::backend::{BackendError, ImageEncoder};
//! struct Width;
//! impl ImageEncoder for Width {
//!     fn encode(&mut self, p: &Pixels) -> Result<Array2<f32>, BackendError> {
//!         Ok(Array2::from_elem((1, 1), p.width() as f32))
//!     }
//! }
//! let mut stage = VisionStage::<()>::start(Box::new(Width), None);
//! let ticket = stage.submit(vec![Pixels::dense(Array4::zeros((1, 3, 2, 5)))], None);
//! let done = stage.next(true).expect("the stage is running");
//! assert_eq!(done.ticket, ticket);
//! let Ok(Staged::Features(f)) = done.result else { panic!("features") };
//! assert_eq!(f[0][[0, 0]], 5.0);
//! ```

use crate::generation::engine::panic_message;
use crate::generation::generate::prompt_embeds;
use crate::model::preprocess::Pixels;
use crate::runtime::backend::{BackendError, ImageEncoder, PagePrefill};
use ndarray::Array2;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::thread::JoinHandle;

/// What the stage made of one submission.
pub enum Staged<C> {
    /// The images' features (one block per image, in order); the engine prefills.
    Features(Vec<Array2<f32>>),
    /// The request's prefill ran here too: its last position's logits and its cache.
    Prefilled { logits: Vec<f32>, cache: C },
}

/// One submission's result, or why it could not be made.
pub struct Encoded<C> {
    pub ticket: u64,
    pub result: Result<Staged<C>, BackendError>,
}

/// The prefill part of a submission (see [`VisionStage::prefills`]).
pub struct PrefillJob<C> {
    pub prompt_ids: Vec<u32>,
    pub image_token_id: u32,
    /// The sequence set aside for it ([`crate::runtime::backend::Backend::reserve`]).
    pub cache: C,
}

struct Job<C> {
    ticket: u64,
    images: Vec<Pixels>,
    prefill: Option<PrefillJob<C>>,
}

/// A thread encoding images with one [`ImageEncoder`], and prefilling with a
/// [`PagePrefill`] when it has one; see the module documentation.
pub struct VisionStage<C> {
    jobs: Option<mpsc::Sender<Job<C>>>,
    done: mpsc::Receiver<Encoded<C>>,
    /// Results already taken off the channel (made here when the thread could not take a
    /// job, or put back by [`VisionStage::hold`]).
    ready: VecDeque<Encoded<C>>,
    /// Jobs sent whose results have not come back yet.
    in_flight: usize,
    prefills: bool,
    /// The encoder thread, then the prefill thread if any.
    threads: Vec<JoinHandle<()>>,
    next_ticket: u64,
}

/// `f()`, with a panic turned into an error naming the stage's `part` (a panic drops what
/// `f` held, such as a job's cache, whose sequence is then free again).
fn guarded<T>(part: &str, f: impl FnOnce() -> Result<T, BackendError>) -> Result<T, BackendError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(BackendError::Invalid(format!(
            "the {part} panicked: {}",
            panic_message(p.as_ref())
        )))
    })
}

/// A page's prefill on the prefill thread, from its images' features.
fn prefill_page<C>(
    p: &mut dyn PagePrefill<C>,
    features: &[Array2<f32>],
    job: PrefillJob<C>,
) -> Result<Staged<C>, BackendError> {
    let e = prompt_embeds(
        |ids| p.embed(ids),
        &job.prompt_ids,
        job.image_token_id,
        features,
    )?;
    let (logits, cache) = p.prefill(e, job.cache)?;
    Ok(Staged::Prefilled { logits, cache })
}

/// A page whose features are made, on its way to the prefill thread.
type ToPrefill<C> = (u64, Vec<Array2<f32>>, PrefillJob<C>);

impl<C: Send + 'static> VisionStage<C> {
    /// Starts the stage's thread with `encoder`, and, with a `prefiller`, a second thread
    /// for submissions that carry a [`PrefillJob`]: the encoder thread hands it each such
    /// page's features, so one page's prefill runs while the next page is encoded.
    pub fn start(
        mut encoder: Box<dyn ImageEncoder>,
        prefiller: Option<Box<dyn PagePrefill<C>>>,
    ) -> VisionStage<C> {
        let (jobs, rx) = mpsc::channel::<Job<C>>();
        let (tx, done) = mpsc::channel();
        let mut threads = Vec::new();
        let to_prefill = prefiller.and_then(|mut p| {
            let (ptx, prx) = mpsc::channel::<ToPrefill<C>>();
            let tx = tx.clone();
            let t = std::thread::Builder::new()
                .name("ocrctl-prefill".into())
                .spawn(move || {
                    for (ticket, features, job) in prx {
                        let span = tracing::debug_span!("stage prefill", ticket);
                        let _e = span.enter();
                        let result =
                            guarded("prefill stage", || prefill_page(p.as_mut(), &features, job));
                        if tx.send(Encoded { ticket, result }).is_err() {
                            break;
                        }
                    }
                })
                .ok()?;
            threads.push(t);
            Some(ptx)
        });
        let prefills = to_prefill.is_some();
        let vision = std::thread::Builder::new()
            .name("ocrctl-vision".into())
            .spawn(move || {
                // Ends with the queue; dropping `to_prefill` then ends the prefill thread
                // after the pages handed to it.
                for job in rx {
                    let span = tracing::debug_span!("vision", images = job.images.len());
                    let _e = span.enter();
                    let features = guarded("vision stage", || {
                        job.images.iter().map(|p| encoder.encode(p)).collect()
                    });
                    let ticket = job.ticket;
                    let result = match (features, job.prefill, &to_prefill) {
                        (Ok(f), Some(pj), Some(ptx)) => {
                            if ptx.send((ticket, f, pj)).is_err() {
                                break;
                            }
                            continue;
                        }
                        (features, _, _) => features.map(Staged::Features),
                    };
                    if tx.send(Encoded { ticket, result }).is_err() {
                        break;
                    }
                }
            })
            .ok();
        // The vision thread first: its end closes the prefill thread's queue.
        let running = vision.map(|t| threads.insert(0, t)).is_some();
        VisionStage {
            jobs: running.then_some(jobs),
            done,
            ready: VecDeque::new(),
            in_flight: 0,
            prefills,
            threads,
            next_ticket: 0,
        }
    }

    /// Whether the stage prefills submissions that carry a [`PrefillJob`].
    pub fn prefills(&self) -> bool {
        self.prefills
    }

    /// Queues `images` (and their request's prefill) for the stage; returns the ticket its
    /// [`Encoded`] will carry.
    pub fn submit(&mut self, images: Vec<Pixels>, prefill: Option<PrefillJob<C>>) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let job = Job {
            ticket,
            images,
            prefill,
        };
        let sent = match &self.jobs {
            Some(jobs) => jobs.send(job).is_ok(),
            None => false,
        };
        if sent {
            self.in_flight += 1;
        } else {
            self.ready.push_back(Encoded {
                ticket,
                result: Err(BackendError::Invalid(
                    "the vision stage's thread is not running".into(),
                )),
            });
        }
        ticket
    }

    /// The next finished submission: waits for it when `wait`, else only if one is ready.
    /// `None` when nothing is ready (or, waiting, when the thread has stopped).
    pub fn next(&mut self, wait: bool) -> Option<Encoded<C>> {
        if let Some(r) = self.ready.pop_front() {
            return Some(r);
        }
        let r = if wait {
            self.done.recv().ok()
        } else {
            self.done.try_recv().ok()
        };
        if r.is_some() {
            self.in_flight -= 1;
        }
        r
    }

    /// Puts a result taken with [`VisionStage::next`] back, for a later `next`.
    pub fn hold(&mut self, e: Encoded<C>) {
        self.ready.push_back(e);
    }

    /// Submissions whose results have not been taken yet.
    pub fn outstanding(&self) -> usize {
        self.in_flight + self.ready.len()
    }
}

impl<C> Drop for VisionStage<C> {
    fn drop(&mut self) {
        // Closing the queue ends the thread after its current job.
        self.jobs = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Failing;
    impl ImageEncoder for Failing {
        fn encode(&mut self, p: &Pixels) -> Result<Array2<f32>, BackendError> {
            match p.width() {
                0 => panic!("zero width"),
                1 => Err(BackendError::Invalid("width 1".into())),
                w => Ok(Array2::from_elem((1, 1), w as f32)),
            }
        }
    }

    #[test]
    fn results_come_back_in_order_and_failures_stay_with_their_request() {
        let mut s = VisionStage::<()>::start(Box::new(Failing), None);
        let px = crate::runtime::fake::image;
        let t: Vec<u64> = [vec![px(3)], vec![px(0)], vec![px(4), px(1)], vec![px(7)]]
            .into_iter()
            .map(|imgs| s.submit(imgs, None))
            .collect();
        assert_eq!(s.outstanding(), 4);
        let got: Vec<Encoded<()>> = (0..4).map(|_| s.next(true).expect("running")).collect();
        assert_eq!(got.iter().map(|e| e.ticket).collect::<Vec<_>>(), t);
        let width = |e: &Encoded<()>| match &e.result {
            Ok(Staged::Features(f)) => f[0][[0, 0]],
            _ => panic!("features expected"),
        };
        assert_eq!(width(&got[0]), 3.0);
        let panicked = got[1].result.as_ref().err().unwrap().to_string();
        assert!(panicked.contains("panicked: zero width"), "{panicked}");
        assert!(got[2].result.is_err());
        assert_eq!(width(&got[3]), 7.0);
        assert!(s.next(false).is_none());
        assert_eq!(s.outstanding(), 0);
    }
}

/// The stage seen through the engine, with the fake backend's slots and image encoder.
#[cfg(test)]
mod engine_tests {
    use crate::generation::engine::{Batch, Engine, EngineError, Event, Flow, GenRequest};
    use crate::generation::generate::Generation;
    use crate::runtime::fake::image;
    use crate::runtime::fake::FakeBackend;
    use std::time::Duration;

    /// Prompt `[1, 9, i]` with one image `w` wide (9 is the image token), or `[1, i]` with
    /// none; `i` ≥ 10.
    fn request(i: u32, w: Option<usize>, max: usize) -> GenRequest {
        assert!(i >= 10);
        let mut r = GenRequest::text(vec![1, 9, i], max);
        match w {
            Some(w) => r.images = vec![image(w)],
            None => r.prompt_ids = vec![1, i],
        }
        r
    }

    fn tokens(out: &[Result<Generation, EngineError>]) -> Vec<Result<Vec<u32>, String>> {
        out.iter()
            .map(|r| {
                r.as_ref()
                    .map(|g| g.token_ids.clone())
                    .map_err(|e| e.to_string())
            })
            .collect()
    }

    #[test]
    fn a_stage_gives_the_same_results_as_encoding_during_admission() {
        let reqs: Vec<GenRequest> = (0..12u32)
            .map(|i| {
                request(
                    10 + i,
                    (i % 3 != 0).then_some(10 + i as usize),
                    3 + i as usize % 5,
                )
            })
            .collect();
        // 0: no stage; 1: the stage encodes; 2: it also prefills into reserved slots.
        let run = |stage: u8| {
            let mut b = FakeBackend::sum(97)
                .slots(3)
                .delay(Duration::from_millis(1));
            if stage > 0 {
                b = b.with_image_encoder();
            }
            if stage > 1 {
                b = b.with_page_prefill();
            }
            let mut e = Engine::new(b, 3, 9);
            assert_eq!(e.vision.is_some(), stage > 0);
            let out = e.run(reqs.clone(), &mut |_| {});
            assert_eq!(e.backend.taken_slots(), 0);
            let with_images = reqs.iter().filter(|r| !r.images.is_empty()).count();
            let staged = if stage > 1 { with_images } else { 0 };
            assert_eq!(e.backend.stage_prefills(), staged);
            tokens(&out)
        };
        let without = run(0);
        assert!(without.iter().all(|r| r.is_ok()), "{without:?}");
        assert_eq!(run(1), without);
        assert_eq!(run(2), without);
    }

    /// Requests cancelled while the stage prefills them hold their reserved slots until
    /// their results come back; with every slot so held and nothing decoding, `has_room`
    /// waits for those results instead of refusing (or spinning) forever.
    #[test]
    fn slots_of_requests_cancelled_on_the_stage_come_back() {
        let b = FakeBackend::sum(97)
            .slots(2)
            .delay(Duration::from_millis(20))
            .with_image_encoder()
            .with_page_prefill();
        let mut e = Engine::new(b, 4, 9);
        let mut batch = Batch::new();
        let mut ended = Vec::new();
        for i in 0..2 {
            e.admit(
                &mut batch,
                i,
                request(10 + i as u32, Some(5), 3),
                &mut |_| Flow::Continue,
            );
        }
        assert_eq!(e.backend.taken_slots(), 2);
        assert!(batch.remove(0).is_some() && batch.remove(1).is_some());
        assert!(
            e.has_room(&batch),
            "the cancelled requests' slots were not reclaimed"
        );
        e.admit(&mut batch, 2, request(12, Some(5), 3), &mut |_| {
            Flow::Continue
        });
        while !batch.is_empty() {
            e.step(&mut batch, &mut |ev| {
                if let Event::Done { index, result } = ev {
                    ended.push((index, result.is_ok()));
                }
                Flow::Continue
            });
        }
        assert_eq!(ended, vec![(2, true)]);
        assert_eq!(e.backend.stage_prefills(), 3);
        assert_eq!(e.backend.taken_slots(), 0);
    }

    #[test]
    fn an_image_the_encoder_refuses_fails_only_its_request() {
        let mut e = Engine::new(
            FakeBackend::successor(50)
                .with_image_encoder()
                .refuse_image_width(7),
            4,
            9,
        );
        let reqs = vec![
            request(11, Some(5), 2),
            request(12, Some(7), 2),
            request(13, None, 2),
        ];
        let out = tokens(&e.run(reqs, &mut |_| {}));
        assert_eq!(out[0], Ok(vec![12, 13]));
        assert!(
            out[1].as_ref().unwrap_err().contains("7 pixels wide"),
            "{out:?}"
        );
        assert_eq!(out[2], Ok(vec![14, 15]));
        assert_eq!(e.backend.taken_slots(), 0);
    }

    /// Joins, steps and cancels in a random order: a full cache makes requests wait (none
    /// fails for want of a slot), every request ends exactly once, and no slot is left held.
    #[test]
    fn random_joins_steps_and_cancels_leak_no_slot() {
        random_joins_steps_and_cancels(false);
        random_joins_steps_and_cancels(true);
    }

    fn random_joins_steps_and_cancels(prefill: bool) {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut b = FakeBackend::sum(97).slots(4).with_image_encoder();
        if prefill {
            b = b.with_page_prefill();
        }
        let mut e = Engine::new(b, 6, 9);
        let mut batch = Batch::new();
        let mut ended = std::collections::HashMap::new();
        let (mut joined, mut cancelled) = (0usize, 0usize);
        let record = |ev: Event, ended: &mut std::collections::HashMap<usize, bool>| {
            if let Event::Done { index, result } = ev {
                if let Err(err) = result {
                    assert_eq!(err, &EngineError::Cancelled, "request {index}: {err}");
                }
                assert!(
                    ended.insert(index, result.is_ok()).is_none(),
                    "{index} twice"
                );
            }
            Flow::Continue
        };
        for _ in 0..10_000 {
            match next(3) {
                0 if e.has_room(&batch) => {
                    let w = (next(2) == 0).then(|| 1 + next(40) as usize);
                    let r = request(10 + next(80) as u32, w, 1 + next(12) as usize);
                    e.admit(&mut batch, joined, r, &mut |ev| record(ev, &mut ended));
                    joined += 1;
                }
                1 if !batch.is_empty() => {
                    let ids = batch.indices();
                    let victim = ids[next(ids.len() as u64) as usize];
                    assert!(batch.remove(victim).is_some());
                    assert!(ended.insert(victim, false).is_none());
                    cancelled += 1;
                }
                _ => e.step(&mut batch, &mut |ev| record(ev, &mut ended)),
            }
            assert!(e.backend.taken_slots() <= 4);
        }
        while !batch.is_empty() {
            e.step(&mut batch, &mut |ev| record(ev, &mut ended));
        }
        // Results of requests cancelled on the stage free their slots once taken back.
        while e.vision.as_ref().expect("a stage").outstanding() > 0 {
            e.has_room(&batch);
            std::thread::yield_now();
        }
        assert_eq!(ended.len(), joined);
        assert!(
            joined > 1000 && cancelled > 100,
            "{joined} joined, {cancelled} cancelled"
        );
        assert_eq!(e.backend.taken_slots(), 0);
        assert_eq!(e.backend.stage_prefills() > 100, prefill);
    }
}
