//! Request images and memory: decodes share the profile's budget, a request's preprocessed
//! pages count against it until they are queued, images too long for the sequence are refused
//! before anything is decoded, and request bodies share `--body-memory-mb`.

use super::common;
use super::common::server::{
    chat_body, concurrently, gauge, multipart, png_header, request, Server,
};
use super::{error_of, profile};
use ocrctl::server::front::BODY_COPIES;
use serde_json::json;

/// A PNG of `w`×`h` grey pixels (compresses to almost nothing).
fn big_png(w: u32, h: u32) -> Vec<u8> {
    let mut out = Vec::new();
    image::RgbImage::from_pixel(w, h, image::Rgb([200, 200, 200]))
        .write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png)
        .unwrap();
    out
}

pub(super) fn peak_rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// Sends the chat `body` from `n` clients at once; every answer must have `status`.
fn chat_concurrently(s: &Server, n: usize, body: String, status: u16) {
    let addr = s.addr.clone();
    let got = concurrently(n, move |_| {
        common::server::post_json_to(&addr, "/v1/chat/completions", &body)
    });
    for r in got {
        assert_eq!(r.status, status, "{}", r.text());
    }
}

/// 10.3: twelve large PNGs decoded at once to a 4.9 GB RSS. Now decodes share a budget
/// from the profile (`decode_memory_mb`): with 64 MiB, six 3000² uploads (99 MB each by the
/// estimate) decode one at a time.
#[test]
fn concurrent_large_images_decode_within_the_profiles_budget() {
    let dir = tempfile::tempdir().unwrap();
    // Small model inputs (112 px) so that queued pages do not blur the decode peak.
    let p = profile(dir.path(), "decode_memory_mb: 64\n");
    let yaml = std::fs::read_to_string(&p)
        .unwrap()
        .replace("max_image_side: 1540", "max_image_side: 112");
    std::fs::write(&p, yaml).unwrap();
    let s = Server::start(
        common::exported(),
        &["--profile", p.to_str().unwrap()],
        true,
    );
    let png = big_png(3000, 3000);
    let before = peak_rss_kib(s.child.id());
    let addr = s.addr.clone();
    let got = concurrently(6, move |_| {
        // A two-token preview: a page cut there is ok here (issue 38's accept_length).
        let fields = [("max_tokens", "2"), ("accept_length", "true")];
        let (ct, mp) = multipart(&fields, Some(("big.png", &png)));
        request(&addr, "POST", "/v1/ocr", &[("Content-Type", &ct)], &mp).unwrap()
    });
    for r in got {
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let peak = gauge(&s, "ocrctl_image_decode_peak_bytes");
    assert!(peak <= 64 << 20, "peak {peak}");
    assert!(peak > 0);
    // Six concurrent decodes would add ~6 x 63 MB (RGBA-free 8-bit RGB buffers and their
    // copies); one at a time stays well under half of that.
    let grown_mib = (peak_rss_kib(s.child.id()) - before) / 1024;
    assert!(grown_mib < 200, "peak RSS grew by {grown_mib} MiB");
}

/// Sixteen concurrent chat requests of eight blank 1540² PNGs (109 KB each) took the server
/// from 62 MB to 3.0 GB before each was found too long for `max_sequence_length`. The images'
/// tokens are now counted from their headers first: these PNGs hold no pixel data at all, so
/// decoding any of them would fail with a different error.
#[test]
fn images_too_long_for_the_sequence_are_refused_before_decoding() {
    let dir = tempfile::tempdir().unwrap();
    let p = profile(dir.path(), "");
    let s = Server::start(
        common::exported(),
        &["--profile", p.to_str().unwrap()],
        true,
    );
    let mut body = chat_body(&png_header(1540, 1540), "image/png", 8);
    let part = body["messages"][0]["content"][0].clone();
    body["messages"][0]["content"] = json!([part.clone(), part]);
    let r = s.post_json("/v1/chat/completions", &body);
    assert_eq!(r.status, 400, "{}", r.text());
    let (param, msg) = error_of(&r);
    assert_eq!(param, "messages");
    let msg = msg.as_str().unwrap();
    assert!(
        msg.contains("the images take 6050 tokens before any text"),
        "{msg}"
    );
    assert!(msg.contains("4096 (max_sequence_length)"), "{msg}");
    assert_eq!(s.get("/health").unwrap().status, 200);
}

/// A request's preprocessed pages (8-bit, 3 bytes a pixel) stay in memory until it is queued,
/// so they count against `decode_memory_mb` with its decode: one 1540² PNG takes
/// 1540² × (11 + 3) bytes, and two of those do not fit in 48 MiB, so three concurrent requests
/// are prepared one at a time. (Counting the decode alone, the peak was one decode's 26.1 MB.)
#[test]
fn a_requests_pages_count_against_the_budget_until_queued() {
    let dir = tempfile::tempdir().unwrap();
    let p = profile(dir.path(), "decode_memory_mb: 48\n");
    let s = Server::start(
        common::exported(),
        &["--profile", p.to_str().unwrap()],
        true,
    );
    let body = chat_body(&big_png(1540, 1540), "image/png", 1).to_string();
    chat_concurrently(&s, 3, body, 200);
    let peak = gauge(&s, "ocrctl_image_decode_peak_bytes");
    assert_eq!(peak, 1540 * 1540 * (11 + 3));
}

/// Thirty-two concurrent chat requests of 60 MB took the fixture server from 60 MB to 2.0 GB:
/// every body was read whole at once. A body now takes `BODY_COPIES` (2) times its length
/// (what reading and parsing it hold) from `--body-memory-mb` before it is read: with 100 MiB,
/// eight 30 MB bodies are read one at a time (each is refused after reading: its data URL is
/// no image). Before, they added 425 MB; one alone adds ~50 MB.
#[test]
fn request_bodies_share_the_memory_for_bodies() {
    let dir = tempfile::tempdir().unwrap();
    let p = profile(dir.path(), "");
    let yaml = std::fs::read_to_string(&p).unwrap();
    std::fs::write(&p, yaml.replace("max_body_mb: 8", "max_body_mb: 64")).unwrap();
    let s = Server::start(
        common::exported(),
        &["--profile", p.to_str().unwrap(), "--body-memory-mb", "100"],
        true,
    );
    let url = format!("data:image/png;base64,{}", "A".repeat(30 << 20));
    let body = json!({
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
        "max_tokens": 2,
    })
    .to_string();
    drop(url);
    let one = (BODY_COPIES * body.len() as u64).div_ceil(1024) * 1024;
    let before = peak_rss_kib(s.child.id());
    chat_concurrently(&s, 8, body, 400);
    let peak = gauge(&s, "ocrctl_request_body_peak_bytes");
    assert_eq!(peak, one, "one body at a time");
    assert_eq!(
        gauge(&s, "ocrctl_request_body_bytes"),
        0,
        "every body given back"
    );
    let grown_mib = (peak_rss_kib(s.child.id()) - before) / 1024;
    assert!(grown_mib < 200, "peak RSS grew by {grown_mib} MiB");
}
