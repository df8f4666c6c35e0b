//! A server's life: `--warm-up` before ready, `/v1/models` and `/health` (a model that fails to
//! load too), SIGTERM during a stream.

use super::*;

/// `--warm-up` runs a page of each size through the model before /health reports ready,
/// and the server then answers as the CLI does; a size that is none, or past --max-pixels,
/// stops the start with the flag named.
#[test]
fn warm_up_sizes_run_before_ready_and_bad_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    // A trailing comma (an empty entry) lists nothing more.
    let s = server(dir.path(), 1, 4, &["--warm-up", "300x200, 200x300,"]);
    // The line comes before ready; stderr is read on a thread of its own, so allow it a moment.
    let warmed = (0..50).any(|_| {
        let seen = s.log.lock().unwrap().contains("warmed up 2 page size(s)");
        if !seen {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        seen
    });
    assert!(warmed, "{}", s.log.lock().unwrap());
    let (name, mime) = IMAGES[0];
    let bytes = std::fs::read(image(name)).unwrap();
    assert_eq!(
        chat_text(&s.post_json("/v1/chat/completions", &chat_body(&bytes, mime, MAX_TOKENS))),
        cli_text(name, MAX_TOKENS, &[])
    );
    drop(s);
    let profile = test_profile(dir.path(), 1, 4, 2);
    for (bad, says) in [
        ("300", "`300` is not WIDTHxHEIGHT"),
        ("0x300", "width in `0x300`"),
        ("30000x30000", "more pixels than --max-pixels"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ocrctl"))
            .args(["serve", "--model", common::exported().to_str().unwrap()])
            .args(["--port", "0", "--profile", profile.to_str().unwrap()])
            .args(["--warm-up", bad])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad}: {err}");
        assert!(
            err.contains("--warm-up") && err.contains(says),
            "{bad}: {err}"
        );
    }
}

#[test]
fn models_health_and_a_model_that_fails_to_load() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(
        dir.path(),
        1,
        4,
        &["--served-model-name", "lightonocr-tiny"],
    );
    let v = s.get("/v1/models").unwrap().json();
    assert_eq!(v["data"][0]["id"], "lightonocr-tiny");
    assert_eq!(v["data"][0]["max_model_len"], 4096);
    drop(s);
    // fp16 graphs exist but int4 do not: a server that can never answer exits non-zero
    // with the reason (issue 12.2), so that a supervisor sees it instead of a 503 for ever.
    let profile = test_profile(dir.path(), 1, 4, 2);
    let out = Command::new(env!("CARGO_BIN_EXE_ocrctl"))
        .args([
            "serve",
            "--model",
            common::exported().to_str().unwrap(),
            "--port",
            "0",
        ])
        .args([
            "--profile",
            profile.to_str().unwrap(),
            "--precision",
            "int4",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("int4") && err.contains("was not exported"),
        "{err}"
    );
}

#[test]
fn sigterm_lets_a_running_stream_finish_then_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = server(dir.path(), 1, 4, &[]);
    let png = std::fs::read(image("photo.jpg")).unwrap();
    let mut body = chat_body(&png, "image/jpeg", 256);
    body["stream"] = json!(true);
    body["ignore_eos"] = json!(true);
    let addr = s.addr.clone();
    let running =
        std::thread::spawn(move || post_json_to(&addr, "/v1/chat/completions", &body.to_string()));
    // Wait until it is generating, then ask the server to stop.
    let t = std::time::Instant::now();
    while !s
        .get("/metrics")
        .unwrap()
        .text()
        .contains("ocrctl_batch_size 1")
    {
        assert!(t.elapsed().as_secs() < 30, "request never started");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    s.terminate();
    let r = running.join().unwrap();
    assert_eq!(r.status, 200);
    let events = r.sse_data();
    assert_eq!(events.last().unwrap(), "[DONE]");
    // The running request was not cut short: all 256 tokens (EOS ignored), finish "length".
    let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(last["usage"]["completion_tokens"], 256, "{last}");
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    let status = s.child.wait().unwrap();
    assert!(
        status.success(),
        "exit status {status:?}\n{}",
        s.log.lock().unwrap()
    );
    assert!(s.get("/health").is_err(), "no longer listening");
}

/// An idle server holds the memory its pages use, not its whole KV cache (issue 41 item 2):
/// ort zero-filled the host tensors it allocated, so the cpu profile's 5.6 GB cache (4
/// sequences × 6 144 positions of the full-size model) was all resident at load. Here 256
/// sequences × 4 096 positions of the fixture, 1 GiB, and a server that stays far below it
/// before and after a page.
#[test]
fn an_idle_server_holds_what_its_pages_use_not_its_whole_kv_cache() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), 256, 4, &[]);
    let log = s.log.lock().unwrap().clone();
    assert!(
        log.contains("KV cache of 256 sequences x 4096 positions (1.00 GiB"),
        "{log}"
    );
    let idle = gauge(&s, "ocrctl_resident_memory_bytes") >> 20;
    assert!(idle < 400, "idle RSS {idle} MiB with a 1 GiB KV cache");
    let (name, mime) = IMAGES[0];
    let bytes = std::fs::read(image(name)).unwrap();
    let r = s.post_json("/v1/chat/completions", &chat_body(&bytes, mime, MAX_TOKENS));
    assert_eq!(r.status, 200, "{}", r.text());
    let after = gauge(&s, "ocrctl_resident_memory_bytes") >> 20;
    assert!(
        after < 400,
        "RSS {after} MiB after a page with a 1 GiB KV cache"
    );
}
