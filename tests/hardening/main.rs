//! Regression tests for the outsider's attack on `ocrctl serve` and the CLI (issue 10): each
//! test failed before its fix. Server tests run the tiny fixture on the CPU (fp32).

mod bombs;
#[path = "../common/mod.rs"]
mod common;
mod front;
mod images;
mod outputs;

use common::server::{chat_body, multipart, post_json_to, request, spawn_clients, Server};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn image(name: &str) -> PathBuf {
    common::fixture().join("images").join(name)
}

/// A CPU fp32 test profile with `extra` YAML lines appended.
fn profile(dir: &Path, extra: &str) -> PathBuf {
    let p = common::server::test_profile(dir, 2, 8, 8);
    let mut yaml = std::fs::read_to_string(&p).unwrap();
    yaml.push_str(extra);
    std::fs::write(&p, yaml).unwrap();
    p
}

fn start(dir: &Path, extra_yaml: &str, args: &[&str]) -> Server {
    let p = profile(dir, extra_yaml);
    let mut all = vec!["--profile", p.to_str().unwrap()];
    all.extend_from_slice(args);
    Server::start(common::exported(), &all, true)
}

fn error_of(r: &common::server::Resp) -> (Value, Value) {
    let e = r.json();
    (e["error"]["param"].clone(), e["error"]["message"].clone())
}

/// 10.1: a repetition penalty near zero with sampling on made every weight NaN and killed
/// the engine thread for good (500, then 503 for everyone). Now it answers, and so does the
/// next request; likewise through /v1/ocr's form field and the CLI.
#[test]
fn an_extreme_repetition_penalty_neither_fails_nor_kills_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), "", &[]);
    let png = std::fs::read(image("aligned.png")).unwrap();
    for penalty in [1e-38, 1e-45, 3.4e38] {
        let mut b = chat_body(&png, "image/png", 8);
        b["temperature"] = json!(0.2);
        b["repetition_penalty"] = json!(penalty);
        let r = s.post_json("/v1/chat/completions", &b);
        assert_eq!(r.status, 200, "penalty {penalty}: {}", r.text());
    }
    let (ct, mp) = multipart(
        &[
            ("repetition_penalty", "1e-38"),
            ("temperature", "0.2"),
            ("max_tokens", "8"),
        ],
        Some(("aligned.png", &png)),
    );
    let r = request(&s.addr, "POST", "/v1/ocr", &[("Content-Type", &ct)], &mp).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(s.get("/health").unwrap().status, 200);
    let r = s.post_json("/v1/chat/completions", &chat_body(&png, "image/png", 4));
    assert_eq!(r.status, 200, "{}", r.text());
    let model = common::exported();
    common::ocrctl_ok(&[
        "ocr",
        "--accept-length",
        "--model",
        model.to_str().unwrap(),
        "--precision",
        "fp32",
        "--max-tokens",
        "8",
        "--temperature",
        "0.2",
        "--repetition-penalty",
        "1e-38",
        image("aligned.png").to_str().unwrap(),
    ]);
}

/// 10.2: a huge text part was tokenised in full before the length check (48 MB: 105 s,
/// 12 GB). Now it is refused by its size first, naming `messages` (or `prompt`).
#[test]
fn oversized_prompt_text_is_refused_before_tokenising() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), "", &[]);
    let png = std::fs::read(image("aligned.png")).unwrap();
    let mut b = chat_body(&png, "image/png", 4);
    let text = "lorem ipsum ".repeat(500_000); // 6 MB
    b["messages"][0]["content"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "text", "text": text}));
    let r = s.post_json("/v1/chat/completions", &b);
    assert_eq!(r.status, 400, "{}", r.text());
    let (param, msg) = error_of(&r);
    assert_eq!(param, "messages");
    assert!(msg.as_str().unwrap().contains("bytes"), "{msg}");
    let prompt = "x".repeat(6_000_000);
    let (ct, mp) = multipart(&[("prompt", &prompt)], Some(("aligned.png", &png)));
    let r = request(&s.addr, "POST", "/v1/ocr", &[("Content-Type", &ct)], &mp).unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(error_of(&r).0, "prompt");
}

/// 10.4: sixteen 3.9 MB stop strings made everyone 300x slower. Stop strings are now bounded
/// in length, and matching costs only the new text (see the unit tests of `server::stops`).
#[test]
fn stop_strings_are_bounded_and_many_long_ones_still_work() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), "", &[]);
    let png = std::fs::read(image("aligned.png")).unwrap();
    let mut b = chat_body(&png, "image/png", 8);
    b["stop"] = json!(["y".repeat(1025)]);
    let r = s.post_json("/v1/chat/completions", &b);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(error_of(&r).0, "stop");
    let plain = s.post_json("/v1/chat/completions", &chat_body(&png, "image/png", 24));
    let want = plain.json()["choices"][0]["message"]["content"].clone();
    let stops: Vec<String> = (0..16)
        .map(|i| format!("{i}{}", "q".repeat(1000)))
        .collect();
    let mut b = chat_body(&png, "image/png", 24);
    b["stop"] = json!(stops);
    let r = s.post_json("/v1/chat/completions", &b);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], want);
}

/// 10.5: silent sockets were never closed (1100 of them blocked all service). Now a
/// connection that sends no request head within --header-timeout is closed, and at most
/// --max-connections are served at once (the rest wait in the backlog).
#[test]
fn silent_connections_are_closed_and_service_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    // Every socket here comes from 127.0.0.1: no per-host share (see the next test).
    let s = start(
        dir.path(),
        "",
        &[
            "--header-timeout",
            "1",
            "--max-connections",
            "4",
            "--max-connections-per-client",
            "0",
        ],
    );
    let mut silent: Vec<TcpStream> = (0..12)
        .map(|_| TcpStream::connect(&s.addr).unwrap())
        .collect();
    // All four slots are taken by silent sockets; they are closed after a second and
    // service resumes.
    let t = Instant::now();
    let r = s.get("/health").unwrap();
    assert_eq!(r.status, 200);
    assert!(t.elapsed() < Duration::from_secs(60));
    let first = &mut silent[0];
    first
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut buf = [0u8; 16];
    // Closed by the server (end of stream or a reset), not still open at our timeout.
    match first.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("the silent connection is still open: {other:?}"),
    }
    // A connection that goes silent half-way through its head is closed too.
    let mut half = TcpStream::connect(&s.addr).unwrap();
    half.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .unwrap();
    half.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut rest = Vec::new();
    let closed = half.read_to_end(&mut rest);
    assert!(
        closed.is_ok()
            || closed.as_ref().unwrap_err().kind() == std::io::ErrorKind::ConnectionReset,
        "the half-sent head's connection is still open: {closed:?}"
    );
    assert!(
        !String::from_utf8_lossy(&rest).contains("200 OK"),
        "an unfinished head got no answer"
    );
}

/// N7 (2026-12-05): ~700 silent, reconnecting sockets from one host made probes from others
/// wait 4–28 s. One address now holds at most --max-connections-per-client connections; its
/// next ones are closed at once, and another host is served meanwhile.
#[test]
fn one_host_cannot_hold_every_connection() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(
        dir.path(),
        "",
        &[
            "--header-timeout",
            "30",
            "--max-connections",
            "4",
            "--max-connections-per-client",
            "2",
        ],
    );
    // The "other host": 127.0.0.2, another loopback address.
    let from_other = || {
        let addr: std::net::SocketAddr = s.addr.parse().unwrap();
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        let local: std::net::SocketAddr = "127.0.0.2:0".parse().unwrap();
        sock.bind(&local.into()).unwrap();
        sock.connect(&addr.into()).unwrap();
        TcpStream::from(sock)
    };
    let _held: Vec<TcpStream> = (0..2).map(|_| from_other()).collect();
    let mut third = from_other();
    third
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 16];
    match third.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("a third connection from one host stayed open: {other:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(5), "closed at once");
    // 127.0.0.1 is served at once while the other host holds its two.
    let t = Instant::now();
    assert_eq!(s.get("/health").unwrap().status, 200);
    assert!(t.elapsed() < Duration::from_secs(5));
}

/// A copy of the shared fixture export, to damage.
fn export_copy(dir: &Path) -> PathBuf {
    let out = dir.join("copy");
    let src = common::exported();
    std::fs::create_dir_all(out.join("onnx")).unwrap();
    for sub in ["", "onnx"] {
        for e in std::fs::read_dir(src.join(sub)).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_file() {
                std::fs::copy(e.path(), out.join(sub).join(e.file_name())).unwrap();
            }
        }
    }
    out
}

/// 10.6: flipped bytes in `.onnx_data` answered garbage with HTTP 200. Every exported file's
/// sha256 is now recorded and checked at load (`--no-verify` skips), and `ocrctl verify`.
#[test]
fn a_damaged_export_is_refused_with_the_files_name() {
    let dir = tempfile::tempdir().unwrap();
    let m = export_copy(dir.path());
    let ok = common::ocrctl_ok(&["verify", m.to_str().unwrap()]);
    assert!(ok.contains("intact"), "{ok}");
    // The decoder a default load reads (the GQA one).
    let data = m.join("onnx/decoder_model_gqa.onnx_data");
    let mut b = std::fs::read(&data).unwrap();
    let i = b.len() / 2;
    b[i] ^= 0x40;
    std::fs::write(&data, &b).unwrap();
    let err = common::ocrctl_err(&["verify", m.to_str().unwrap()]);
    assert!(
        err.contains("decoder_model_gqa.onnx_data") && err.contains("sha256"),
        "{err}"
    );
    let img = image("aligned.png");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "ocr",
            "--accept-length",
            "--temperature",
            "0",
            "--model",
            m.to_str().unwrap(),
            "--precision",
            "fp32",
            "--max-tokens",
            "2",
        ];
        args.extend_from_slice(extra);
        args.push(img.to_str().unwrap());
        common::ocrctl(&args)
    };
    let out = run(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("decoder_model_gqa.onnx_data"), "{err}");
    assert!(
        run(&["--no-verify"]).status.success(),
        "--no-verify loads it"
    );
    // The fp16 graphs are intact: loading them does not read the damaged file.
    let out = common::ocrctl(&[
        "ocr",
        "--accept-length",
        "--temperature",
        "0",
        "--model",
        m.to_str().unwrap(),
        "--precision",
        "fp16",
        "--max-tokens",
        "2",
        img.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The server refuses to start on it, with the reason.
    let p = profile(dir.path(), "");
    let out = Command::new(env!("CARGO_BIN_EXE_ocrctl"))
        .args(["serve", "--model", m.to_str().unwrap(), "--port", "0"])
        .args(["--profile", p.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("onnx_data"));
}

/// 10.7: JSON was taken under any Content-Type (a cross-site form could post it) and any
/// Host (DNS rebinding). Now JSON routes want `application/json` (415), and a server
/// without an API key answers only IP addresses, localhost and --allowed-hosts (403).
#[test]
fn cross_site_requests_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), "", &["--allowed-hosts", "ocr.internal"]);
    let png = std::fs::read(image("aligned.png")).unwrap();
    let body = chat_body(&png, "image/png", 2).to_string();
    for ct in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        None,
    ] {
        let h: Vec<(&str, &str)> = ct.map(|c| ("Content-Type", c)).into_iter().collect();
        let r = request(&s.addr, "POST", "/v1/chat/completions", &h, body.as_bytes()).unwrap();
        assert_eq!(r.status, 415, "{ct:?}: {}", r.text());
        assert!(r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("application/json"));
    }
    let json_ct = ("Content-Type", "application/json; charset=utf-8");
    let r = request(
        &s.addr,
        "POST",
        "/v1/chat/completions",
        &[json_ct],
        body.as_bytes(),
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    // Raw requests with a chosen Host header.
    let with_host = |host: &str| {
        let mut c = TcpStream::connect(&s.addr).unwrap();
        write!(
            c,
            "GET /v1/models HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        out
    };
    let evil = with_host("attacker.example:8000");
    assert!(evil.starts_with("HTTP/1.1 403"), "{evil}");
    assert!(evil.contains("--allowed-hosts"), "{evil}");
    for good in ["localhost:8000", "127.0.0.1", "[::1]:8000", "ocr.internal"] {
        assert!(with_host(good).starts_with("HTTP/1.1 200"), "{good}");
    }
    drop(s);
    // With an API key the key is the guard: any Host may ask.
    let s = start(dir.path(), "", &["--api-key", "k"]);
    let mut c = TcpStream::connect(&s.addr).unwrap();
    write!(
        c,
        "GET /v1/models HTTP/1.1\r\nHost: ocr.example.com\r\nAuthorization: Bearer k\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
}

/// 10.8: `export --force` replaced any directory (the user's notes were lost); a killed
/// export left `.NAME.partial-PID` directories for ever.
#[test]
fn export_force_replaces_only_an_export_and_stale_partials_are_cleaned() {
    let dir = tempfile::tempdir().unwrap();
    let notes = dir.path().join("mine");
    std::fs::create_dir(&notes).unwrap();
    std::fs::write(notes.join("notes.txt"), "keep me").unwrap();
    let ck = common::checkpoint();
    let export = |out: &Path| {
        common::ocrctl(&[
            "export",
            "--checkpoint",
            ck.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--precision",
            "fp32",
            "--force",
        ])
    };
    let out = export(&notes);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not an ocrctl export"), "{err}");
    assert_eq!(
        std::fs::read_to_string(notes.join("notes.txt")).unwrap(),
        "keep me"
    );
    // A partial directory of a process that is gone is removed by the next export.
    let stale = dir.path().join(".model.partial-99999999");
    std::fs::create_dir_all(stale.join("onnx")).unwrap();
    std::fs::write(stale.join("onnx/x.onnx_data"), vec![0u8; 1000]).unwrap();
    let model = dir.path().join("model");
    assert!(export(&model).status.success());
    assert!(!stale.exists(), "the stale partial export was removed");
    // --force over an earlier export replaces it.
    assert!(export(&model).status.success());
    assert!(model.join("ocrctl.json").is_file());
}

/// 10.9, server side: an oversize declared body gets 413 before `100 Continue`; the Bearer
/// scheme is case-insensitive; two `file` fields are refused; 405 and 431 come in OpenAI's
/// error shape.
#[test]
fn smaller_front_door_fixes() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), "", &["--api-key", "k"]);
    let mut c = TcpStream::connect(&s.addr).unwrap();
    write!(
        c,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer k\r\n\
         Content-Type: application/json\r\nContent-Length: 1000000000\r\nExpect: 100-continue\r\n\r\n"
    )
    .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut head = [0u8; 12];
    c.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 413", "{}", String::from_utf8_lossy(&head));
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let auth = format!("{scheme} k");
        let r = request(
            &s.addr,
            "GET",
            "/v1/models",
            &[("Authorization", &auth)],
            b"",
        )
        .unwrap();
        assert_eq!(r.status, 200, "{scheme}");
    }
    let auth = ("Authorization", "Bearer k");
    let png = std::fs::read(image("aligned.png")).unwrap();
    let (ct, mut mp) = multipart(&[], Some(("a.png", &png)));
    // A second `file` part before the closing boundary.
    let boundary = ct.split("boundary=").nth(1).unwrap().to_string();
    let close = format!("--{boundary}--\r\n");
    mp.truncate(mp.len() - close.len());
    mp.extend_from_slice(
        format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"b.png\"\r\n\r\n")
            .as_bytes(),
    );
    mp.extend_from_slice(&png);
    mp.extend_from_slice(format!("\r\n{close}").as_bytes());
    let r = request(
        &s.addr,
        "POST",
        "/v1/ocr",
        &[("Content-Type", &ct), auth],
        &mp,
    )
    .unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(error_of(&r).0, "file");
    let r = request(&s.addr, "GET", "/v1/chat/completions", &[auth], b"").unwrap();
    assert_eq!(r.status, 405);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("GET"));
    let big = "v".repeat(40 * 1024);
    let r = request(&s.addr, "GET", "/v1/models", &[auth, ("X-Big", &big)], b"").unwrap();
    assert_eq!(r.status, 431);
    assert!(r.json()["error"]["message"].is_string());
}

/// 10.9: a stream still running when the shutdown grace period ends gets an error event and
/// `[DONE]` instead of being cut mid-way.
#[test]
fn streams_cut_at_the_shutdown_deadline_end_with_an_error_and_done() {
    let dir = tempfile::tempdir().unwrap();
    let p = common::server::test_profile(dir.path(), 1, 40, 2);
    let yaml = std::fs::read_to_string(&p)
        .unwrap()
        .replace("max_new_tokens_limit: 256", "max_new_tokens_limit: 3500")
        .replace("max_sequence_length: 4096", "max_sequence_length: 8192");
    std::fs::write(&p, yaml).unwrap();
    let mut s = Server::start(
        common::exported(),
        &["--profile", p.to_str().unwrap(), "--shutdown-timeout", "1"],
        true,
    );
    let png = std::fs::read(image("aligned.png")).unwrap();
    let mut body = chat_body(&png, "image/png", 3500);
    body["stream"] = json!(true);
    body["ignore_eos"] = json!(true);
    // One running stream and many queued behind it (batch 1): at least 20 × 3500 tokens left
    // at SIGTERM, more than the one-second grace period allows on any machine (the tiny model
    // decodes ~20 000 tokens/s on one core).
    let (addr, body) = (s.addr.clone(), body.to_string());
    let clients = spawn_clients(30, move |_| {
        post_json_to(&addr, "/v1/chat/completions", &body)
    });
    let t = Instant::now();
    let queued = |s: &Server| -> usize {
        let m = s.get("/metrics").unwrap().text();
        m.lines()
            .find_map(|l| l.strip_prefix("ocrctl_queue_depth "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    while queued(&s) < 20 {
        assert!(t.elapsed().as_secs() < 30, "requests never queued");
        std::thread::sleep(Duration::from_millis(2));
    }
    s.terminate();
    let mut cut = 0;
    for r in clients.join() {
        // A client whose request reached the server only after SIGTERM is refused whole.
        if r.status == 503 {
            assert!(r.text().contains("shutting down"), "{}", r.text());
            continue;
        }
        assert_eq!(r.status, 200, "{}", r.text());
        let events = r.sse_data();
        assert_eq!(events.last().unwrap(), "[DONE]", "{}", r.text());
        let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
        if let Some(m) = last["error"]["message"].as_str() {
            assert!(m.contains("shut down"), "{last}");
            cut += 1;
        }
    }
    assert!(cut >= 1, "no stream outlived the grace period");
    assert!(s.child.wait().unwrap().success());
}

/// 10.9, CLI: `--resume` trusted a 0-byte `.md` (a crash before the data reached the disk).
#[test]
fn resume_redoes_an_empty_markdown_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("aligned.md"), b"").unwrap();
    let model = common::exported();
    common::ocrctl_ok(&[
        "ocr",
        "--accept-length",
        "--temperature",
        "0",
        "--model",
        model.to_str().unwrap(),
        "--precision",
        "fp32",
        "--max-tokens",
        "4",
        "--out",
        out.to_str().unwrap(),
        "--resume",
        image("aligned.png").to_str().unwrap(),
    ]);
    let md = std::fs::read_to_string(out.join("aligned.md")).unwrap();
    assert!(!md.is_empty(), "the document was read again");
}
