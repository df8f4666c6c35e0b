//! Request images to model inputs: `data:` payloads (and, with `--allow-remote-images`,
//! plain `http://` fetches, with hyper's HTTP/1 client) decoded with the pixel limit checked from the header first,
//! PDFs rendered to pages, then preprocessed like `ocrctl ocr` does.

use super::error::ApiError;
use super::openai::ImageSource;
use crate::model::preprocess::{self, PreprocessConfig, PreprocessError, Preprocessed};
use image::RgbImage;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// How long a remote image fetch may take.
pub const REMOTE_FETCH_TIMEOUT: Duration = Duration::from_secs(20);

/// Bytes a decode takes per pixel at least: the decoder's own buffer at up to 8 bytes a pixel
/// (16-bit RGBA) plus the 3-byte RGB copy preprocessing reads. Formats with wider pixels and
/// rotated images take more: [`decode_bytes_per_pixel`].
const DECODE_BYTES_PER_PIXEL: u64 = 11;

/// Bytes a decode takes per pixel of an image whose decoder gives `bpp`-byte pixels, `rotated`
/// when its EXIF orientation is applied (a second buffer of the decoded pixels while it is
/// rotated): the decoded pixels (twice when rotated), an 8-bit RGBA step and the RGB copy,
/// at least [`DECODE_BYTES_PER_PIXEL`]. (A 9000² float32 RGBA TIFF of orientation 6 took
/// 2.47 GB, 30 bytes a pixel, against 11 reserved.)
fn decode_bytes_per_pixel(bpp: u64, rotated: bool) -> u64 {
    (bpp * (1 + u64::from(rotated)) + 4 + 3).max(DECODE_BYTES_PER_PIXEL)
}

/// What a PDF page costs: one bitmap at the renderer's largest side, 4 bytes a pixel.
const PDF_PAGE_BYTES: u64 =
    crate::documents::pdf::PDF_MAX_SIDE as u64 * crate::documents::pdf::PDF_MAX_SIDE as u64 * 4;

/// What one PDF page takes from the [`DecodeBudget`] while it is rendered and prepared: its
/// bitmap at the renderer's largest side and its preprocessed pixels (as [`plan`] counts it).
pub fn pdf_page_bytes(pre: &PreprocessConfig) -> u64 {
    let side = crate::documents::pdf::PDF_MAX_SIDE;
    let (th, tw) = preprocess::target_size(side, side, pre);
    PDF_PAGE_BYTES + u64::from(th) * u64::from(tw) * 3
}

/// Bounds the memory of request images being decoded and preprocessed at once, across all
/// requests: each request first takes its [`Plan`]'s bytes (its largest decode plus its pages'
/// preprocessed pixels) from the budget and gives them back once its pages are queued. A request
/// larger than the whole budget runs alone.
/// (Before, twelve 10000² PNGs of 3.8 MB in all decoded at once to a 4.9 GB RSS; and before the
/// pixels were counted, sixteen requests of eight blank 1540² PNGs held 3.0 GB.)
#[derive(Debug)]
pub struct DecodeBudget {
    total: u64,
    used: Mutex<u64>,
    freed: Condvar,
    peak: AtomicU64,
}

/// Bytes taken from a [`DecodeBudget`], given back on drop.
#[derive(Debug)]
pub struct DecodePermit<'a> {
    budget: &'a DecodeBudget,
    bytes: u64,
}

impl Drop for DecodePermit<'_> {
    fn drop(&mut self) {
        let mut used = self.budget.used.lock().unwrap_or_else(|e| e.into_inner());
        *used -= self.bytes;
        drop(used);
        self.budget.freed.notify_all();
    }
}

impl DecodeBudget {
    /// A budget of `total` bytes (at least 1).
    pub fn new(total: u64) -> DecodeBudget {
        DecodeBudget {
            total: total.max(1),
            used: Mutex::new(0),
            freed: Condvar::new(),
            peak: AtomicU64::new(0),
        }
    }

    /// The most bytes ever taken at once.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Bytes currently taken.
    pub fn in_use(&self) -> u64 {
        *self.used.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits (blocking: call it on a blocking thread) until `bytes` fit, capped at the whole
    /// budget. Gives up with `None` as soon as `alive` says the client went away.
    pub fn acquire(&self, bytes: u64, alive: &dyn Fn() -> bool) -> Option<DecodePermit<'_>> {
        let bytes = bytes.min(self.total);
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        while *used + bytes > self.total {
            if !alive() {
                return None;
            }
            used = self
                .freed
                .wait_timeout(used, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        *used += bytes;
        self.peak.fetch_max(*used, Ordering::Relaxed);
        Some(DecodePermit {
            budget: self,
            bytes,
        })
    }
}

/// `(width, height, bytes a decode takes per pixel)` from an image's header (and EXIF),
/// without decoding it; compressed PNG metadata is left out as decoding leaves it out.
fn header(bytes: &[u8]) -> Option<(u32, u32, u64)> {
    use image::ImageDecoder;
    let png = preprocess::without_compressed_metadata(bytes);
    let mut d = image::ImageReader::new(std::io::Cursor::new(&*png))
        .with_guessed_format()
        .ok()?
        .into_decoder()
        .ok()?;
    let (w, h) = d.dimensions();
    let bpp = u64::from(d.color_type().bytes_per_pixel());
    let rotated = d
        .orientation()
        .is_ok_and(|o| o != image::metadata::Orientation::NoTransforms);
    Some((w, h, decode_bytes_per_pixel(bpp, rotated)))
}

/// What the uploads of one request will take once preprocessed, known from their headers before
/// anything is decoded: [`plan`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Plan {
    /// Image tokens of the plain images (a PDF's pages are counted once rendered; an unknown
    /// format counts 0 and fails to decode).
    pub tokens: usize,
    /// What to take from the [`DecodeBudget`] for the whole request: the largest decode (from
    /// the header's size and pixel type, [`decode_bytes_per_pixel`]; a PDF's pages at [`PDF_PAGE_BYTES`] each;
    /// 0 for an unknown format, which fails to decode at once) plus
    /// every page's preprocessed pixels (8-bit RGB, 3 bytes a pixel: [`preprocess::Pixels`]),
    /// which the request holds until it is queued.
    pub bytes: u64,
}

/// Plans the preprocessing of `uploads` (images, or PDFs counted as `max_pages` pages each:
/// `/v1/ocr` plans a PDF one rendered page at a time, with 1).
///
/// Without it, sixteen concurrent chat requests of eight blank 1540×1540 PNGs (109 KB each)
/// took the fixture server from 62 MB to 3.0 GB before their prompts were found too long
/// (`scripts/serve_image_memory.py`).
/// The token count refuses such a request before decoding, and taking the pixels' bytes from the
/// budget bounds what requests being preprocessed hold at once.
pub fn plan<'a>(
    uploads: impl IntoIterator<Item = &'a [u8]>,
    max_pages: usize,
    pre: &PreprocessConfig,
) -> Plan {
    let align = u64::from(pre.alignment());
    // (tokens, preprocessed bytes) of an image of `w × h` source pixels.
    let page = |w: u32, h: u32| {
        let (th, tw) = preprocess::target_size(h, w, pre);
        let (th, tw) = (u64::from(th), u64::from(tw));
        ((th / align * (tw / align)) as usize, th * tw * 3)
    };
    let (mut plan, mut largest_decode) = (Plan::default(), 0);
    for bytes in uploads {
        // One look at each upload: a PDF, or an image's header.
        let decode = if crate::documents::pdf::is_pdf(bytes) {
            let side = crate::documents::pdf::PDF_MAX_SIDE;
            plan.bytes += page(side, side).1 * max_pages as u64;
            PDF_PAGE_BYTES * max_pages as u64
        } else if let Some((w, h, per_pixel)) = header(bytes) {
            let (tokens, px) = page(w, h);
            plan.tokens += tokens;
            plan.bytes += px;
            u64::from(w) * u64::from(h) * per_pixel
        } else {
            0
        };
        largest_decode = largest_decode.max(decode);
    }
    plan.bytes += largest_decode;
    plan
}

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

/// A PDF that cannot be read as the client's fault (400 naming `file`), or the server's
/// (503: no pdfium, no worker).
pub fn pdf_error(e: crate::documents::pdf::PdfError) -> ApiError {
    use crate::documents::pdf::PdfError;
    match e {
        PdfError::LibraryNotFound { .. }
        | PdfError::LibraryMissing { .. }
        | PdfError::LibraryLoad { .. }
        | PdfError::WorkerStart { .. } => ApiError::Unavailable(e.to_string()),
        _ => ApiError::bad("file", e.to_string()),
    }
}

/// An uploaded image decoded (its header's pixel count checked first); a failure is a 400
/// naming `file`.
pub fn decode_upload(bytes: &[u8], name: &str, max_pixels: u64) -> Result<RgbImage, ApiError> {
    preprocess::decode_image_bytes(bytes, name, max_pixels).map_err(|e| decode_error(e, "file"))
}

/// Checks an uploaded image from its header alone (a known format, at most `max_pixels`), so
/// that an upload decoded later is refused up front as [`decode_upload`] would refuse it.
pub fn check_upload(bytes: &[u8], name: &str, max_pixels: u64) -> Result<(), ApiError> {
    match header(bytes) {
        Some((w, h, _)) if w > 0 && h > 0 && u64::from(w) * u64::from(h) <= max_pixels => Ok(()),
        // Decoding reads the header first, so it fails there, before any pixel, with the
        // error the decode itself would give.
        _ => decode_upload(bytes, name, max_pixels).map(drop),
    }
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

/// GET `url` (plain `http://`, no redirects, no TLS) with hyper's HTTP/1 client, keeping at most
/// `max_bytes` of the body (chunked or not).
async fn fetch(url: &str, max_bytes: usize) -> Result<Vec<u8>, String> {
    use http_body_util::{BodyExt, Empty, Limited};
    let uri: hyper::Uri = url.parse().map_err(|e| format!("bad URL: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err("only http:// URLs can be fetched (https needs TLS, not built in)".into());
    }
    let authority = uri.authority().ok_or("bad host")?.clone();
    if authority.as_str().contains('@') {
        return Err("bad host".into());
    }
    let addr = (authority.host(), authority.port_u16().unwrap_or(80));
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    // The connection task ends with the response (or when this future is dropped).
    let conn = tokio::spawn(conn);
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, authority.as_str())
        .header(hyper::header::USER_AGENT, "ocrctl")
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    if resp.status() != hyper::StatusCode::OK {
        conn.abort();
        return Err(format!("HTTP status {}", resp.status().as_u16()));
    }
    let body = Limited::new(resp.into_body(), max_bytes)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                format!("response larger than {max_bytes} bytes")
            } else {
                e.to_string()
            }
        })?;
    conn.abort();
    Ok(body.to_bytes().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn the_budget_bounds_bytes_in_flight_and_lets_a_huge_one_run_alone() {
        let budget = Arc::new(DecodeBudget::new(100));
        let peak = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let (b, peak) = (budget.clone(), peak.clone());
                std::thread::spawn(move || {
                    // One of them asks for more than the whole budget.
                    let want = if i == 3 { 1000 } else { 40 };
                    let _p = b.acquire(want, &|| true).unwrap();
                    peak.fetch_max(b.in_use(), Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(20));
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(peak.load(Ordering::SeqCst) <= 100);
        assert_eq!(budget.in_use(), 0, "every permit was given back");
        // A client that left stops waiting.
        let _all = budget.acquire(100, &|| true).unwrap();
        assert!(budget.acquire(1, &|| false).is_none());
    }

    /// Serves `response` (raw bytes) to the first connection; returns its `http://` base.
    async fn one_shot(response: Vec<u8>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(&response).await;
        });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn remote_images_are_fetched_chunked_or_not_within_the_limit() {
        let plain = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello".to_vec();
        assert_eq!(
            fetch(&(one_shot(plain).await + "/a.png"), 100)
                .await
                .unwrap(),
            b"hello"
        );
        let chunked =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
                .to_vec();
        assert_eq!(
            fetch(&one_shot(chunked).await, 100).await.unwrap(),
            b"abcde"
        );
        let big = b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n"
            .iter()
            .copied()
            .chain(std::iter::repeat_n(b'x', 50))
            .collect();
        let e = fetch(&one_shot(big).await, 10).await.unwrap_err();
        assert!(e.contains("larger than 10 bytes"), "{e}");
        let missing = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec();
        let e = fetch(&one_shot(missing).await, 10).await.unwrap_err();
        assert_eq!(e, "HTTP status 404");
        assert!(fetch("https://example.com/x.png", 10)
            .await
            .unwrap_err()
            .contains("https"));
        assert!(fetch("http://user@host/x", 10)
            .await
            .unwrap_err()
            .contains("bad host"));
    }

    #[test]
    fn a_decode_is_costed_from_the_header_only() {
        let one = plan([png(300, 200).as_slice()], 8, &PreprocessConfig::default());
        // 300 × 200 fits: 308 × 224 pixels after aligning each side up to 28.
        assert_eq!(
            one.bytes,
            300 * 200 * DECODE_BYTES_PER_PIXEL + 308 * 224 * 3
        );
        assert_eq!(
            plan(
                [b"not an image".as_slice()],
                8,
                &PreprocessConfig::default()
            )
            .bytes,
            0
        );
    }

    fn png(w: u32, h: u32) -> Vec<u8> {
        let mut out = Vec::new();
        image::RgbImage::new(w, h)
            .write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png)
            .unwrap();
        out
    }

    /// The plan's tokens are what preprocessing gives, in either orientation; its bytes are
    /// the largest decode plus every page's 8-bit pixels.
    #[test]
    fn a_plan_counts_tokens_and_bytes_from_headers() {
        let pre = PreprocessConfig::default();
        let uploads = [png(3000, 2000), png(100, 40), png(2000, 3000)];
        let plan = plan(uploads.iter().map(Vec::as_slice), 4, &pre);
        let mut tokens = 0;
        let mut pixels = 0;
        for (w, h) in [(3000, 2000), (100, 40), (2000, 3000)] {
            let p = preprocess::preprocess(&RgbImage::new(w, h), &pre);
            tokens += p.num_image_tokens;
            pixels += p.pixel_values.held_bytes() as u64;
        }
        assert_eq!(plan.tokens, tokens);
        assert_eq!(plan.bytes, pixels + 3000 * 2000 * DECODE_BYTES_PER_PIXEL);
        // A PDF: its pages' tokens are left to the per-page check, its bytes are the worst case.
        let pdf = b"%PDF-1.7\n".as_slice();
        let p = super::plan([pdf], 3, &pre);
        assert_eq!(p.tokens, 0);
        assert!(p.bytes >= 3 * (PDF_PAGE_BYTES + 1540 * 1540 * 3), "{p:?}");
        assert_eq!(super::plan([b"junk".as_slice()], 3, &pre), Plan::default());
        // `/v1/ocr` takes a PDF's share one rendered page at a time.
        assert_eq!(super::plan([pdf], 1, &pre).bytes, pdf_page_bytes(&pre));
    }
}
