//! A job's events on their way to its client, with a cap on what the client has not read.
//!
//! The engine sends a job's events as it generates; a handler forwards them as they come
//! (a stream only when hyper asks for more, i.e. when the client reads). A client that stops
//! reading left them to pile up: a stream with `top_logprobs` held 20.7 MB, and kept its batch
//! slot until it finished. [`EventTx::send`] counts the bytes sent and not yet received;
//! past [`MAX_UNREAD_BYTES`] the job fails (its handler hears why) and the engine cancels it.

use super::error::ApiError;
use super::worker::{Candidate, JobEvent, TokenLogprobs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// Bytes of events a client may leave unread before its job is cancelled: more than a stream
/// without log-probabilities ever holds (a few bytes a token), and ~2700 tokens with 20
/// `top_logprobs` each (~1.5 KB a token as JSON; at 100 tokens/s, 27 s of not reading).
pub const MAX_UNREAD_BYTES: usize = 4 << 20;

/// The engine's end of a job's events.
#[derive(Debug)]
pub struct EventTx {
    tx: UnboundedSender<JobEvent>,
    unread: Arc<AtomicUsize>,
    cap: usize,
}

/// The handler's end of a job's events.
#[derive(Debug)]
pub struct EventRx {
    rx: UnboundedReceiver<JobEvent>,
    unread: Arc<AtomicUsize>,
}

/// A channel for one job's events that lets at most `cap` bytes wait unread.
pub fn channel(cap: usize) -> (EventTx, EventRx) {
    let (tx, rx) = unbounded_channel();
    let unread = Arc::new(AtomicUsize::new(0));
    (
        EventTx {
            tx,
            unread: unread.clone(),
            cap,
        },
        EventRx { rx, unread },
    )
}

/// About the bytes an event holds (its text, and its log-probabilities as JSON).
fn size(ev: &JobEvent) -> usize {
    match ev {
        JobEvent::Delta { text, logprobs } => {
            text.len() + logprobs.iter().map(logprobs_size).sum::<usize>()
        }
        _ => 0,
    }
}

/// About the length of `t`'s `logprobs.content` entry as JSON, without writing it: 8 bytes a
/// number, 4 a key's quotes and colon, 1 a comma.
fn logprobs_size(t: &TokenLogprobs) -> usize {
    let top: usize = t.top.iter().map(|c| candidate_size(c) + 1).sum();
    candidate_size(&t.chosen) + "top_logprobs".len() + 4 + 2 + top
}

/// About the length of `{"token": …, "logprob": …, "bytes": […]}` for `c`.
fn candidate_size(c: &Candidate) -> usize {
    let n = c.token.len();
    let token = "token".len() + 4 + n + 2;
    let logprob = "logprob".len() + 4 + 8;
    let bytes = "bytes".len() + 4 + 2 + n * (8 + 1);
    2 + token + logprob + bytes
}

impl EventTx {
    /// Sends `ev`; false when the handler is gone or has left more than the cap unread, in
    /// which case it hears why instead and the caller cancels the job.
    pub fn send(&self, ev: JobEvent) -> bool {
        let n = size(&ev);
        let unread = self.unread.fetch_add(n, Ordering::Relaxed) + n;
        if unread > self.cap {
            let _ = self.tx.send(JobEvent::Failed(ApiError::Unavailable(format!(
                "the client left more than {} MiB of this response unread; the request was \
                 cancelled",
                self.cap >> 20
            ))));
            return false;
        }
        self.tx.send(ev).is_ok()
    }

    /// Whether the handler is gone (its client went away).
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

impl EventRx {
    /// The next event; `None` once the engine's end is gone and every event was read.
    pub async fn recv(&mut self) -> Option<JobEvent> {
        let ev = self.rx.recv().await?;
        self.unread.fetch_sub(size(&ev), Ordering::Relaxed);
        Some(ev)
    }

    /// The next event if one is waiting (tests that run an engine thread poll with it).
    pub fn try_recv(&mut self) -> Result<JobEvent, tokio::sync::mpsc::error::TryRecvError> {
        let ev = self.rx.try_recv()?;
        self.unread.fetch_sub(size(&ev), Ordering::Relaxed);
        Ok(ev)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(n: usize) -> JobEvent {
        JobEvent::Delta {
            text: "x".repeat(n),
            logprobs: vec![],
        }
    }

    /// Bytes count while unread; past the cap the job fails and the receiver hears why.
    #[tokio::test]
    async fn unread_bytes_past_the_cap_fail_the_job() {
        let (tx, mut rx) = channel(100);
        assert!(tx.send(delta(60)));
        assert!(matches!(rx.recv().await, Some(JobEvent::Delta { .. })));
        assert!(tx.send(delta(60)), "what was read no longer counts");
        assert!(!tx.send(delta(60)), "120 bytes unread");
        assert!(matches!(rx.recv().await, Some(JobEvent::Delta { .. })));
        match rx.recv().await {
            Some(JobEvent::Failed(e)) => assert!(e.to_string().contains("unread"), "{e}"),
            other => panic!("{other:?}"),
        }
        drop(rx);
        assert!(tx.is_closed() && !tx.send(delta(1)));
    }

    #[test]
    fn json_sizes_are_close_to_the_text() {
        let t = TokenLogprobs {
            chosen: Candidate {
                id: 1,
                token: "ab".into(),
                logprob: -0.5,
            },
            top: vec![],
        };
        let entry = crate::server::openai::TokenLogprob::from(&t);
        let text = serde_json::to_string(&entry).unwrap().len();
        let est = logprobs_size(&t);
        assert!(est >= text && est <= 2 * text, "{est} vs {text}");
    }
}
