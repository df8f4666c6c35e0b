//! `GET /`: the upload page, one self-contained HTML file compiled into the binary.

use axum::http::header;
use axum::response::IntoResponse;

/// The page's HTML (no external assets).
pub const UPLOAD_PAGE: &str = include_str!("upload.html");

/// Serves the upload page.
pub async fn upload_page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'",
            ),
        ],
        UPLOAD_PAGE,
    )
}
