//! `ocrctl serve`: an OpenAI-compatible HTTP server over the continuous-batching engine.
//!
//! One engine thread per device owns a copy of the model ([`worker`]), all drawing from one
//! bounded queue ([`queue`]: the least loaded engine with room takes the next job); axum handlers parse and check requests
//! ([`openai`], [`images`]), preprocess images on tokio's blocking pool, and queue jobs
//! through a bounded queue (429 when full). Errors are one enum ([`error::ApiError`]) mapped
//! once to statuses and OpenAI's error body.
//!
//! ```text
//! ocrctl serve --model out/tiny --profile cpu --precision fp32 --port 8000
//! curl -s localhost:8000/v1/ocr -F file=@page.png
//! ```

pub mod error;
mod events;
pub mod front;
pub mod images;
pub mod metrics;
pub mod openai;
pub mod outbox;
mod page;
pub mod queue;
mod routes;
pub use routes::{JobLimits, Jobs};
pub mod stops;
pub mod worker;
pub mod write_timeout;

use crate::generation::pipeline::PagePipeline;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use error::ApiError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use worker::{ModelState, Shared};

/// Fixed settings of a running server (from the profile and flags).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The name `/v1/models` lists and requests may ask for.
    pub model_name: String,
    pub max_body_bytes: usize,
    /// Images of one chat request (the profile's `max_images_per_request`).
    pub max_images: usize,
    /// Pages of one `/v1/ocr` document (`--max-pages-per-request`, else the profile's
    /// `max_pages_per_request`).
    pub max_pages: usize,
    /// Pixel limit checked from an image's header before decoding.
    pub max_pixels: u64,
    pub default_max_new_tokens: usize,
    pub max_new_tokens_limit: usize,
    /// Prompt + new tokens of one sequence.
    pub max_sequence_length: usize,
    pub api_key: Option<String>,
    /// `/metrics` answers without the API key (it needs the key by default when one is set).
    pub open_metrics: bool,
    pub allow_remote_images: bool,
    pub request_timeout: Duration,
    /// Unix time the server started (OpenAI's `created` of the model).
    pub created: u64,
    /// Connection limits, timeouts and the hosts a key-less server answers to.
    pub front: front::FrontLimits,
}

/// Everything handlers share.
pub struct AppState {
    pub cfg: ServerConfig,
    pub shared: Arc<Shared>,
    /// The export's page recipe: prompts, preprocessing (its longest edge the profile's),
    /// stop ids and the sampling defaults requests override.
    pub pipeline: PagePipeline,
    /// Set on SIGTERM: new generation requests get 503 while running ones finish.
    pub stopping: AtomicBool,
    /// GPU memory probe for `/metrics` (None on CPU-only servers).
    pub gpu_memory: Option<fn() -> Option<u64>>,
    /// Turns true when the shutdown grace period is over: streams still running end with
    /// an error event (and `[DONE]`) instead of being cut mid-way.
    pub cut: tokio::sync::watch::Sender<bool>,
    /// Bounds the memory of images being decoded at once (see [`images::DecodeBudget`]).
    pub decode_budget: images::DecodeBudget,
    /// Bounds the memory of request bodies held at once (see [`front::BodyBudget`]).
    pub body_budget: front::BodyBudget,
    /// Reads uploaded PDFs (in worker processes with time and memory limits).
    pub pdf: crate::documents::pdf::sandbox::PdfReader,
    /// Asynchronous OCR jobs (`/v1/ocr/jobs`).
    pub jobs: routes::Jobs,
}

impl AppState {
    /// 503 unless the model is loaded and the server is not shutting down.
    fn ready(&self) -> Result<(), ApiError> {
        if self.stopping.load(Ordering::Relaxed) {
            return Err(ApiError::Unavailable("the server is shutting down".into()));
        }
        match self.shared.state() {
            ModelState::Ready => Ok(()),
            ModelState::Loading => Err(ApiError::Unavailable("the model is still loading".into())),
            ModelState::Failed => Err(ApiError::Unavailable(format!(
                "the model is unavailable: {}",
                self.shared.failures().unwrap_or_default()
            ))),
        }
    }
}

/// Compares two secrets in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() != b.len()) as u8;
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    diff == 0
}

/// Checks `Authorization: Bearer KEY` on `/v1/*` and `/metrics` (unless
/// [`ServerConfig::open_metrics`]) when an API key is set. `/health` stays open for probes,
/// `/` (a static page that asks for the key) for browsers.
async fn auth(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.cfg.api_key {
        let path = req.uri().path();
        if path.starts_with("/v1/") || (path == "/metrics" && !st.cfg.open_metrics) {
            // The auth scheme is case-insensitive (RFC 7235 §2.1).
            let given = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim_start().split_once(' '))
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, key)| key.trim());
            match given {
                None => {
                    return ApiError::Unauthorized(
                        "missing API key: send Authorization: Bearer <key>".into(),
                    )
                    .into_response()
                }
                Some(g) if !constant_time_eq(g.as_bytes(), key.as_bytes()) => {
                    return ApiError::Unauthorized("invalid API key".into()).into_response()
                }
                Some(_) => {}
            }
        }
    }
    next.run(req).await
}

/// Routes whose responses are counted by path; anything else counts as `other`.
const ROUTES: [&str; 7] = [
    "/",
    "/health",
    "/metrics",
    "/v1/models",
    "/v1/chat/completions",
    "/v1/ocr",
    "/v1/ocr/jobs",
];

/// Counts every response by route and status.
async fn count(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    // A job's own paths count as `/v1/ocr/jobs` (their ids would make a label per job).
    let path = match path.strip_prefix("/v1/ocr/jobs/") {
        Some(_) => "/v1/ocr/jobs",
        None => path,
    };
    let route = ROUTES
        .iter()
        .find(|r| **r == path)
        .copied()
        .unwrap_or("other");
    let r = next.run(req).await;
    st.shared.metrics.count_request(route, r.status().as_u16());
    r
}

/// The server's routes and middleware.
pub fn router(st: Arc<AppState>) -> Router {
    Router::new()
        .route("/", get(page::upload_page))
        .route("/health", get(routes::health))
        .route("/metrics", get(routes::metrics))
        .route("/v1/models", get(routes::models))
        .route("/v1/chat/completions", post(routes::chat))
        .route("/v1/ocr", post(routes::ocr))
        .route("/v1/ocr/jobs", post(routes::create_job))
        .route(
            "/v1/ocr/jobs/{id}",
            get(routes::job_status).delete(routes::cancel_job),
        )
        .route("/v1/ocr/jobs/{id}/result", get(routes::job_result))
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(DefaultBodyLimit::max(st.cfg.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(
            st.clone(),
            front::guard,
        ))
        .layer(axum::middleware::from_fn_with_state(st.clone(), auth))
        .layer(axum::middleware::from_fn_with_state(st.clone(), count))
        .with_state(st)
}

/// Serves on `listener` until SIGTERM/SIGINT, then stops accepting, lets running requests
/// finish for at most `grace`, ends the streams still running with an error event, and
/// returns. Connection limits and timeouts: [`front`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    st: Arc<AppState>,
    grace: Duration,
) -> std::io::Result<()> {
    let app = router(st.clone());
    let (_never, stop) = tokio::sync::watch::channel(false);
    front::serve(listener, app, st, grace, stop).await
}

pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_compares_whole_secrets() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }
}
