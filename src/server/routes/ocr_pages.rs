//! `/v1/ocr`'s pages under issue 38's page outcomes: a page that ends at `max_tokens` or
//! trips the loop guard is queued again under [`RetryPolicy`] (the CLI's ladder, from
//! [`crate::generation::outcome`]) and fails after its last retry; what the response says of
//! pages that failed.
//!
//! A retry is a new job at the back of the shared queue ([`super::super::queue::Shared::requeue`]):
//! the engines keep serving other requests between attempts, a page's retry is sent as soon
//! as its attempt ends (pages run concurrently, [`run_pages`]), and it keeps the request's
//! deadline (the `accepted` instant of the first attempt) and its cancellation (dropping the
//! handler drops the receivers, which cancels the job and sends no further retry).

use super::bodies::{OcrResponse, PageEntry};
use super::ocr_figures::FigureEntry;
use super::ocr_window::Queued;
use super::*;
use crate::generation::generate::FinishReason;
use crate::generation::outcome::{failed_marker, FailReason, Next, PageOutcome, RetryPolicy};
use crate::server::error::ErrorDetail;
use tokio::sync::mpsc;

/// Retries a request may ask for: olmOCR tries a page up to 8 times; this bounds one
/// upload's work to 9 attempts a page.
pub const MAX_RETRIES: usize = 8;

/// The figures of an upload's pages: one list a page, in order.
pub(super) type Figures = Vec<Vec<FigureEntry>>;

/// One page of an upload, queued.
pub(super) struct PageJob {
    /// The page's number in its document.
    pub number: usize,
    /// The first attempt's request, kept for retries (`None` when none may follow). Its
    /// pixels are the 8-bit page (3 bytes a pixel), as a queued job holds them.
    pub again: Option<GenRequest>,
    pub prompt_tokens: usize,
    pub id: String,
    pub rx: EventRx,
}

/// How a page ended: its last attempt's output and its outcome.
#[derive(Clone)]
pub(super) struct PageResult {
    pub number: usize,
    pub text: String,
    pub finish_reason: &'static str,
    /// Tokens of the last attempt.
    pub completion_tokens: usize,
    /// Prompt and completion tokens of every attempt (the request's usage).
    pub prompt_tokens_all: usize,
    pub completion_tokens_all: usize,
    pub outcome: PageOutcome,
}

/// The engine's finish of a job from the reasons a [`JobEvent::Done`] carries (the loop
/// guard's is `length` with `stop_reason: repetition`, as the chat endpoint reports it).
pub(super) fn finish_of(finish_reason: &str, stop_reason: Option<&str>) -> FinishReason {
    match (finish_reason, stop_reason) {
        ("length", Some("repetition")) => FinishReason::Repetition,
        ("length", _) => FinishReason::Length,
        _ => FinishReason::Stop,
    }
}

/// Runs `page` to its outcome: collects each attempt and queues the next while the policy
/// says so. An error (timeout, shutdown, engine failure) ends the page with it, counted as
/// `failed: error`.
pub(super) async fn run_page(
    st: &AppState,
    page: PageJob,
    policy: RetryPolicy,
    accepted: Instant,
) -> Result<PageResult, ApiError> {
    let PageJob {
        number,
        again,
        prompt_tokens,
        id,
        mut rx,
    } = page;
    let (mut prompt_all, mut completion_all) = (0, 0);
    for attempt in 0.. {
        let c = match collect(rx, st.cut.subscribe()).await {
            Ok(c) => c,
            Err(e) => {
                let failed = PageOutcome::failed(FailReason::Error, attempt + 1);
                st.shared.metrics.pages.count(&failed);
                return Err(e);
            }
        };
        prompt_all += prompt_tokens;
        completion_all += c.completion_tokens;
        let finish = finish_of(c.finish_reason, c.stop_reason.as_deref());
        let outcome = match (policy.after(attempt, policy.fault(finish, false)), &again) {
            (Next::Retry(reason), Some(req)) => {
                st.shared.metrics.pages.count_retry();
                tracing::debug!(page = number, attempt, %reason, "retrying a page");
                let req = GenRequest {
                    params: policy.params(&req.params, attempt + 1),
                    ..req.clone()
                };
                let (j, next) = job(st, format!("{id}-a{}", attempt + 2), req, vec![], accepted);
                st.shared.requeue(j);
                rx = next;
                continue;
            }
            (Next::Retry(reason), None) => PageOutcome::failed(reason, attempt + 1),
            (Next::Done(outcome), _) => outcome,
        };
        st.shared.metrics.pages.count(&outcome);
        return Ok(PageResult {
            number,
            text: c.text,
            finish_reason: c.finish_reason,
            completion_tokens: c.completion_tokens,
            prompt_tokens_all: prompt_all,
            completion_tokens_all: completion_all,
            outcome,
        });
    }
    unreachable!("the attempts loop returns")
}

/// The status of a response whose `failed` of `pages` pages failed: 200 when none did, 207
/// (Multi-Status: some pages are there, some are not) when some did, 422 when all did (the
/// upload was read, but no page of it finished within `max_tokens` and the retries).
pub(super) fn status_of(failed: usize, pages: usize) -> StatusCode {
    match failed {
        0 => StatusCode::OK,
        f if f < pages => StatusCode::MULTI_STATUS,
        _ => StatusCode::UNPROCESSABLE_ENTITY,
    }
}

/// The `X-OCR-Failed-Pages` header's value: the failed pages' numbers, comma-separated.
pub(super) const FAILED_PAGES_HEADER: &str = "x-ocr-failed-pages";

/// The markdown of one page: its text, or the failed marker in its place.
pub(super) fn page_markdown(r: &PageResult) -> String {
    match r.outcome.reason {
        Some(reason) => failed_marker(r.number, reason),
        None => r.text.clone(),
    }
}

/// The `pages[]` entry of `format=json`.
pub(super) fn page_entry(r: &PageResult) -> PageEntry<'_> {
    PageEntry {
        attempts: r.outcome.attempts,
        completion_tokens: r.completion_tokens,
        error: None,
        figures: None,
        finish_reason: r.finish_reason,
        page: r.number,
        reason: r.outcome.reason,
        status: r.outcome.status,
        text: Some(&r.text),
    }
}

/// The `pages` array of `format=json`, each page with its `figures` where they were cropped.
fn page_entries(results: &[PageResult], figures: Option<Figures>) -> Vec<PageEntry<'_>> {
    let mut pages: Vec<PageEntry> = results.iter().map(page_entry).collect();
    for (p, f) in pages.iter_mut().zip(figures.into_iter().flatten()) {
        p.figures = Some(f);
    }
    pages
}

/// The error object of a response none of whose pages finished.
pub(super) fn all_failed_error(pages: usize) -> ErrorDetail {
    ErrorDetail {
        code: "pages_failed",
        message: format!(
            "no page of the upload finished ({pages} failed): each ended at max_tokens or in a \
             loop after its retries; raise max_tokens or retries, or send accept_length=true"
        ),
        param: None,
        kind: "invalid_request_error",
    }
}

/// The body of `format=json`: the text, the pages and the usage of every attempt.
fn json_body<'a>(
    st: &'a AppState,
    results: &'a [PageResult],
    text: String,
    failed: Vec<usize>,
    figures: Option<Figures>,
) -> OcrResponse<'a> {
    let prompt = results.iter().map(|r| r.prompt_tokens_all).sum();
    let completion = results.iter().map(|r| r.completion_tokens_all).sum();
    let none_finished = status_of(failed.len(), results.len()) == StatusCode::UNPROCESSABLE_ENTITY;
    OcrResponse {
        error: none_finished.then(|| all_failed_error(failed.len())),
        failed_pages: failed,
        model: &st.cfg.model_name,
        pages: page_entries(results, figures),
        text,
        usage: openai::Usage::new(prompt, completion),
    }
}

/// The response of an upload whose pages all ended: markdown (failed pages as their
/// marker) or `format=json`, with the status of [`status_of`] and the failed pages' numbers
/// in [`FAILED_PAGES_HEADER`]; `figures` (one array a page, `figures=true`) join the JSON pages.
pub(super) fn respond(
    st: &AppState,
    results: &[PageResult],
    json_out: bool,
    figures: Option<Figures>,
) -> Response {
    let mut text = String::new();
    for (i, r) in results.iter().enumerate() {
        if i > 0 {
            text.push_str(&page_separator(r.number));
        }
        text.push_str(&page_markdown(r));
    }
    let failed: Vec<usize> = results
        .iter()
        .filter(|r| r.outcome.is_failed())
        .map(|r| r.number)
        .collect();
    let status = status_of(failed.len(), results.len());
    let mut resp = if json_out {
        Json(json_body(st, results, text, failed.clone(), figures)).into_response()
    } else {
        (
            [(header::CONTENT_TYPE, "text/markdown; charset=utf-8")],
            format!("{text}\n"),
        )
            .into_response()
    };
    *resp.status_mut() = status;
    if !failed.is_empty() {
        let list: Vec<String> = failed.iter().map(usize::to_string).collect();
        if let Ok(v) = header::HeaderValue::from_str(&list.join(",")) {
            resp.headers_mut().insert(FAILED_PAGES_HEADER, v);
        }
    }
    resp
}

/// The `X-OCR-Pages` header of a streamed answer: how many pages the upload has (those
/// `pages` selects), for a client that shows "page k of N" as the separators come.
pub(super) const PAGES_HEADER: &str = "x-ocr-pages";

/// `stream=true`: each page's text as it is generated, `first` (already queued: an error of
/// the first page is the request's, answered before the stream) then the rest of `rx`, in
/// order; one attempt a page (text sent cannot be taken back). A page that did not finish
/// is followed by its failed marker, one that failed with an error by the marker and the
/// error's message ([`error_marker`]).
pub(super) fn stream(
    st: Arc<AppState>,
    first: Queued,
    rx: mpsc::Receiver<Queued>,
    policy: RetryPolicy,
    total: usize,
) -> Response {
    let rest = stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|q| (q, rx)) });
    let s = stream::iter([first])
        .chain(rest)
        .map(move |q| stream_page(st.clone(), q, policy))
        .flatten();
    let mut resp = (
        [(header::CONTENT_TYPE, "text/markdown; charset=utf-8")],
        Body::from_stream(s),
    )
        .into_response();
    resp.headers_mut()
        .insert(PAGES_HEADER, header::HeaderValue::from(total));
    resp
}

/// One page of [`stream`]: its separator, then its text as it comes and its marker; the
/// page keeps its place in the window until its last bytes are taken.
fn stream_page(
    st: Arc<AppState>,
    mut q: Queued,
    policy: RetryPolicy,
) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> {
    let (index, number) = (q.index, q.number);
    let sep = (index > 0).then(|| Ok(Bytes::from(page_separator(number))));
    let body = match q.take() {
        Err(e) => {
            // Not rendered or not queued: the marker alone.
            st.shared
                .metrics
                .pages
                .count(&PageOutcome::failed(FailReason::Error, 1));
            stream::iter([Ok(Bytes::from(error_marker(number, &e)))]).left_stream()
        }
        Ok((page, _)) => {
            let cut = st.cut.subscribe();
            stream::unfold(Some((page.rx, cut, q)), move |state| {
                let st = st.clone();
                async move {
                    let (mut rx, mut cut, q) = state?;
                    let ev = next_event(&mut rx, &mut cut).await?;
                    match streamed_event(&st, ev, number, policy)? {
                        Streamed::Text(t) => Some((Ok(Bytes::from(t)), Some((rx, cut, q)))),
                        Streamed::Last(t) => Some((Ok(Bytes::from(t)), None)),
                    }
                }
            })
            .right_stream()
        }
    };
    stream::iter(sep).chain(body)
}

/// What a streamed page's event adds to the stream.
enum Streamed {
    /// Text, more to come.
    Text(String),
    /// The page's last bytes.
    Last(String),
}

/// A streamed page's event as bytes to send: its text, or at its end its marker when it did
/// not finish (`None` when it finished: nothing more to send), its outcome counted.
fn streamed_event(
    st: &AppState,
    ev: JobEvent,
    number: usize,
    policy: RetryPolicy,
) -> Option<Streamed> {
    match ev {
        JobEvent::Delta { text, .. } => Some(Streamed::Text(text)),
        JobEvent::Failed(e) => {
            let failed = PageOutcome::failed(FailReason::Error, 1);
            st.shared.metrics.pages.count(&failed);
            Some(Streamed::Last(format!("\n\n{}", error_marker(number, &e))))
        }
        JobEvent::Done {
            finish_reason,
            stop_reason,
            ..
        } => {
            let finish = finish_of(finish_reason, stop_reason.as_deref());
            let outcome = match policy.after(0, policy.fault(finish, false)) {
                Next::Done(o) => o,
                Next::Retry(r) => PageOutcome::failed(r, 1),
            };
            st.shared.metrics.pages.count(&outcome);
            let reason = outcome.reason?;
            Some(Streamed::Last(format!(
                "\n\n{}",
                failed_marker(number, reason)
            )))
        }
    }
}

/// A streamed page's marker when it failed with an error: [`failed_marker`]'s with the
/// error's message, so a reader of the stream (the upload page) can say why. (`-->` in the
/// message is broken up so that the comment holds.)
pub(super) fn error_marker(number: usize, e: &ApiError) -> String {
    let message = e.to_string().replace("-->", "-- >");
    format!(
        "<!-- page {number} failed: {}: {message} -->",
        FailReason::Error
    )
}

/// The page-outcome form fields of `/v1/ocr`: `retries` and `accept_length`.
#[derive(Debug, Default)]
pub(super) struct OutcomeFields {
    pub retries: Option<usize>,
    pub accept_length: bool,
}

impl OutcomeFields {
    /// Reads field `name` when it is one of them (`Ok(false)` when it is not).
    pub fn read(&mut self, name: &str, text: &str) -> Result<bool, ApiError> {
        match name {
            "retries" => {
                let n: usize = field_num(name, text)?;
                if n > MAX_RETRIES {
                    return Err(ApiError::bad(
                        name,
                        format!("retries must be at most {MAX_RETRIES}, got {n}"),
                    ));
                }
                self.retries = Some(n);
            }
            "accept_length" => {
                self.accept_length = match text.trim() {
                    "true" | "1" => true,
                    "false" | "0" => false,
                    other => {
                        return Err(ApiError::bad(
                            name,
                            format!("accept_length must be true or false, got {other:?}"),
                        ))
                    }
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The request's policy; a stream makes one attempt (streamed text cannot be taken back),
    /// so `retries` with `stream=true` is refused rather than ignored.
    pub fn policy(&self, stream: bool) -> Result<RetryPolicy, ApiError> {
        let retries = match (self.retries, stream) {
            (Some(n), true) if n > 0 => {
                return Err(ApiError::bad(
                    "retries",
                    "retries needs a whole response: a streamed page cannot be taken back \
                     (leave out stream=true, or send retries=0)",
                ))
            }
            (_, true) => 0,
            (n, false) => n.unwrap_or(RetryPolicy::DEFAULT_RETRIES),
        };
        Ok(RetryPolicy {
            retries,
            accept_length: self.accept_length,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_reasons_map_back_to_the_engines() {
        assert_eq!(finish_of("stop", None), FinishReason::Stop);
        assert_eq!(finish_of("stop", Some("</s>")), FinishReason::Stop);
        assert_eq!(finish_of("length", None), FinishReason::Length);
        assert_eq!(
            finish_of("length", Some("repetition")),
            FinishReason::Repetition
        );
    }

    /// The bytes of a page's entry and of the error of an upload none of whose pages finished,
    /// as they were when built as `serde_json` maps.
    #[test]
    fn entries_keep_their_bytes() {
        let r = PageResult {
            number: 2,
            text: "a\"b".into(),
            finish_reason: "length",
            completion_tokens: 5,
            prompt_tokens_all: 9,
            completion_tokens_all: 15,
            outcome: PageOutcome::failed(FailReason::Length, 3),
        };
        assert_eq!(
            serde_json::to_string(&page_entry(&r)).unwrap(),
            r#"{"attempts":3,"completion_tokens":5,"finish_reason":"length","page":2,"reason":"length","status":"failed","text":"a\"b"}"#
        );
        let ok = PageResult {
            outcome: PageOutcome::finished(1),
            finish_reason: "stop",
            ..r
        };
        let mut e = page_entry(&ok);
        e.text = None;
        e.error = Some("x");
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"attempts":1,"completion_tokens":5,"error":"x","finish_reason":"stop","page":2,"status":"ok"}"#
        );
        let body = serde_json::to_string(&all_failed_error(2)).unwrap();
        assert!(
            body.starts_with(r#"{"code":"pages_failed","message":"no page of the upload finished (2 failed): each ended"#)
                && body.ends_with(r#"accept_length=true","param":null,"type":"invalid_request_error"}"#),
            "{body}"
        );
    }

    /// A streamed page that failed with an error ends with the failed marker, the error's
    /// message inside it (a `-->` in the message cannot end the comment early).
    #[test]
    fn an_error_marker_is_a_failed_marker_with_the_message() {
        let e = ApiError::Timeout { secs: 600 };
        assert_eq!(
            error_marker(3, &e),
            "<!-- page 3 failed: error: request did not finish within 600 s (--request-timeout) -->"
        );
        assert!(crate::generation::outcome::has_failed_marker(
            &error_marker(3, &e)
        ));
        let e = ApiError::Engine("a --> b".into());
        assert_eq!(
            error_marker(1, &e),
            "<!-- page 1 failed: error: generation failed: a -- > b -->"
        );
    }

    #[test]
    fn status_says_whether_some_or_all_pages_failed() {
        assert_eq!(status_of(0, 3), StatusCode::OK);
        assert_eq!(status_of(1, 3), StatusCode::MULTI_STATUS);
        assert_eq!(status_of(3, 3), StatusCode::UNPROCESSABLE_ENTITY);
    }

    #[test]
    fn fields_are_checked_and_a_stream_makes_one_attempt() {
        let mut f = OutcomeFields::default();
        assert!(!f.read("max_tokens", "3").unwrap());
        assert_eq!(f.policy(false).unwrap().retries, 2);
        assert_eq!(f.policy(true).unwrap().retries, 0);
        assert!(f.read("retries", "3").unwrap());
        assert_eq!(f.policy(false).unwrap().retries, 3);
        assert!(f.policy(true).is_err());
        assert!(f.read("retries", "9").is_err());
        assert!(f.read("accept_length", "yes").is_err());
        assert!(f.read("accept_length", "true").unwrap());
        assert!(f.policy(false).unwrap().accept_length);
    }
}
