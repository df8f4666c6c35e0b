//! A job's events turned into a response: collected into one answer, or streamed as
//! server-sent events; both end with an error when the server's shutdown grace period ends
//! first ([`super::AppState::cut`]).

use super::error::ApiError;
use super::openai::{ChunkHead, Delta, Logprobs, Usage};
use super::outbox::EventRx;
use super::worker::{JobEvent, TokenLogprobs};
use axum::response::sse::{Event as SseEvent, Sse};
use futures_util::stream::{self, Stream, StreamExt};
use serde::Serialize;
use std::convert::Infallible;
use tokio::sync::watch;

/// A finished job's output.
pub(super) struct Collected {
    pub(super) text: String,
    pub(super) logprobs: Vec<TokenLogprobs>,
    pub(super) finish_reason: &'static str,
    pub(super) stop_reason: Option<String>,
    pub(super) completion_tokens: usize,
}

/// The error of a request still running when the shutdown grace period ends.
fn cut_error() -> ApiError {
    ApiError::Unavailable(
        "the server shut down before this request finished (--shutdown-timeout)".into(),
    )
}

/// The next event of a job, or its failure when the server's grace period ended first.
pub(super) async fn next_event(
    rx: &mut EventRx,
    cut: &mut watch::Receiver<bool>,
) -> Option<JobEvent> {
    tokio::select! {
        ev = rx.recv() => ev,
        _ = cut.wait_for(|c| *c) => Some(JobEvent::Failed(cut_error())),
    }
}

pub(super) async fn collect(
    mut rx: EventRx,
    mut cut: watch::Receiver<bool>,
) -> Result<Collected, ApiError> {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    while let Some(ev) = next_event(&mut rx, &mut cut).await {
        match ev {
            JobEvent::Delta {
                text: t,
                logprobs: l,
            } => {
                text.push_str(&t);
                logprobs.extend(l);
            }
            JobEvent::Done {
                finish_reason,
                stop_reason,
                completion_tokens,
            } => {
                return Ok(Collected {
                    text,
                    logprobs,
                    finish_reason,
                    stop_reason,
                    completion_tokens,
                })
            }
            JobEvent::Failed(e) => return Err(e),
        }
    }
    Err(ApiError::Engine(
        "the engine stopped before the request finished".into(),
    ))
}

/// An SSE event of `v` as JSON.
fn data<T: Serialize>(v: &T) -> SseEvent {
    let text = serde_json::to_string(v).expect("wire structs serialise");
    SseEvent::default().data(text)
}

/// The events that end a stream with `e`.
fn failure(e: &ApiError) -> Vec<Result<SseEvent, Infallible>> {
    vec![Ok(data(&e.body())), Ok(SseEvent::default().data("[DONE]"))]
}

/// The SSE stream of a chat completion: a role chunk, content deltas, a finish chunk with
/// usage, `[DONE]`; a failure (the server's shutdown deadline too) becomes an
/// `{"error": …}` event before `[DONE]`.
pub(super) fn sse(
    rx: EventRx,
    cut: watch::Receiver<bool>,
    head: ChunkHead,
    prompt_tokens: usize,
    want_logprobs: bool,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let first = stream::iter(vec![Ok(data(&head.chunk(Delta::role(), None)))]);
    let body = stream::unfold(Some((rx, cut)), move |state| {
        let head = head.clone();
        async move {
            let (mut rx, mut cut) = state?;
            let events = match next_event(&mut rx, &mut cut).await {
                Some(JobEvent::Delta { text, logprobs }) => {
                    let lp = want_logprobs.then(|| Logprobs::of(&logprobs));
                    let c = head.chunk(Delta::content(&text), lp);
                    return Some((vec![Ok(data(&c))], Some((rx, cut))));
                }
                Some(JobEvent::Done {
                    finish_reason,
                    completion_tokens,
                    ..
                }) => {
                    let c = head.last(finish_reason, Usage::new(prompt_tokens, completion_tokens));
                    vec![Ok(data(&c)), Ok(SseEvent::default().data("[DONE]"))]
                }
                Some(JobEvent::Failed(e)) => failure(&e),
                None => failure(&ApiError::Engine(
                    "the engine stopped before the request finished".into(),
                )),
            };
            Some((events, None))
        }
    })
    .flat_map(stream::iter);
    Sse::new(first.chain(body))
}
