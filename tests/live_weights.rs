//! Issue 42, N9: a running server's export replaced under it. ONNX Runtime memory-mapped the
//! external weights, so truncating a served `.onnx_data` (what `cp new/* live/` does first)
//! killed `ocrctl serve` with SIGBUS at its next request. The weights are now read into
//! memory at load: the server answers as before, whatever happens to the files.

mod common;

use common::server::{chat_body, chat_text, multipart, request, Server};
use std::path::{Path, PathBuf};

/// A private copy of the fixture export (the test damages it).
fn copy_export(to: &Path) -> PathBuf {
    let out = to.join("live");
    let src = common::exported();
    for sub in ["", "onnx"] {
        std::fs::create_dir_all(out.join(sub)).unwrap();
        for e in std::fs::read_dir(src.join(sub)).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_file() {
                std::fs::copy(e.path(), out.join(sub).join(e.file_name())).unwrap();
            }
        }
    }
    out
}

/// The export's external weight files.
fn data_files(export: &Path) -> Vec<PathBuf> {
    let files: Vec<PathBuf> = std::fs::read_dir(export.join("onnx"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "onnx_data"))
        .collect();
    assert!(files.len() >= 3, "{files:?}");
    files
}

/// The chat answer and the `/v1/ocr` answer for the fixture's `aligned.png`.
fn answers(s: &Server, png: &[u8]) -> (String, String) {
    let r = s.post_json("/v1/chat/completions", &chat_body(png, "image/png", 16));
    assert_eq!(r.status, 200, "{}", r.text());
    let (ct, body) = multipart(&[("max_tokens", "16")], Some(("aligned.png", png)));
    let o = request(&s.addr, "POST", "/v1/ocr", &[("Content-Type", &ct)], &body).unwrap();
    assert_eq!(o.status, 200, "{}", o.text());
    (chat_text(&r), o.text().trim_end_matches('\n').to_string())
}

#[test]
fn truncated_and_overwritten_weights_do_not_stop_a_running_server() {
    let dir = tempfile::tempdir().unwrap();
    let export = copy_export(dir.path());
    let profile = common::server::test_profile(dir.path(), 2, 8, 8);
    let s = Server::start(&export, &["--profile", profile.to_str().unwrap()], true);
    let png = std::fs::read(common::fixture().join("images/aligned.png")).unwrap();
    let before = answers(&s, &png);
    assert!(!before.0.is_empty(), "{before:?}");
    assert_eq!(before.0, before.1);

    let files = data_files(&export);
    for f in &files {
        std::fs::File::create(f).unwrap(); // truncated to 0 bytes, as `cp` does first
    }
    assert_eq!(answers(&s, &png), before, "after truncation");
    for f in &files {
        std::fs::write(f, vec![0xffu8; 3 << 20]).unwrap(); // NaNs where the weights were
    }
    assert_eq!(answers(&s, &png), before, "after overwriting");
    assert_eq!(s.get("/health").unwrap().status, 200);
    let log = s.log.lock().unwrap().clone();
    assert!(!log.contains("panicked"), "{log}");
}
