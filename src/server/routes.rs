//! HTTP handlers: `/v1/chat/completions` (JSON or SSE), `/v1/ocr` (multipart upload →
//! markdown), `/v1/models`, `/health`, `/metrics`.

use super::error::ApiError;
use super::events::{collect, next_event, sse};
use super::images;
use super::metrics::{rss_bytes, EngineGauges, Gauges};
use super::openai::{self, ChatParams};
use super::outbox::{self, EventRx};
use super::worker::{Job, JobEvent, ModelState};
use super::AppState;
use crate::documents::inputs::page_separator;
use crate::generation::engine::GenRequest;
use crate::generation::sampling::{SamplingOverrides, SamplingParams};
use axum::body::{Body, Bytes};
use axum::extract::multipart::MultipartRejection;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, Multipart, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bodies::{EngineHealth, Health};
use futures_util::stream::{self, StreamExt};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

type St = State<Arc<AppState>>;

pub(crate) fn body_error(status: StatusCode, st: &AppState, detail: String) -> ApiError {
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::TooLarge {
            limit_mb: (st.cfg.max_body_bytes / (1024 * 1024)) as u64,
        }
    } else {
        ApiError::invalid(format!("cannot read the request body: {detail}"))
    }
}

/// `GET /health`: 200 while at least one engine is ready (and the server is not shutting
/// down), 503 before (or when every engine failed). The body lists each engine's device and
/// state, so a degraded multi-device server says which engines are not serving.
pub async fn health(State(st): St) -> Response {
    let engines: Vec<EngineHealth> = st
        .shared
        .engines
        .iter()
        .map(|e| EngineHealth {
            device: e.label.clone(),
            error: e.error(),
            status: state_name(e.state()),
        })
        .collect();
    let (status, name) = match (st.shared.state(), st.stopping.load(Ordering::Relaxed)) {
        (ModelState::Ready, false) => (StatusCode::OK, "ok"),
        (ModelState::Ready, true) => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
        (s, _) => (StatusCode::SERVICE_UNAVAILABLE, state_name(s)),
    };
    let body = Health {
        engines,
        error: (name == "failed").then(|| st.shared.failures()),
        status: name,
    };
    (status, Json(body)).into_response()
}

pub(crate) fn state_name(s: ModelState) -> &'static str {
    match s {
        ModelState::Ready => "ok",
        ModelState::Loading => "loading",
        ModelState::Failed => "failed",
    }
}

/// `GET /metrics`: Prometheus text.
pub async fn metrics(State(st): St) -> Response {
    let gpu = match st.gpu_memory {
        Some(probe) => tokio::task::spawn_blocking(probe).await.ok().flatten(),
        None => None,
    };
    let text = st.shared.metrics.render(&Gauges {
        queue_depth: st.shared.queue_depth(),
        batch_size: st.shared.batch_size(),
        ready: st.shared.state() == ModelState::Ready,
        gpu_memory_bytes: gpu,
        rss_bytes: rss_bytes(),
        decode_bytes: st.decode_budget.in_use(),
        decode_peak_bytes: st.decode_budget.peak(),
        body_bytes: st.body_budget.in_use(),
        body_peak_bytes: st.body_budget.peak(),
        engines: st
            .shared
            .engines
            .iter()
            .map(|e| EngineGauges {
                device: e.label.clone(),
                ready: e.state() == ModelState::Ready,
                batch_size: e.batch_size.load(Ordering::Relaxed),
                load_tokens: e.load_tokens.load(Ordering::Relaxed),
                admitted: e.admitted.load(Ordering::Relaxed),
                generated: e.generated.load(Ordering::Relaxed),
                activity: *e.activity.lock().unwrap_or_else(|p| p.into_inner()),
            })
            .collect(),
    });
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// `GET /v1/models`.
pub async fn models(State(st): St) -> Response {
    let list = openai::ModelList::one(
        &st.cfg.model_name,
        st.cfg.created,
        st.cfg.max_sequence_length,
    );
    Json(list).into_response()
}

/// A known route asked with another method: 405 in OpenAI's error shape.
pub async fn method_not_allowed(req: axum::extract::Request) -> ApiError {
    ApiError::MethodNotAllowed(format!(
        "{} is not allowed on {}",
        req.method(),
        req.uri().path()
    ))
}

/// Turns false when dropped. A handler's future is dropped when its client disconnects, so
/// blocking work started for the request checks the flag and stops early (issue 10.2).
pub(crate) struct ClientAlive(Arc<AtomicBool>);

impl ClientAlive {
    fn new() -> ClientAlive {
        ClientAlive(Arc::new(AtomicBool::new(true)))
    }

    fn flag(&self) -> Arc<AtomicBool> {
        self.0.clone()
    }
}

impl Drop for ClientAlive {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

pub(crate) fn client_gone() -> ApiError {
    ApiError::invalid("the client went away")
}

/// Refuses `bytes` of prompt text before tokenising when they surely need more tokens than
/// a sequence may hold (see [`crate::model::prompt::Prompter::max_token_bytes`]).
pub(crate) fn check_text_bytes(st: &AppState, bytes: usize, param: &str) -> Result<(), ApiError> {
    let limit = st
        .cfg
        .max_sequence_length
        .saturating_mul(st.pipeline.prompter().max_token_bytes());
    if bytes > limit {
        return Err(ApiError::bad(
            param,
            format!(
                "the prompt text has {bytes} bytes, more than the {limit} that can fit in \
                 {} tokens (max_sequence_length)",
                st.cfg.max_sequence_length
            ),
        ));
    }
    Ok(())
}

/// Unknown routes: 404 in OpenAI's error shape.
pub async fn not_found(req: axum::extract::Request) -> ApiError {
    ApiError::NotFound(format!("no route {} {}", req.method(), req.uri().path()))
}

/// What a request may override: its token limit and sampling values (applied to the
/// server's defaults by [`PagePipeline::sampling`](crate::generation::pipeline::PagePipeline::sampling)).
#[derive(Default)]
pub(crate) struct Overrides {
    max_tokens: Option<usize>,
    sampling: SamplingOverrides,
}

impl Overrides {
    fn of(p: &ChatParams) -> Overrides {
        Overrides {
            max_tokens: p.max_tokens,
            sampling: SamplingOverrides {
                temperature: p.temperature,
                top_p: p.top_p,
                top_k: p.top_k,
                repetition_penalty: p.repetition_penalty,
                presence_penalty: p.presence_penalty,
                frequency_penalty: p.frequency_penalty,
                logit_bias: p.logit_bias.clone(),
                seed: p.seed,
                loop_guard: None,
            },
        }
    }

    /// The request's sampling parameters, checked; an error names the parameter at fault.
    fn sampling(&self, st: &AppState) -> Result<SamplingParams, ApiError> {
        st.pipeline
            .sampling(&self.sampling)
            .map_err(|e| ApiError::bad(e.param(), e.to_string()))
    }

    fn max_tokens(&self, st: &AppState) -> Result<usize, ApiError> {
        let n = self.max_tokens.unwrap_or(st.cfg.default_max_new_tokens);
        if n > st.cfg.max_new_tokens_limit {
            return Err(ApiError::bad(
                "max_tokens",
                format!(
                    "max_tokens {n} is more than this server's limit of {} (the profile's max_new_tokens_limit)",
                    st.cfg.max_new_tokens_limit
                ),
            ));
        }
        Ok(n)
    }
}

pub(crate) fn check_length(
    st: &AppState,
    prompt: usize,
    max_tokens: usize,
) -> Result<(), ApiError> {
    if prompt + max_tokens > st.cfg.max_sequence_length {
        return Err(ApiError::bad(
            "max_tokens",
            format!(
                "the prompt has {prompt} tokens; with max_tokens {max_tokens} that is more than \
                 the limit of {} (max_sequence_length); send a smaller image or ask for fewer tokens",
                st.cfg.max_sequence_length
            ),
        ));
    }
    Ok(())
}

/// Refuses, before anything is decoded, a request whose images alone (their tokens read from
/// the headers, [`images::plan`]) leave no room for `max_tokens`.
fn check_image_tokens(st: &AppState, tokens: usize, max_tokens: usize) -> Result<(), ApiError> {
    if tokens + max_tokens > st.cfg.max_sequence_length {
        return Err(ApiError::bad(
            "messages",
            format!(
                "the images take {tokens} tokens before any text; with max_tokens {max_tokens} \
                 that is more than the limit of {} (max_sequence_length); send fewer or smaller \
                 images or ask for fewer tokens",
                st.cfg.max_sequence_length
            ),
        ));
    }
    Ok(())
}

pub(crate) fn new_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    format!("{prefix}-{:x}{:06x}", t.as_micros(), n & 0xff_ffff)
}

pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Queues `req`; the receiver hears its tokens.
pub(crate) fn job(
    st: &AppState,
    id: String,
    req: GenRequest,
    stop: Vec<String>,
    accepted: Instant,
) -> (Job, EventRx) {
    let (tx, rx) = outbox::channel(outbox::MAX_UNREAD_BYTES);
    (
        Job {
            id,
            req,
            stop,
            accepted,
            deadline: accepted + st.cfg.request_timeout,
            events: tx,
        },
        rx,
    )
}

/// `POST /v1/chat/completions`.
pub async fn chat(
    State(st): St,
    permit: Option<Extension<super::front::BodyPermit>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let accepted = Instant::now();
    let body = body.map_err(|e| body_error(e.status(), &st, e.body_text()))?;
    let mut p = openai::parse_chat(&body)?;
    drop(body);
    check_text_bytes(&st, openai::text_bytes(&p.messages), "messages")?;
    st.ready()?;
    if let Some(m) = &p.model {
        if m != &st.cfg.model_name {
            return Err(ApiError::NotFound(format!(
                "model {m:?} does not exist; this server serves {:?}",
                st.cfg.model_name
            )));
        }
    }
    if p.images.len() > st.cfg.max_images {
        return Err(ApiError::bad(
            "messages",
            format!(
                "{} images, more than the limit of {} per request (max_images_per_request)",
                p.images.len(),
                st.cfg.max_images
            ),
        ));
    }
    let o = Overrides::of(&p);
    let max_tokens = o.max_tokens(&st)?;
    let params = o.sampling(&st)?;
    let raw = images::resolve(
        std::mem::take(&mut p.images),
        st.cfg.allow_remote_images,
        st.cfg.max_body_bytes,
    )
    .await?;
    let plan = images::plan(
        raw.iter().map(|(b, _)| b.as_slice()),
        1,
        &st.pipeline.preprocess,
    );
    check_image_tokens(&st, plan.tokens, max_tokens)?;
    let st2 = st.clone();
    let messages = std::mem::take(&mut p.messages);
    let client = ClientAlive::new();
    let alive = client.flag();
    let (prompt_ids, pixels) = tokio::task::spawn_blocking(move || {
        // The body's share of the memory for bodies, given back with the image bytes.
        let _body = permit;
        let is_alive = || alive.load(Ordering::Relaxed);
        // One permit for the decodes and every preprocessed page, until they are queued.
        let _permit = st2
            .decode_budget
            .acquire(plan.bytes, &is_alive)
            .ok_or_else(client_gone)?;
        let mut pixels = Vec::with_capacity(raw.len());
        let mut counts = Vec::with_capacity(raw.len());
        for (bytes, param) in &raw {
            let pre =
                images::prepare_image(bytes, param, st2.cfg.max_pixels, &st2.pipeline.preprocess)?;
            counts.push(pre.num_image_tokens);
            pixels.push(pre.pixel_values);
        }
        if !is_alive() {
            return Err(client_gone());
        }
        let ids = st2
            .pipeline
            .prompter()
            .encode_messages(&messages, &counts)
            .map_err(|e| ApiError::bad("messages", e.to_string()))?;
        Ok::<_, ApiError>((ids, pixels))
    })
    .await
    .map_err(|e| ApiError::Engine(format!("preprocessing task failed: {e}")))??;
    let prompt_tokens = prompt_ids.len();
    check_length(&st, prompt_tokens, max_tokens)?;
    let mut req = st
        .pipeline
        .prompt_request(prompt_ids, pixels, params, max_tokens);
    req.logprobs = p.logprobs;
    req.top_logprobs = p.top_logprobs;
    req.ignore_eos = p.ignore_eos;
    let id = new_id("chatcmpl");
    let (job, rx) = job(&st, id.clone(), req, p.stop.clone(), accepted);
    st.shared.submit(job)?;
    let created = now_secs();
    if p.stream {
        let head = openai::ChunkHead {
            id,
            created,
            model: st.cfg.model_name.clone(),
        };
        let s = sse(rx, st.cut.subscribe(), head, prompt_tokens, p.logprobs);
        return Ok(s.into_response());
    }
    let c = collect(rx, st.cut.subscribe()).await?;
    drop(client);
    let logprobs = p.logprobs.then(|| openai::Logprobs::of(&c.logprobs));
    let choice = openai::Choice::new(c.text, c.finish_reason, c.stop_reason, logprobs);
    let usage = openai::Usage::new(prompt_tokens, c.completion_tokens);
    let model = st.cfg.model_name.clone();
    Ok(Json(openai::ChatCompletion::new(
        id, created, model, choice, usage,
    ))
    .into_response())
}

mod bodies;
mod ocr_figures;
mod ocr_form;
mod ocr_jobs;
mod ocr_pages;
mod ocr_window;
pub use ocr_form::*;
pub use ocr_jobs::{cancel_job, create_job, job_result, job_status, JobLimits, Jobs};
