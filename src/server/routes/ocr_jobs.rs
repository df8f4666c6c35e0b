//! Asynchronous OCR jobs for long documents (issue 41): `POST /v1/ocr/jobs` takes what
//! `/v1/ocr` takes and answers 202 with the job at once; the pages run in a task of the
//! server's, so a job outlives its client's connection. `GET /v1/ocr/jobs/{id}` tells each
//! finished page's outcome, `GET /v1/ocr/jobs/{id}/result` answers as `/v1/ocr` would have
//! (markdown or `?format=json`, 200 / 207 / 422), `DELETE /v1/ocr/jobs/{id}` cancels.
//!
//! A job renders, queues and runs at most [`WINDOW`] pages at a time, so its memory does not
//! grow with the document (up to `--max-job-pages`, against `/v1/ocr`'s
//! `max_images_per_request`); each page's `--request-timeout` counts from when it is queued,
//! and a page waits for room when the queue is full rather than failing. A page that cannot
//! be rendered or fails in the engine is a failed page (`reason: error`, its message in the
//! job's status), the others go on. The server keeps `--max-jobs` jobs, running or finished
//! (429 past that), a finished one for `--job-ttl`; jobs live in memory, not across restarts.

use super::bodies::{JobStatus, PageEntry};
use super::ocr_form::{json_format, page_params, prepare_page, queue_page, read_form, Upload};
use super::ocr_pages::{self, PageJob, PageResult};
use super::*;
use crate::documents::pdf::sandbox::OpenPdf;
use crate::generation::outcome::{FailReason, PageOutcome, RetryPolicy};
use axum::extract::Path;
use futures_util::stream::FuturesUnordered;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Pages of one job rendered, queued or running at once (an A4 page waits as ~7 MB of
/// 8-bit pixels).
const WINDOW: usize = 16;
/// How long a page waits before asking a full queue again.
const QUEUE_RETRY: Duration = Duration::from_millis(250);

/// The job store's limits (`serve --max-jobs`, `--job-ttl`, `--max-job-pages`).
#[derive(Debug, Clone, Copy)]
pub struct JobLimits {
    pub max_jobs: usize,
    pub ttl: Duration,
    pub max_pages: usize,
}

/// The jobs a server holds.
pub struct Jobs {
    limits: JobLimits,
    map: Mutex<HashMap<String, Arc<OcrJob>>>,
}

/// One job and what is known of it so far.
pub struct OcrJob {
    id: String,
    created: u64,
    state: Mutex<JobState>,
    task: Mutex<Option<tokio::task::AbortHandle>>,
}

#[derive(Default)]
struct JobState {
    total: usize,
    /// Finished pages, in the order they finished.
    pages: Vec<PageResult>,
    /// Why a failed page failed, where it was an error rather than its tokens.
    errors: HashMap<usize, String>,
    cancelled: bool,
    ended: Option<Instant>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Jobs {
    pub fn new(limits: JobLimits) -> Jobs {
        Jobs {
            limits,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// Drops finished jobs older than the time to live.
    fn purge(&self, map: &mut HashMap<String, Arc<OcrJob>>) {
        let ttl = self.limits.ttl;
        map.retain(|_, j| lock(&j.state).ended.is_none_or(|t| t.elapsed() < ttl));
    }

    /// A new job of `total` pages, or 429 when the store is full.
    fn add(&self, total: usize) -> Result<Arc<OcrJob>, ApiError> {
        let mut map = lock(&self.map);
        self.purge(&mut map);
        if map.len() >= self.limits.max_jobs {
            return Err(ApiError::TooManyJobs {
                max: self.limits.max_jobs,
                ttl_secs: self.limits.ttl.as_secs(),
            });
        }
        let job = Arc::new(OcrJob {
            id: unguessable_id(),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            state: Mutex::new(JobState {
                total,
                ..JobState::default()
            }),
            task: Mutex::new(None),
        });
        map.insert(job.id.clone(), job.clone());
        Ok(job)
    }

    fn get(&self, id: &str) -> Result<Arc<OcrJob>, ApiError> {
        let mut map = lock(&self.map);
        self.purge(&mut map);
        map.get(id).cloned().ok_or_else(|| {
            ApiError::NotFound(format!(
                "no OCR job {id:?} (a finished job is kept for {} s, --job-ttl)",
                self.limits.ttl.as_secs()
            ))
        })
    }
}

/// 128 random bits: without an API key, a job's id is what keeps its text to its client.
fn unguessable_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    // Each RandomState is keyed from the OS's randomness (then stepped), so its SipHash
    // outputs cannot be predicted from earlier ids.
    let half = || {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.finish()
    };
    format!("ocrjob-{:016x}{:016x}", half(), half())
}

impl OcrJob {
    fn status(&self, s: &JobState) -> &'static str {
        match (s.cancelled, s.ended) {
            (true, _) => "cancelled",
            (false, Some(_)) => "completed",
            (false, None) => "running",
        }
    }

    /// `GET /v1/ocr/jobs/{id}`'s answer: the job's status, each finished page without its
    /// text (with its error's message where it failed in one).
    fn status_response(&self) -> Response {
        let s = lock(&self.state);
        let pages = s
            .pages
            .iter()
            .map(|r| PageEntry {
                text: None,
                error: s.errors.get(&r.number).map(String::as_str),
                ..ocr_pages::page_entry(r)
            })
            .collect();
        let body = JobStatus {
            created: self.created,
            id: &self.id,
            object: "ocr.job",
            pages,
            pages_done: s.pages.len(),
            pages_failed: s.pages.iter().filter(|r| r.outcome.is_failed()).count(),
            pages_total: s.total,
            status: self.status(&s),
        };
        Json(body).into_response()
    }

    fn page_done(&self, number: usize, r: Result<PageResult, ApiError>) {
        let mut s = lock(&self.state);
        let r = r.unwrap_or_else(|e| {
            s.errors.insert(number, e.to_string());
            failed_page(number)
        });
        s.pages.push(r);
    }

    fn end(&self, cancelled: bool) {
        let mut s = lock(&self.state);
        s.cancelled |= cancelled;
        s.ended.get_or_insert_with(Instant::now);
    }
}

/// A page that ended in an error (its message is kept beside it).
fn failed_page(number: usize) -> PageResult {
    PageResult {
        number,
        text: String::new(),
        finish_reason: "error",
        completion_tokens: 0,
        prompt_tokens_all: 0,
        completion_tokens_all: 0,
        outcome: PageOutcome::failed(FailReason::Error, 1),
    }
}

/// `POST /v1/ocr/jobs`: the form of `/v1/ocr` (without `stream` and `figures`); the document is
/// opened and its pages counted before the 202, so an unreadable upload is a 400 at once.
pub async fn create_job(
    State(st): St,
    permit: Option<Extension<super::super::front::BodyPermit>>,
    mp: Result<Multipart, MultipartRejection>,
) -> Result<Response, ApiError> {
    let form = read_form(&st, mp).await?;
    let policy = form.outcome.policy(false)?;
    let (name, bytes) = form.file()?;
    check_text_bytes(&st, form.prompt.as_ref().map_or(0, String::len), "prompt")?;
    st.ready()?;
    let plan = Plan {
        max_tokens: form.overrides.max_tokens(&st)?,
        params: form.overrides.sampling(&st)?,
        policy,
        prompt: form.prompt,
    };
    let doc = Upload {
        name,
        bytes,
        prompt: None,
        ranges: form.ranges,
    };
    let (source, numbers) = open(st.clone(), doc).await?;
    drop(permit);
    let job = st.jobs.add(numbers.len())?;
    let task = tokio::spawn(run(st.clone(), job.clone(), source, numbers, plan));
    *lock(&job.task) = Some(task.abort_handle());
    let mut r = job.status_response();
    *r.status_mut() = StatusCode::ACCEPTED;
    Ok(r)
}

/// `GET /v1/ocr/jobs/{id}`.
pub async fn job_status(State(st): St, Path(id): Path<String>) -> Result<Response, ApiError> {
    Ok(st.jobs.get(&id)?.status_response())
}

/// Query of `GET /v1/ocr/jobs/{id}/result`.
#[derive(Debug, serde::Deserialize, Default)]
pub struct ResultQuery {
    /// `markdown` (default) or `json`.
    format: Option<String>,
}

/// `GET /v1/ocr/jobs/{id}/result`: 409 until the job has ended.
pub async fn job_result(
    State(st): St,
    Path(id): Path<String>,
    Query(q): Query<ResultQuery>,
) -> Result<Response, ApiError> {
    let json_out = json_format(q.format.as_deref())?;
    let job = st.jobs.get(&id)?;
    let s = lock(&job.state);
    if s.cancelled || s.ended.is_none() {
        return Err(ApiError::Conflict(format!(
            "OCR job {id} is {} ({} of {} pages done); its result exists once it has completed",
            job.status(&s),
            s.pages.len(),
            s.total
        )));
    }
    let mut pages = s.pages.clone();
    drop(s);
    pages.sort_by_key(|r| r.number);
    Ok(ocr_pages::respond(&st, &pages, json_out, None))
}

/// `DELETE /v1/ocr/jobs/{id}`: stops the pages still queued or running (their engine jobs
/// are cancelled); the job is kept, `cancelled`, with the pages that had finished.
pub async fn cancel_job(State(st): St, Path(id): Path<String>) -> Result<Response, ApiError> {
    let job = st.jobs.get(&id)?;
    let running = lock(&job.state).ended.is_none();
    if running {
        if let Some(t) = lock(&job.task).take() {
            t.abort();
        }
        job.end(true);
    }
    Ok(job.status_response())
}

/// What every page of a job is asked with.
struct Plan {
    max_tokens: usize,
    params: SamplingParams,
    policy: RetryPolicy,
    prompt: Option<String>,
}

/// An opened document: a PDF whose pages are rendered one by one, or an image (taken by its
/// one page); `Gone` after its renderer panicked.
enum Source {
    Pdf(OpenPdf),
    Image(Option<image::RgbImage>),
    Gone,
}

/// Opens `doc` and picks its pages (1-based numbers): a PDF in the sandboxed reader, an image
/// decoded under the decode budget.
async fn open(st: Arc<AppState>, doc: Upload) -> Result<(Source, Vec<usize>), ApiError> {
    tokio::task::spawn_blocking(move || {
        if !crate::documents::pdf::is_pdf(&doc.bytes) {
            let cost = images::plan([&doc.bytes[..]], 1, &st.pipeline.preprocess).bytes;
            let _permit = st.decode_budget.acquire(cost, &|| true);
            let pages =
                images::document_pages(&st.pdf, &doc.bytes, &doc.name, st.cfg.max_pixels, 1, None)?;
            let img = pages.into_iter().next().map(|(_, img)| img);
            return Ok((Source::Image(img), vec![1]));
        }
        let pdf = st
            .pdf
            .open(doc.bytes.to_vec(), &doc.name)
            .map_err(images::pdf_error)?;
        let count = pdf.page_count();
        let numbers: Vec<usize> = match &doc.ranges {
            Some(r) => r
                .select(count, &doc.name)
                .map_err(|e| ApiError::bad("pages", e.to_string()))?,
            None => (0..count).collect(),
        };
        let max = st.jobs.limits.max_pages;
        if numbers.len() > max {
            return Err(ApiError::bad(
                "file",
                format!(
                    "{}: {} pages, more than the limit of {max} per job (--max-job-pages)",
                    doc.name,
                    numbers.len()
                ),
            ));
        }
        Ok((
            Source::Pdf(pdf),
            numbers.into_iter().map(|i| i + 1).collect(),
        ))
    })
    .await
    .map_err(|e| ApiError::Engine(format!("opening the document failed: {e}")))?
}

/// Runs a job's pages to their ends, [`WINDOW`] at a time, then marks it ended.
async fn run(
    st: Arc<AppState>,
    job: Arc<OcrJob>,
    mut source: Source,
    numbers: Vec<usize>,
    plan: Plan,
) {
    let upload = job.id.clone();
    let mut running = FuturesUnordered::new();
    for (i, number) in numbers.into_iter().enumerate() {
        while running.len() >= WINDOW {
            if let Some((n, r)) = running.next().await {
                job.page_done(n, r);
            }
        }
        let (back, page) = render(st.clone(), source, number, plan.prompt.clone()).await;
        source = back;
        let page = match page.and_then(|p| {
            check_length(&st, p.prompt_ids.len(), plan.max_tokens)?;
            Ok(p)
        }) {
            Ok(p) => p,
            Err(e) => {
                job.page_done(number, Err(e));
                continue;
            }
        };
        let params = page_params(&plan.params, i);
        let req = st.pipeline.request_with(page, params, plan.max_tokens);
        let id = format!("{upload}-p{number}");
        let (st2, policy) = (&st, plan.policy);
        running.push(async move {
            let r = match submit(st2, id, number, req, policy).await {
                Ok((page, accepted)) => ocr_pages::run_page(st2, page, policy, accepted).await,
                Err(e) => Err(e),
            };
            (number, r)
        });
    }
    while let Some((n, r)) = running.next().await {
        job.page_done(n, r);
    }
    job.end(false);
}

/// Page `number` of `source`, rendered and prepared on a blocking thread; the source comes
/// back for the next page.
async fn render(
    st: Arc<AppState>,
    mut source: Source,
    number: usize,
    prompt: Option<String>,
) -> (
    Source,
    Result<crate::generation::pipeline::PreparedPage, ApiError>,
) {
    let task = tokio::task::spawn_blocking(move || {
        let img = match &mut source {
            Source::Pdf(pdf) => pdf.render_page(number - 1).map_err(images::pdf_error),
            Source::Image(img) => img
                .take()
                .ok_or_else(|| ApiError::Engine("the image was read already".into())),
            Source::Gone => Err(ApiError::Engine(
                "the document could not be read after an earlier page's failure".into(),
            )),
        };
        let page = img.and_then(|img| prepare_page(&st, &img, prompt.as_deref()));
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

/// Queues a page's first attempt, waiting while the queue is full; its deadline counts
/// from when it is queued.
async fn submit(
    st: &AppState,
    id: String,
    number: usize,
    req: GenRequest,
    policy: RetryPolicy,
) -> Result<(PageJob, Instant), ApiError> {
    loop {
        let accepted = Instant::now();
        let (j, page) = queue_page(st, id.clone(), number, req.clone(), policy, accepted);
        match st.shared.submit(j) {
            Ok(()) => return Ok((page, accepted)),
            Err(ApiError::QueueFull { .. }) => tokio::time::sleep(QUEUE_RETRY).await,
            Err(e) => return Err(e),
        }
    }
}
