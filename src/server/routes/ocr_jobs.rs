//! Asynchronous OCR jobs for long documents (issue 41): `POST /v1/ocr/jobs` takes what
//! `/v1/ocr` takes and answers 202 with the job at once; the pages run in a task of the
//! server's, so a job outlives its client's connection. `GET /v1/ocr/jobs/{id}` tells each
//! finished page's outcome, `GET /v1/ocr/jobs/{id}/result` answers as `/v1/ocr` would have
//! (markdown or `?format=json`, 200 / 207 / 422), `DELETE /v1/ocr/jobs/{id}` cancels.
//!
//! A job reads its document through [`super::ocr_window`] as `/v1/ocr` does, at most
//! [`WINDOW`](super::ocr_window::WINDOW) pages rendered, queued or running at a time (up to
//! `--max-job-pages`); each page's `--request-timeout` counts from when it is queued, and a
//! page waits for room when the queue is full rather than failing, the first one too. A page
//! that cannot be rendered or fails in the engine is a failed page (`reason: error`, its
//! message in the job's status), the others go on. The server keeps `--max-jobs` jobs, running or finished
//! (429 past that), a finished one for `--job-ttl`; jobs live in memory, not across restarts.

use super::bodies::{JobStatus, PageEntry};
use super::ocr_form::{json_format, read_form, Upload};
use super::ocr_pages::{self, PageResult};
use super::ocr_window::{self, First, PageLimit, Plan};
use super::*;
use crate::generation::outcome::{FailReason, PageOutcome};
use axum::extract::Path;
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Mutex;
use std::time::Duration;

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
        ranges: form.ranges,
    };
    let limit = PageLimit {
        max: st.jobs.limits.max_pages,
        per: "per job (--max-job-pages)",
    };
    let doc = ocr_window::open(st.clone(), doc, limit).await?;
    // The upload's bytes are the job's now (its connection may close): not the body's.
    drop(permit);
    let job = st.jobs.add(doc.pages())?;
    let policy = plan.policy;
    let rx = ocr_window::queue_pages(st.clone(), doc, Arc::new(plan), job.id.clone(), First::Wait);
    let task = tokio::spawn(run(st.clone(), job.clone(), rx, policy));
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

/// Runs a job's pages to their ends, each one's result recorded as it ends, then marks the
/// job ended.
async fn run(
    st: Arc<AppState>,
    job: Arc<OcrJob>,
    rx: tokio::sync::mpsc::Receiver<ocr_window::Queued>,
    policy: crate::generation::outcome::RetryPolicy,
) {
    ocr_window::run_window(&st, rx, policy, |_, number, r| {
        job.page_done(number, r);
        ControlFlow::Continue(())
    })
    .await;
    job.end(false);
}
