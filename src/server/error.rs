//! [`ApiError`]: every way an HTTP request can fail, mapped once to a status code and
//! OpenAI's error body `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// OpenAI's error body, `{"error": {...}}` (fields in alphabetical order, as the body was
/// written when built as a `serde_json` map).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// The object under `error`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorDetail {
    pub code: &'static str,
    pub message: String,
    /// The request field at fault; `null` when none is.
    pub param: Option<String>,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// An error answered to a client. `param` names the request field at fault when there is one.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed or asks for something unsupported (400).
    #[error("{message}")]
    BadRequest {
        message: String,
        param: Option<String>,
    },
    /// Missing or wrong API key (401).
    #[error("{0}")]
    Unauthorized(String),
    /// A Host header this server does not answer to (403; DNS-rebinding guard).
    #[error("{0}")]
    Forbidden(String),
    /// Unknown route or model (404).
    #[error("{0}")]
    NotFound(String),
    /// A route asked with a method it does not take (405).
    #[error("{0}")]
    MethodNotAllowed(String),
    /// The body did not arrive in time (408).
    #[error("{0}")]
    BodyTimeout(String),
    /// A JSON route sent something other than `application/json` (415).
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// The request's headers are larger than the server takes (431).
    #[error("request headers are larger than the limit of {limit_kib} KiB")]
    HeadersTooLarge { limit_kib: usize },
    /// The body is larger than the profile's `max_body_mb` (413).
    #[error("request body is larger than the limit of {limit_mb} MiB (max_body_mb)")]
    TooLarge { limit_mb: u64 },
    /// The server holds as many OCR jobs as it keeps (429, with `Retry-After`).
    #[error("the server already holds {max} OCR jobs (--max-jobs); a finished one is dropped {ttl_secs} s after it ends (--job-ttl), or cancel one")]
    TooManyJobs { max: usize, ttl_secs: u64 },
    /// The resource is not in a state that allows this (409), e.g. a job still running.
    #[error("{0}")]
    Conflict(String),
    /// The queue is full (429, with `Retry-After`).
    #[error("the server is busy: {queued} requests are already waiting (queue_size); retry later")]
    QueueFull { queued: usize },
    /// The model is still loading, the server is shutting down, or the engine stopped (503).
    #[error("{0}")]
    Unavailable(String),
    /// The request's deadline passed before it finished (504).
    #[error("request did not finish within {secs} s (--request-timeout)")]
    Timeout { secs: u64 },
    /// The engine failed on this request (500).
    #[error("generation failed: {0}")]
    Engine(String),
}

impl ApiError {
    /// A 400 naming the request field at fault.
    pub fn bad(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError::BadRequest {
            message: message.into(),
            param: Some(param.into()),
        }
    }

    /// A 400 about the request as a whole.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::BadRequest {
            message: message.into(),
            param: None,
        }
    }

    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::HeadersTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::QueueFull { .. } | ApiError::TooManyJobs { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Engine(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `type` and `code` strings for this error.
    fn kind(&self) -> (&'static str, &'static str) {
        match self {
            ApiError::BadRequest { .. } => ("invalid_request_error", "invalid_value"),
            ApiError::Unauthorized(_) => ("authentication_error", "invalid_api_key"),
            ApiError::Forbidden(_) => ("invalid_request_error", "host_not_allowed"),
            ApiError::NotFound(_) => ("invalid_request_error", "not_found"),
            ApiError::MethodNotAllowed(_) => ("invalid_request_error", "method_not_allowed"),
            ApiError::BodyTimeout(_) => ("invalid_request_error", "body_timeout"),
            ApiError::UnsupportedMediaType(_) => {
                ("invalid_request_error", "unsupported_media_type")
            }
            ApiError::HeadersTooLarge { .. } => ("invalid_request_error", "headers_too_large"),
            ApiError::TooLarge { .. } => ("invalid_request_error", "request_too_large"),
            ApiError::QueueFull { .. } => ("rate_limit_error", "queue_full"),
            ApiError::TooManyJobs { .. } => ("rate_limit_error", "too_many_jobs"),
            ApiError::Conflict(_) => ("invalid_request_error", "conflict"),
            ApiError::Unavailable(_) => ("server_error", "unavailable"),
            ApiError::Timeout { .. } => ("server_error", "timeout"),
            ApiError::Engine(_) => ("server_error", "engine_error"),
        }
    }

    /// The JSON body `{"error": {...}}` (also sent as an SSE event inside streams).
    pub fn body(&self) -> ErrorBody {
        let (kind, code) = self.kind();
        let param = match self {
            ApiError::BadRequest { param, .. } => param.clone(),
            _ => None,
        };
        ErrorBody {
            error: ErrorDetail {
                code,
                message: self.to_string(),
                param,
                kind,
            },
        }
    }
}

/// Seconds a client is told to wait after a 429.
pub const RETRY_AFTER_SECS: u64 = 1;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status(), axum::Json(self.body())).into_response();
        match &self {
            ApiError::QueueFull { .. } | ApiError::TooManyJobs { .. } => {
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
            }
            ApiError::Unauthorized(_) => {
                r.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_openai_shape_and_status_matches() {
        let e = ApiError::bad("n", "n must be 1");
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let b = serde_json::to_value(e.body()).unwrap();
        assert_eq!(b["error"]["param"], "n");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(b["error"]["message"], "n must be 1");
        let r = ApiError::QueueFull { queued: 3 }.into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }

    /// The bytes the body had when it was built as a `serde_json` map.
    #[test]
    fn bodies_keep_their_bytes() {
        let json = |e: ApiError| serde_json::to_string(&e.body()).unwrap();
        assert_eq!(
            json(ApiError::bad("n", "n \"must\" be 1")),
            r#"{"error":{"code":"invalid_value","message":"n \"must\" be 1","param":"n","type":"invalid_request_error"}}"#
        );
        assert_eq!(
            json(ApiError::Engine("boom".into())),
            r#"{"error":{"code":"engine_error","message":"generation failed: boom","param":null,"type":"server_error"}}"#
        );
    }
}
