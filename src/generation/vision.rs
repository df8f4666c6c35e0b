//! The vision stage: image encoding ahead of prefill, on a thread of its own.
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
//! The thread encodes in submission order; each result carries its submission's ticket so the
//! engine can drop those of requests cancelled meanwhile. A panic while encoding fails that
//! request only. The stage exists only where a backend offers an
//! [`ImageEncoder`] ([`crate::runtime::backend::Backend::image_encoder`]).
//!
//! ```
//! use ndarray::{Array2, Array4};
//! use ocrctl::generation::vision::VisionStage;
//! use ocrctl::runtime::backend::{BackendError, ImageEncoder};
//! struct Width;
//! impl ImageEncoder for Width {
//!     fn encode(&mut self, p: &Array4<f32>) -> Result<Array2<f32>, BackendError> {
//!         Ok(Array2::from_elem((1, 1), p.shape()[3] as f32))
//!     }
//! }
//! let mut stage = VisionStage::start(Box::new(Width));
//! let ticket = stage.submit(vec![Array4::zeros((1, 3, 2, 5))]);
//! let done = stage.next(true).expect("the stage is running");
//! assert_eq!(done.ticket, ticket);
//! assert_eq!(done.features.unwrap()[0][[0, 0]], 5.0);
//! ```

use crate::generation::engine::panic_message;
use crate::runtime::backend::{BackendError, ImageEncoder};
use ndarray::{Array2, Array4};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::thread::JoinHandle;

/// The features of one submission's images (in order), or why they could not be computed.
pub struct Encoded {
    pub ticket: u64,
    pub features: Result<Vec<Array2<f32>>, BackendError>,
}

struct Job {
    ticket: u64,
    images: Vec<Array4<f32>>,
}

/// A thread encoding images with one [`ImageEncoder`]; see the module documentation.
pub struct VisionStage {
    jobs: Option<mpsc::Sender<Job>>,
    done: mpsc::Receiver<Encoded>,
    /// Results made here when the thread could not take a job (it had stopped).
    refused: VecDeque<Encoded>,
    thread: Option<JoinHandle<()>>,
    next_ticket: u64,
}

impl VisionStage {
    /// Starts the stage's thread with `encoder`.
    pub fn start(mut encoder: Box<dyn ImageEncoder>) -> VisionStage {
        let (jobs, rx) = mpsc::channel::<Job>();
        let (tx, done) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("ocrctl-vision".into())
            .spawn(move || {
                for job in rx {
                    let span = tracing::debug_span!("vision", images = job.images.len());
                    let _e = span.enter();
                    let features = catch_unwind(AssertUnwindSafe(|| {
                        job.images
                            .iter()
                            .map(|p| encoder.encode(p))
                            .collect::<Result<Vec<_>, _>>()
                    }))
                    .unwrap_or_else(|p| {
                        Err(BackendError::Invalid(format!(
                            "the vision encoder panicked: {}",
                            panic_message(p.as_ref())
                        )))
                    });
                    let ticket = job.ticket;
                    if tx.send(Encoded { ticket, features }).is_err() {
                        break;
                    }
                }
            })
            .ok();
        VisionStage {
            jobs: thread.as_ref().map(|_| jobs),
            done,
            refused: VecDeque::new(),
            thread,
            next_ticket: 0,
        }
    }

    /// Queues `images` for encoding; returns the ticket its [`Encoded`] will carry.
    pub fn submit(&mut self, images: Vec<Array4<f32>>) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let sent = match &self.jobs {
            Some(jobs) => jobs.send(Job { ticket, images }).is_ok(),
            None => false,
        };
        if !sent {
            self.refused.push_back(Encoded {
                ticket,
                features: Err(BackendError::Invalid(
                    "the vision stage's thread is not running".into(),
                )),
            });
        }
        ticket
    }

    /// The next finished submission: waits for it when `wait`, else only if one is ready.
    /// `None` when nothing is ready (or, waiting, when the thread has stopped).
    pub fn next(&mut self, wait: bool) -> Option<Encoded> {
        if let Some(r) = self.refused.pop_front() {
            return Some(r);
        }
        if wait {
            self.done.recv().ok()
        } else {
            self.done.try_recv().ok()
        }
    }
}

impl Drop for VisionStage {
    fn drop(&mut self) {
        // Closing the queue ends the thread after its current job.
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Failing;
    impl ImageEncoder for Failing {
        fn encode(&mut self, p: &Array4<f32>) -> Result<Array2<f32>, BackendError> {
            match p.shape()[3] {
                0 => panic!("zero width"),
                1 => Err(BackendError::Invalid("width 1".into())),
                w => Ok(Array2::from_elem((1, 1), w as f32)),
            }
        }
    }

    #[test]
    fn results_come_back_in_order_and_failures_stay_with_their_request() {
        let mut s = VisionStage::start(Box::new(Failing));
        let px = |w| Array4::zeros((1, 3, 1, w));
        let t: Vec<u64> = [vec![px(3)], vec![px(0)], vec![px(4), px(1)], vec![px(7)]]
            .into_iter()
            .map(|imgs| s.submit(imgs))
            .collect();
        let got: Vec<Encoded> = (0..4).map(|_| s.next(true).expect("running")).collect();
        assert_eq!(got.iter().map(|e| e.ticket).collect::<Vec<_>>(), t);
        assert_eq!(got[0].features.as_ref().unwrap()[0][[0, 0]], 3.0);
        let panicked = got[1].features.as_ref().err().unwrap().to_string();
        assert!(panicked.contains("panicked: zero width"), "{panicked}");
        assert!(got[2].features.is_err());
        assert_eq!(got[3].features.as_ref().unwrap()[0][[0, 0]], 7.0);
        assert!(s.next(false).is_none());
    }
}

/// The stage seen through the engine, with the fake backend's slots and image encoder.
#[cfg(test)]
mod engine_tests {
    use crate::generation::engine::{Batch, Engine, EngineError, Event, Flow, GenRequest};
    use crate::generation::generate::Generation;
    use crate::runtime::fake::FakeBackend;
    use ndarray::Array4;
    use std::time::Duration;

    /// Prompt `[1, 9, i]` with one image `w` wide (9 is the image token), or `[1, i]` with
    /// none; `i` ≥ 10.
    fn request(i: u32, w: Option<usize>, max: usize) -> GenRequest {
        assert!(i >= 10);
        let mut r = GenRequest::text(vec![1, 9, i], max);
        match w {
            Some(w) => r.images = vec![Array4::zeros((1, 3, 1, w))],
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
        let run = |stage: bool| {
            let mut b = FakeBackend::sum(97)
                .slots(3)
                .delay(Duration::from_millis(1));
            if stage {
                b = b.with_image_encoder();
            }
            let mut e = Engine::new(b, 3, 9);
            assert_eq!(e.vision.is_some(), stage);
            let out = e.run(reqs.clone(), &mut |_| {});
            assert_eq!(e.backend.taken_slots(), 0);
            tokens(&out)
        };
        let without = run(false);
        assert!(without.iter().all(|r| r.is_ok()), "{without:?}");
        assert_eq!(run(true), without);
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
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut e = Engine::new(FakeBackend::sum(97).slots(4).with_image_encoder(), 6, 9);
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
        assert_eq!(ended.len(), joined);
        assert!(
            joined > 1000 && cancelled > 100,
            "{joined} joined, {cancelled} cancelled"
        );
        assert_eq!(e.backend.taken_slots(), 0);
    }
}
