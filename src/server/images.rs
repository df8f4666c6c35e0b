//! Request images to model inputs: `data:` payloads (and, with `--allow-remote-images`,
//! plain `http://` fetches) decoded with the pixel limit checked from the header first,
//! PDFs rendered to pages, then preprocessed like `ocrctl ocr` does.

use super::error::ApiError;
use super::openai::ImageSource;
use crate::preprocess::{self, PreprocessConfig, PreprocessError, Preprocessed};
use image::RgbImage;
use std::time::Duration;

/// How long a remote image fetch may take.
pub const REMOTE_FETCH_TIMEOUT: Duration = Duration::from_secs(20);

/// Maps a decoding failure to a 400 naming the request field.
fn decode_error(e: PreprocessError, param: &str) -> ApiError {
    ApiError::bad(param, e.to_string())
}

/// Decodes one image (refusing it before decoding when its header declares more than
/// `max_pixels`) and preprocesses it.
pub fn prepare_image(
    bytes: &[u8],
    param: &str,
    max_pixels: u64,
    pre: &PreprocessConfig,
) -> Result<Preprocessed, ApiError> {
    let img = preprocess::decode_image_bytes(bytes, param, max_pixels)
        .map_err(|e| decode_error(e, param))?;
    Ok(preprocess::preprocess(&img, pre))
}

/// The pages of an upload: a PDF's pages rendered at 200 DPI, or the image itself.
pub fn document_pages(
    bytes: &[u8],
    name: &str,
    max_pixels: u64,
    max_pages: usize,
) -> Result<Vec<RgbImage>, ApiError> {
    if crate::pdf::is_pdf(bytes) {
        use crate::pdf::PdfError;
        let pdf_error = |e: PdfError| match e {
            // The server's set-up is at fault, not the upload.
            PdfError::LibraryNotFound { .. }
            | PdfError::LibraryMissing { .. }
            | PdfError::LibraryLoad { .. } => ApiError::Unavailable(e.to_string()),
            _ => ApiError::bad("file", e.to_string()),
        };
        let doc = crate::pdf::PdfDocument::open(bytes, name, None).map_err(pdf_error)?;
        // Counted before anything is rendered.
        if doc.page_count() > max_pages {
            return Err(ApiError::bad(
                "file",
                format!(
                    "{name}: {} pages, more than the limit of {max_pages} per request (max_images_per_request)",
                    doc.page_count()
                ),
            ));
        }
        return (0..doc.page_count())
            .map(|i| doc.render_page(i).map_err(pdf_error))
            .collect();
    }
    let img = preprocess::decode_image_bytes(bytes, name, max_pixels)
        .map_err(|e| decode_error(e, "file"))?;
    Ok(vec![img])
}

/// Fetches `http://` images when allowed; `https://` needs TLS, which this binary leaves
/// out, so it is refused with a pointer to `data:` URLs.
pub async fn resolve(
    sources: Vec<ImageSource>,
    allow_remote: bool,
    max_bytes: usize,
) -> Result<Vec<(Vec<u8>, String)>, ApiError> {
    let mut out = Vec::with_capacity(sources.len());
    for s in sources {
        match s {
            ImageSource::Data { bytes, param } => out.push((bytes, param)),
            ImageSource::Remote { url, param } => {
                if !allow_remote {
                    return Err(ApiError::bad(
                        param,
                        "remote image URLs are refused (the server does not fetch URLs unless \
                         started with --allow-remote-images); send the image as a data: URL",
                    ));
                }
                let bytes = tokio::time::timeout(REMOTE_FETCH_TIMEOUT, fetch(&url, max_bytes))
                    .await
                    .map_err(|_| ApiError::bad(&param, format!("fetching {url} timed out")))?
                    .map_err(|e| ApiError::bad(&param, format!("fetching {url}: {e}")))?;
                out.push((bytes, param));
            }
        }
    }
    Ok(out)
}

/// A minimal HTTP/1.1 GET over plain TCP (no redirects, no TLS), at most `max_bytes`.
async fn fetch(url: &str, max_bytes: usize) -> Result<Vec<u8>, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url
        .strip_prefix("http://")
        .ok_or("only http:// URLs can be fetched (https needs TLS, not built in)")?;
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if hostport.is_empty() || hostport.contains('@') {
        return Err("bad host".into());
    }
    let addr = if hostport.contains(':') {
        hostport.to_string()
    } else {
        format!("{hostport}:80")
    };
    let mut s = tokio::net::TcpStream::connect(&addr)
        .await
        .map_err(|e| e.to_string())?;
    let host = hostport;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nUser-Agent: ocrctl\r\n\r\n")
            .as_bytes(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    loop {
        let n = s.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > max_bytes + 65536 {
            return Err(format!("response larger than {max_bytes} bytes"));
        }
    }
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no HTTP header")?;
    let head = String::from_utf8_lossy(&buf[..end]).to_string();
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        return Err(format!("HTTP status {status}"));
    }
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Err("chunked responses are not supported".into());
    }
    let body = buf[end + 4..].to_vec();
    if body.len() > max_bytes {
        return Err(format!("response larger than {max_bytes} bytes"));
    }
    Ok(body)
}
