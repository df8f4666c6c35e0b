//! A document's pages rendered, prepared and queued through a bounded window (issue 41):
//! `/v1/ocr` (streamed or not) and `/v1/ocr/jobs` read documents of hundreds of pages with
//! the memory of [`WINDOW`] of them.
//!
//! [`open`] opens the upload and picks its pages (a PDF in the sandboxed reader, an image
//! checked from its header) and refuses a document past its page limit before anything is
//! rendered. [`queue_pages`] then renders and prepares the pages one at a time on a task of
//! their own, each under its own share of the decode budget (one rendered page and its
//! preprocessed pixels, not the whole document up front), and queues them in order; a page
//! holds its place in the window (a [`Queued`]) until its consumer is done with it, so at most
//! [`WINDOW`] pages are rendered, queued or running at once, and a slow consumer (a stream
//! whose client reads slowly) holds the renderer back. [`run_window`] runs the queued pages to
//! their ends, several at once. Dropping the receiver stops the renderer at its next page.

use super::ocr_form::{page_params, prepare_page, queue_page, Upload};
use super::ocr_pages::{self, PageJob, PageResult};
use super::*;
use crate::documents::pdf::sandbox::OpenPdf;
use crate::generation::pipeline::PreparedPage;
use futures_util::stream::FuturesUnordered;
use std::ops::ControlFlow;
use std::time::Duration;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

/// Pages of one document rendered, queued or running at once (an A4 page waits as ~7 MB of
/// 8-bit pixels).
pub(super) const WINDOW: usize = 16;
/// How long a page waits before asking a full queue again.
const QUEUE_RETRY: Duration = Duration::from_millis(250);

/// What every page of a document is asked with.
pub(super) struct Plan {
    pub max_tokens: usize,
    pub params: SamplingParams,
    pub policy: crate::generation::outcome::RetryPolicy,
    pub prompt: Option<String>,
}

/// The most pages a document may have, and what sets it (named in the 400).
pub(super) struct PageLimit {
    pub max: usize,
    /// E.g. `per job (--max-job-pages)`.
    pub per: &'static str,
}

/// An opened document: a PDF whose pages are rendered one by one, or an image (its one
/// page), decoded when that page is rendered; `Gone` after its renderer panicked.
enum Source {
    Pdf(OpenPdf),
    Image(Option<Bytes>),
    Gone,
}

/// An opened document and the pages to read (1-based numbers, in reading order).
pub(super) struct Document {
    name: String,
    source: Source,
    numbers: Vec<usize>,
    /// Held until every page is rendered (the upload's bytes stay in memory until then).
    pub body: Option<super::super::front::BodyPermit>,
}

impl Document {
    /// Pages to read.
    pub fn pages(&self) -> usize {
        self.numbers.len()
    }
}

/// Opens `doc` and picks its pages: a PDF in the sandboxed reader (the pages `ranges`
/// selects, at most `limit`), an image checked from its header. An upload that cannot be
/// read is a 400 naming `file` (or `pages`), before anything is rendered.
pub(super) async fn open(
    st: Arc<AppState>,
    doc: Upload,
    limit: PageLimit,
) -> Result<Document, ApiError> {
    tokio::task::spawn_blocking(move || {
        let Upload {
            name,
            bytes,
            ranges,
        } = doc;
        if !crate::documents::pdf::is_pdf(&bytes) {
            images::check_upload(&bytes, &name, st.cfg.max_pixels)?;
            return Ok(Document {
                name,
                source: Source::Image(Some(bytes)),
                numbers: vec![1],
                body: None,
            });
        }
        let pdf = st
            .pdf
            .open(bytes.to_vec(), &name)
            .map_err(images::pdf_error)?;
        let count = pdf.page_count();
        let numbers: Vec<usize> = match &ranges {
            Some(r) => r
                .select(count, &name)
                .map_err(|e| ApiError::bad("pages", e.to_string()))?,
            None => (0..count).collect(),
        };
        if numbers.len() > limit.max {
            return Err(ApiError::bad(
                "file",
                format!(
                    "{name}: {} pages, more than the limit of {} {}",
                    numbers.len(),
                    limit.max,
                    limit.per
                ),
            ));
        }
        Ok(Document {
            name,
            source: Source::Pdf(pdf),
            numbers: numbers.into_iter().map(|i| i + 1).collect(),
            body: None,
        })
    })
    .await
    .map_err(|e| ApiError::Engine(format!("opening the document failed: {e}")))?
}

/// How a document's first page meets a full queue.
#[derive(Clone, Copy)]
pub(super) enum First {
    /// 429 (`/v1/ocr`: the client is told to come back), its deadline counting from `since`
    /// (the request's arrival).
    Refuse { since: Instant },
    /// Waits for room like every later page (a job, which has answered already).
    Wait,
}

/// One page out of the window: queued (with the instant its deadline counts from), or why
/// it could not be.
pub(super) struct Queued {
    /// The page's place among the document's pages (0-based).
    pub index: usize,
    pub number: usize,
    pub page: Result<(PageJob, Instant), ApiError>,
    /// The page's place in the window, given back when this is dropped.
    _slot: OwnedSemaphorePermit,
}

impl Queued {
    /// The queued page, or why there is none; the place in the window stays with `self`.
    pub fn take(&mut self) -> Result<(PageJob, Instant), ApiError> {
        std::mem::replace(
            &mut self.page,
            Err(ApiError::Engine("the page was taken already".into())),
        )
    }

    /// Why the page could not be queued, taken out (`None` when it was queued).
    pub fn take_error(&mut self) -> Option<ApiError> {
        match self.page {
            Ok(_) => None,
            Err(_) => self.take().err(),
        }
    }
}

/// Starts rendering, preparing and queueing `doc`'s pages in order (as `{id}-p{number}`) on a
/// task of their own, at most [`WINDOW`] of them out at once; stops when the receiver is
/// dropped.
pub(super) fn queue_pages(
    st: Arc<AppState>,
    doc: Document,
    plan: Arc<Plan>,
    id: String,
    first: First,
) -> mpsc::Receiver<Queued> {
    let (tx, rx) = mpsc::channel(WINDOW);
    tokio::spawn(produce(st, doc, plan, id, first, tx));
    rx
}

/// The task of [`queue_pages`].
async fn produce(
    st: Arc<AppState>,
    mut doc: Document,
    plan: Arc<Plan>,
    id: String,
    first: First,
    tx: mpsc::Sender<Queued>,
) {
    let window = Arc::new(Semaphore::new(WINDOW));
    let numbers = std::mem::take(&mut doc.numbers);
    for (index, number) in numbers.into_iter().enumerate() {
        let Ok(slot) = window.clone().acquire_owned().await else {
            return;
        };
        if tx.is_closed() {
            return;
        }
        let first = if index == 0 { first } else { First::Wait };
        let page = next_page(&st, &mut doc, &plan, &id, (index, number), first, &tx).await;
        let q = Queued {
            index,
            number,
            page,
            _slot: slot,
        };
        if tx.send(q).await.is_err() {
            return;
        }
    }
}

/// Page `number` (the document's `index`-th) rendered, checked against the sequence length
/// and queued.
async fn next_page(
    st: &Arc<AppState>,
    doc: &mut Document,
    plan: &Plan,
    id: &str,
    (index, number): (usize, usize),
    first: First,
    tx: &mpsc::Sender<Queued>,
) -> Result<(PageJob, Instant), ApiError> {
    let source = std::mem::replace(&mut doc.source, Source::Gone);
    let name = doc.name.clone();
    let (source, page) = render(st.clone(), source, name, number, plan, tx.clone()).await;
    doc.source = source;
    let page = page?;
    check_length(st, page.prompt_ids.len(), plan.max_tokens)?;
    let req = st
        .pipeline
        .request_with(page, page_params(&plan.params, index), plan.max_tokens);
    let id = format!("{id}-p{number}");
    submit(st, id, number, req, plan.policy, first, tx).await
}

/// Page `number` of `source`, rendered and prepared on a blocking thread under its share of
/// the decode budget (given back once it is prepared); the source comes back for the next
/// page. Gives up when the receiver of `tx` is gone.
async fn render(
    st: Arc<AppState>,
    mut source: Source,
    name: String,
    number: usize,
    plan: &Plan,
    tx: mpsc::Sender<Queued>,
) -> (Source, Result<PreparedPage, ApiError>) {
    let prompt = plan.prompt.clone();
    let task = tokio::task::spawn_blocking(move || {
        let page = render_blocking(&st, &mut source, &name, number, prompt.as_deref(), &tx);
        (source, page)
    });
    match task.await {
        Ok(r) => r,
        // A panic in the renderer: the document cannot be read further.
        Err(e) => (
            Source::Gone,
            Err(ApiError::Engine(format!(
                "rendering page {number} failed: {e}"
            ))),
        ),
    }
}

/// [`render`]'s blocking work.
fn render_blocking(
    st: &AppState,
    source: &mut Source,
    name: &str,
    number: usize,
    prompt: Option<&str>,
    tx: &mpsc::Sender<Queued>,
) -> Result<PreparedPage, ApiError> {
    let pre = &st.pipeline.preprocess;
    // One page's decode (a PDF page at the renderer's largest side) and its model pixels.
    let cost = match source {
        Source::Pdf(_) => images::pdf_page_bytes(pre),
        Source::Image(Some(bytes)) => images::plan([&bytes[..]], 1, pre).bytes,
        Source::Image(None) | Source::Gone => 0,
    };
    let _permit = st
        .decode_budget
        .acquire(cost, &|| !tx.is_closed())
        .ok_or_else(client_gone)?;
    let img = match source {
        Source::Pdf(pdf) => pdf.render_page(number - 1).map_err(images::pdf_error)?,
        Source::Image(bytes) => {
            let bytes = bytes
                .take()
                .ok_or_else(|| ApiError::Engine("the image was read already".into()))?;
            images::decode_upload(&bytes, name, st.cfg.max_pixels)?
        }
        Source::Gone => {
            return Err(ApiError::Engine(
                "the document could not be read after an earlier page's failure".into(),
            ))
        }
    };
    prepare_page(st, &img, prompt)
}

/// Queues a page's first attempt; while the queue is full it waits (unless `first` says
/// to refuse) and gives up when the receiver of `tx` is gone. Its deadline counts from when
/// it is queued (a refusable first page: from the request's arrival).
async fn submit(
    st: &AppState,
    id: String,
    number: usize,
    req: GenRequest,
    policy: crate::generation::outcome::RetryPolicy,
    first: First,
    tx: &mpsc::Sender<Queued>,
) -> Result<(PageJob, Instant), ApiError> {
    loop {
        let accepted = match first {
            First::Refuse { since } => since,
            First::Wait => Instant::now(),
        };
        let (j, page) = queue_page(st, id.clone(), number, req.clone(), policy, accepted);
        match st.shared.submit(j) {
            Ok(()) => return Ok((page, accepted)),
            Err(ApiError::QueueFull { .. }) if matches!(first, First::Wait) => {
                if tx.is_closed() {
                    return Err(client_gone());
                }
                tokio::time::sleep(QUEUE_RETRY).await
            }
            Err(e) => return Err(e),
        }
    }
}

/// Runs a queued page to its outcome; its place in the window is given back at the end.
async fn run_queued(
    st: &AppState,
    q: Queued,
    policy: crate::generation::outcome::RetryPolicy,
) -> (usize, usize, Result<PageResult, ApiError>) {
    let Queued {
        index,
        number,
        page,
        _slot,
    } = q;
    let r = match page {
        Ok((page, accepted)) => ocr_pages::run_page(st, page, policy, accepted).await,
        Err(e) => Err(e),
    };
    (index, number, r)
}

/// Runs the pages of `rx` to their ends as they are queued, several at once (a page's retry
/// does not wait for the pages before it); each page's index, number and result go to
/// `done`, in the order they end. `Break` stops the document: the pages still running are
/// dropped, so cancelled, and the renderer stops.
pub(super) async fn run_window(
    st: &AppState,
    mut rx: mpsc::Receiver<Queued>,
    policy: crate::generation::outcome::RetryPolicy,
    mut done: impl FnMut(usize, usize, Result<PageResult, ApiError>) -> ControlFlow<()>,
) {
    let mut running = FuturesUnordered::new();
    let mut open = true;
    while open || !running.is_empty() {
        tokio::select! {
            q = rx.recv(), if open => match q {
                Some(q) => running.push(run_queued(st, q, policy)),
                None => open = false,
            },
            Some((i, n, r)) = running.next(), if !running.is_empty() => {
                if done(i, n, r).is_break() {
                    return;
                }
            }
        }
    }
}
