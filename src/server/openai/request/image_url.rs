//! Where a request's images come from: `data:` URLs decoded here, `http(s)://` URLs kept for
//! the fetcher, anything else refused; every error names the request field it came from.

use crate::server::error::ApiError;
use base64::Engine as _;

/// Where an image of a request comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum ImageSource {
    /// Bytes from a `data:` URL; `param` names the field it came from.
    Data { bytes: Vec<u8>, param: String },
    /// An `http(s)://` URL (fetched only with `--allow-remote-images`).
    Remote { url: String, param: String },
}

/// Parses a `data:` URL's payload; only base64 payloads are accepted.
pub fn parse_data_url(url: &str, param: &str) -> Result<Vec<u8>, ApiError> {
    let rest = &url["data:".len()..];
    let Some((meta, payload)) = rest.split_once(',') else {
        return Err(ApiError::bad(
            param,
            "data URL has no ',' before its payload",
        ));
    };
    if !meta.split(';').any(|p| p.eq_ignore_ascii_case("base64")) {
        return Err(ApiError::bad(
            param,
            "data URL must be base64-encoded (data:image/png;base64,...)",
        ));
    }
    // Line breaks inside the payload are allowed; a copy without them is made only when there
    // are some (a payload can be tens of MB, and the request budget counts every copy).
    let cleaned: std::borrow::Cow<'_, [u8]> = if payload.bytes().any(|b| b.is_ascii_whitespace()) {
        payload
            .bytes()
            .filter(|b| !b.is_ascii_whitespace())
            .collect::<Vec<u8>>()
            .into()
    } else {
        payload.as_bytes().into()
    };
    base64::engine::general_purpose::STANDARD
        .decode(&cleaned)
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(&cleaned))
        .map_err(|e| ApiError::bad(param, format!("invalid base64 in data URL: {e}")))
}

/// Classifies an image URL: `data:` (decoded), `http(s)://` (kept), anything else refused.
pub fn image_source(url: &str, param: &str) -> Result<ImageSource, ApiError> {
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    if lower.starts_with("data:") {
        Ok(ImageSource::Data {
            bytes: parse_data_url(url, param)?,
            param: param.to_string(),
        })
    } else if lower.starts_with("http://") || lower.starts_with("https://") {
        Ok(ImageSource::Remote {
            url: url.to_string(),
            param: param.to_string(),
        })
    } else if lower.starts_with("file:") {
        Err(ApiError::bad(
            param,
            "file:// URLs are never read by the server",
        ))
    } else {
        Err(ApiError::bad(
            param,
            "image URL must be a data: URL (data:image/png;base64,...) or http(s)://",
        ))
    }
}
