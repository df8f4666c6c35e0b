//! How a page ends (issue 38): `ok`, `retried` (ok after more than one attempt) or `failed`
//! with a reason (`length`, `loop`, `error`), and what a document with failed pages becomes.
//!
//! A page that ends at `max_new_tokens` or trips the loop guard did not finish: it is tried
//! again ([`RetryPolicy`]: `retries` more times, on a rising temperature ladder with a new
//! seed each, as olmOCR does) and fails when the last attempt ends the same way. A page asked
//! to run to its token budget (`ignore_eos`, benchmarks) or whose caller accepts truncation
//! (`accept_length`) is `ok` at `length`. Errors (a page that cannot be rendered, the runtime
//! failing) are not retried. [`DocVerdict`] says whether a document with failed pages is
//! written, with [`failed_marker`] in each failed page's place, or fails whole.
//! [`run_with_retries`] drives an [`Engine`] under a policy; the server's `/v1/ocr` applies
//! the same policy request by request.

use crate::generation::engine::{Engine, EngineError, Event, GenRequest};
use crate::generation::generate::{FinishReason, Generation};
use crate::generation::sampling::SamplingParams;
use crate::runtime::backend::Backend;
use serde::Serialize;
use std::cell::RefCell;
use std::collections::VecDeque;

/// How a page ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PageStatus {
    /// Finished on the first attempt.
    Ok,
    /// Finished after more than one attempt.
    Retried,
    /// Did not finish (see [`FailReason`]).
    Failed,
}

/// Why a page failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FailReason {
    /// Every attempt ended at `max_new_tokens`.
    Length,
    /// The last attempt tripped the loop guard.
    Loop,
    /// The page could not be read or generated (not retried).
    Error,
}

impl FailReason {
    /// `length`, `loop` or `error`, as in JSON and the page marker.
    pub fn as_str(self) -> &'static str {
        match self {
            FailReason::Length => "length",
            FailReason::Loop => "loop",
            FailReason::Error => "error",
        }
    }
}

impl std::fmt::Display for FailReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of one page: its status, the attempts it took, and why it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PageOutcome {
    pub status: PageStatus,
    pub attempts: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<FailReason>,
}

impl PageOutcome {
    /// A page that finished on attempt `attempts` (1-based).
    pub fn finished(attempts: usize) -> PageOutcome {
        PageOutcome {
            status: match attempts {
                0 | 1 => PageStatus::Ok,
                _ => PageStatus::Retried,
            },
            attempts: attempts.max(1),
            reason: None,
        }
    }

    /// A page that failed for `reason` after `attempts` attempts.
    pub fn failed(reason: FailReason, attempts: usize) -> PageOutcome {
        PageOutcome {
            status: PageStatus::Failed,
            attempts,
            reason: Some(reason),
        }
    }

    /// Whether the page did not finish.
    pub fn is_failed(&self) -> bool {
        self.status == PageStatus::Failed
    }
}

/// Temperatures of the retries: retry `k` (1-based) samples at `RETRY_TEMPERATURES[k - 1]`
/// (the last one for later retries), or at the first attempt's temperature when that is
/// higher. From LightOnOCR's 0.2 this is olmOCR's rising ladder, 0.2 → 0.5 → 0.8.
pub const RETRY_TEMPERATURES: [f32; 3] = [0.5, 0.8, 1.0];

/// Retries added to a seed per attempt (an odd constant, 2^64 / φ): attempts of one page,
/// and pages whose seeds differ by a small offset (the server's), never share a seed.
const SEED_STRIDE: u64 = 0x9E37_79B9_7F4A_7C15;

/// When a page is tried again (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts after the first (`--retries`, default [`RetryPolicy::DEFAULT_RETRIES`]).
    pub retries: usize,
    /// A page that ends at `max_new_tokens` is `ok` (`--accept-length`).
    pub accept_length: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            retries: RetryPolicy::DEFAULT_RETRIES,
            accept_length: false,
        }
    }
}

/// What follows an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The page is done.
    Done(PageOutcome),
    /// The page goes again; the attempt's fault.
    Retry(FailReason),
}

impl RetryPolicy {
    /// Two retries: three attempts at 0.2, 0.5 and 0.8 from LightOnOCR's defaults.
    pub const DEFAULT_RETRIES: usize = 2;

    /// The sampling of attempt `attempt` (0-based) of a page whose first attempt samples
    /// with `base`: `base` itself, then the ladder's temperature (at least `base`'s) and
    /// the seed, when one was given, moved on by a fixed stride (reproducible, distinct).
    pub fn params(&self, base: &SamplingParams, attempt: usize) -> SamplingParams {
        if attempt == 0 {
            return base.clone();
        }
        let step = RETRY_TEMPERATURES[(attempt - 1).min(RETRY_TEMPERATURES.len() - 1)];
        SamplingParams {
            temperature: base.temperature.max(step),
            seed: base
                .seed
                .map(|s| s.wrapping_add(SEED_STRIDE.wrapping_mul(attempt as u64))),
            ..base.clone()
        }
    }

    /// The fault of an attempt that ended with `finish`, if any: `length` unless the caller
    /// accepts it or asked for it (`ignore_eos`: the request runs to its budget by design),
    /// `loop` for the loop guard.
    pub fn fault(&self, finish: FinishReason, ignore_eos: bool) -> Option<FailReason> {
        match finish {
            FinishReason::Stop => None,
            FinishReason::Length if self.accept_length || ignore_eos => None,
            FinishReason::Length => Some(FailReason::Length),
            FinishReason::Repetition => Some(FailReason::Loop),
        }
    }

    /// What follows attempt `attempt` (0-based) that ended with `fault`.
    pub fn after(&self, attempt: usize, fault: Option<FailReason>) -> Next {
        match fault {
            None => Next::Done(PageOutcome::finished(attempt + 1)),
            Some(FailReason::Error) => {
                Next::Done(PageOutcome::failed(FailReason::Error, attempt + 1))
            }
            Some(r) if attempt < self.retries => Next::Retry(r),
            Some(r) => Next::Done(PageOutcome::failed(r, attempt + 1)),
        }
    }
}

/// What becomes of a document, from its failed pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DocVerdict {
    /// Every page finished.
    Complete,
    /// Some pages failed, no more than allowed: written with [`failed_marker`] in their place.
    Partial,
    /// More pages failed than allowed: not written.
    Failed,
}

/// The verdict on a document of `pages` pages of which `failed` failed, when at most the
/// fraction `max_failed` (0 to 1) of its pages may fail for it to be written.
pub fn verdict(failed: usize, pages: usize, max_failed: f64) -> DocVerdict {
    if failed == 0 {
        DocVerdict::Complete
    } else if failed as f64 > max_failed * pages.max(1) as f64 {
        DocVerdict::Failed
    } else {
        DocVerdict::Partial
    }
}

/// What stands in a written document in place of page `page` (1-based) that failed.
pub fn failed_marker(page: usize, reason: FailReason) -> String {
    format!("<!-- page {page} failed: {reason} -->")
}

/// Whether `markdown` holds a [`failed_marker`] (a partial document, which `--resume` redoes).
pub fn has_failed_marker(markdown: &str) -> bool {
    markdown.match_indices("<!-- page ").any(|(i, _)| {
        let rest = &markdown[i + "<!-- page ".len()..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        digits > 0 && rest[digits..].starts_with(" failed: ")
    })
}

/// What [`run_with_retries`] reports about the page `K`.
pub enum PageEvent<'a, K> {
    /// A token of the page's current attempt.
    Token(&'a K),
    /// An attempt ended at `max_new_tokens` or in a loop; the page goes again.
    Retry {
        key: &'a K,
        attempt: usize,
        reason: FailReason,
    },
    /// The page is done: its outcome and its last attempt's generation (or error).
    Done {
        key: K,
        outcome: PageOutcome,
        result: Result<&'a Generation, String>,
    },
}

/// Runs pages through `engine` under `policy`: `next` gives each new page's key and request
/// (lazily, as the engine has room), `again` the request of a page to retry (its sampling is
/// set here from the first attempt's by [`RetryPolicy::params`]). Retries go before new
/// pages. `on_event` sees tokens, retries and each page's end once.
pub fn run_with_retries<B: Backend, K>(
    engine: &mut Engine<B>,
    policy: &RetryPolicy,
    mut next: impl FnMut() -> Option<(K, GenRequest)>,
    mut again: impl FnMut(&K) -> Result<GenRequest, String>,
    on_event: &mut dyn FnMut(PageEvent<K>),
) {
    let pages = Pages::default();
    let requests = std::iter::from_fn(|| pages.next_request(policy, &mut next, &mut again));
    engine.run(requests, &mut |ev| {
        pages.report_failed(on_event);
        match ev {
            Event::Token { index, .. } => {
                if let Some(Some((key, ..))) = pages.slots.borrow().get(index) {
                    on_event(PageEvent::Token(key));
                }
            }
            Event::Done { index, result } => pages.done(policy, index, result, on_event),
        }
    });
    // A retry whose request could not be made after the last event.
    pages.report_failed(on_event);
}

/// A page's request in the engine: its key, attempt, its first attempt's sampling and
/// `ignore_eos`; taken out when the request is done.
type Slot<K> = Option<(K, usize, SamplingParams, bool)>;

/// The pages of a [`run_with_retries`].
struct Pages<K> {
    /// By engine index.
    slots: RefCell<Vec<Slot<K>>>,
    /// Pages to try again: key, attempt, first attempt's sampling.
    retries: RefCell<VecDeque<(K, usize, SamplingParams)>>,
    /// Failures of `again`, reported after the engine's event that caused them.
    failed: RefCell<Vec<(K, usize, String)>>,
}

impl<K> Default for Pages<K> {
    fn default() -> Self {
        Pages {
            slots: RefCell::new(Vec::new()),
            retries: RefCell::new(VecDeque::new()),
            failed: RefCell::new(Vec::new()),
        }
    }
}

impl<K> Pages<K> {
    /// The engine's next request: a retry first (one whose request cannot be made is
    /// failed), else a new page; `None` when neither is left.
    fn next_request(
        &self,
        policy: &RetryPolicy,
        next: &mut impl FnMut() -> Option<(K, GenRequest)>,
        again: &mut impl FnMut(&K) -> Result<GenRequest, String>,
    ) -> Option<GenRequest> {
        loop {
            let retry = self.retries.borrow_mut().pop_front();
            let (key, attempt, base, req) = match retry {
                Some((key, attempt, base)) => match again(&key) {
                    Ok(req) => (key, attempt, base, req),
                    Err(e) => {
                        self.failed.borrow_mut().push((key, attempt, e));
                        continue;
                    }
                },
                None => {
                    let (key, req) = next()?;
                    let base = req.params.clone();
                    (key, 0, base, req)
                }
            };
            let req = GenRequest {
                params: policy.params(&base, attempt),
                ..req
            };
            self.slots
                .borrow_mut()
                .push(Some((key, attempt, base, req.ignore_eos)));
            return Some(req);
        }
    }

    /// Reports the pages whose retry could not be made as failed.
    fn report_failed(&self, on_event: &mut dyn FnMut(PageEvent<K>)) {
        for (key, attempt, e) in self.failed.borrow_mut().drain(..) {
            on_event(PageEvent::Done {
                key,
                outcome: PageOutcome::failed(FailReason::Error, attempt + 1),
                result: Err(e),
            });
        }
    }

    /// Request `index` ended with `result`: its page is queued again or done, as `policy`
    /// says.
    fn done(
        &self,
        policy: &RetryPolicy,
        index: usize,
        result: &Result<Generation, EngineError>,
        on_event: &mut dyn FnMut(PageEvent<K>),
    ) {
        let Some((key, attempt, base, ignore_eos)) = self.slots.borrow_mut()[index].take() else {
            return;
        };
        let fault = match result {
            Ok(g) => policy.fault(g.finish_reason, ignore_eos),
            Err(_) => Some(FailReason::Error),
        };
        match policy.after(attempt, fault) {
            Next::Retry(reason) => {
                on_event(PageEvent::Retry {
                    key: &key,
                    attempt,
                    reason,
                });
                self.retries
                    .borrow_mut()
                    .push_back((key, attempt + 1, base));
            }
            Next::Done(outcome) => on_event(PageEvent::Done {
                key,
                outcome,
                result: result.as_ref().map_err(|e| e.to_string()),
            }),
        }
    }
}

#[cfg(test)]
mod tests;
