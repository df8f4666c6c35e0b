//! Typed JSON bodies of `/health` and the `/v1/ocr` routes (the OpenAI ones are in
//! [`crate::server::openai::response`]).
//!
//! Fields are declared in alphabetical order: these bodies were built as `serde_json` maps,
//! which (without the `preserve_order` feature) write their keys sorted, and the bytes on the
//! wire stay as they were. A field skipped when `None` was a key added only when it applied.

use super::ocr_figures::FigureEntry;
use crate::generation::outcome::{FailReason, PageStatus};
use crate::server::error::ErrorDetail;
use crate::server::openai::Usage;
use serde::Serialize;

/// `GET /health`'s body.
#[derive(Debug, Serialize)]
pub(super) struct Health {
    pub engines: Vec<EngineHealth>,
    /// Only when the server failed: every failed engine's reason (`null` when none is known).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Option<String>>,
    pub status: &'static str,
}

/// One engine of [`Health`].
#[derive(Debug, Serialize)]
pub(super) struct EngineHealth {
    pub device: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub status: &'static str,
}

/// One page of a `/v1/ocr` response (`format=json`) or of an OCR job's status.
#[derive(Debug, Serialize)]
pub(super) struct PageEntry<'a> {
    pub attempts: usize,
    pub completion_tokens: usize,
    /// A job's page that failed in an error: the error's message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'a str>,
    /// The page's figures, where they were cropped (`figures=true`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub figures: Option<Vec<FigureEntry>>,
    pub finish_reason: &'static str,
    pub page: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<FailReason>,
    pub status: PageStatus,
    /// The page's text (a job's status leaves it out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<&'a str>,
}

/// `/v1/ocr`'s body with `format=json` (and an OCR job's result).
#[derive(Debug, Serialize)]
pub(super) struct OcrResponse<'a> {
    /// Only when no page finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorDetail>,
    pub failed_pages: Vec<usize>,
    pub model: &'a str,
    pub pages: Vec<PageEntry<'a>>,
    pub text: String,
    pub usage: Usage,
}

/// An OCR job's status (`GET /v1/ocr/jobs/{id}`, and the answers that create or cancel it).
#[derive(Debug, Serialize)]
pub(super) struct JobStatus<'a> {
    pub created: u64,
    pub id: &'a str,
    pub object: &'static str,
    pub pages: Vec<PageEntry<'a>>,
    pub pages_done: usize,
    pub pages_failed: usize,
    pub pages_total: usize,
    pub status: &'static str,
}
