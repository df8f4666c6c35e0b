//! `ocrctl serve --devices`: several engines behind one front and one queue, on the tiny
//! fixture with CPU engines (`--devices cpu,cpu`): answers equal one engine's, the work is
//! spread across both (per-device counters in `/metrics`), and an engine that cannot load
//! leaves the others serving while `/health` names it.

mod common;

use common::server::{
    chat_body, chat_text, concurrent_chats, fixture_images, test_profile, Server,
};
use serde_json::Value;
use std::time::{Duration, Instant};

const IMAGES: [(&str, &str); 3] = [
    ("aligned.png", "image/png"),
    ("photo.jpg", "image/jpeg"),
    ("portrait.png", "image/png"),
];

/// The value of the metric line that starts with `series ` (e.g. `name{device="cpu:0"}`).
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
        .parse()
        .unwrap()
}

/// Waits until every engine `/health` lists is in `want` (bounded).
fn wait_engines(s: &Server, want: &[&str]) -> Value {
    let t = Instant::now();
    loop {
        let h = s.get("/health").unwrap().json();
        let states: Vec<String> = h["engines"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["status"].as_str().unwrap().to_string())
            .collect();
        if states == want {
            return h;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "engines: {h}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn two_cpu_engines_answer_like_one_and_share_the_work() {
    let dir = tempfile::tempdir().unwrap();
    let profile = test_profile(dir.path(), 2, 64, 2);
    let imgs = fixture_images(&IMAGES);
    let max_tokens = |i: usize| 6 + (i * 5) % 17;
    let n = 12;
    let one = Server::start(
        common::exported(),
        &["--profile", profile.to_str().unwrap()],
        true,
    );
    let expected: Vec<String> = (0..n)
        .map(|i| {
            let (b, m) = &imgs[i % imgs.len()];
            chat_text(&one.post_json("/v1/chat/completions", &chat_body(b, m, max_tokens(i))))
        })
        .collect();
    drop(one);

    let s = Server::start(
        common::exported(),
        &[
            "--profile",
            profile.to_str().unwrap(),
            "--devices",
            "cpu,cpu",
        ],
        true,
    );
    let h = wait_engines(&s, &["ok", "ok"]);
    assert_eq!(h["status"], "ok");
    assert_eq!(h["engines"][0]["device"], "cpu:0");
    assert_eq!(h["engines"][1]["device"], "cpu:1");
    let got = concurrent_chats(&s.addr, &imgs, n, max_tokens);
    for (i, r) in got.iter().enumerate() {
        assert_eq!(chat_text(r), expected[i], "client {i}");
    }
    let m = s.get("/metrics").unwrap().text();
    let per: Vec<f64> = ["cpu:0", "cpu:1"]
        .iter()
        .map(|d| {
            metric(
                &m,
                &format!("ocrctl_engine_requests_total{{device=\"{d}\"}}"),
            )
        })
        .collect();
    assert_eq!(per[0] + per[1], n as f64, "{m}");
    assert!(per[0] >= 1.0 && per[1] >= 1.0, "work not spread: {per:?}");
    let generated: f64 = ["cpu:0", "cpu:1"]
        .iter()
        .map(|d| {
            metric(
                &m,
                &format!("ocrctl_engine_generated_tokens_total{{device=\"{d}\"}}"),
            )
        })
        .sum();
    assert_eq!(generated, metric(&m, "ocrctl_generated_tokens_total"));
    for d in ["cpu:0", "cpu:1"] {
        assert_eq!(
            metric(&m, &format!("ocrctl_engine_load_tokens{{device=\"{d}\"}}")),
            0.0
        );
        assert_eq!(
            metric(&m, &format!("ocrctl_engine_ready{{device=\"{d}\"}}")),
            1.0
        );
    }
}

#[test]
fn an_engine_that_cannot_load_leaves_the_others_serving() {
    let dir = tempfile::tempdir().unwrap();
    let profile = test_profile(dir.path(), 2, 8, 2);
    // GPU 99 with strict CUDA: fails to load on any machine (no CUDA in the CPU wheel, no
    // device 99 elsewhere); the CPU engine serves.
    let s = Server::start(
        common::exported(),
        &[
            "--profile",
            profile.to_str().unwrap(),
            "--providers",
            "cuda",
            "--strict-providers",
            "--devices",
            "99,cpu",
        ],
        true,
    );
    let h = wait_engines(&s, &["failed", "ok"]);
    assert_eq!(h["status"], "ok");
    assert_eq!(h["engines"][0]["device"], "gpu:99");
    let why = h["engines"][0]["error"].as_str().unwrap();
    assert!(why.contains("cuda"), "{why}");
    let (b, m) = &fixture_images(&IMAGES)[0];
    assert!(!chat_text(&s.post_json("/v1/chat/completions", &chat_body(b, m, 8))).is_empty());
    let metrics = s.get("/metrics").unwrap().text();
    assert_eq!(
        metric(&metrics, "ocrctl_engine_ready{device=\"gpu:99\"}"),
        0.0
    );
    assert_eq!(
        metric(&metrics, "ocrctl_engine_requests_total{device=\"cpu:0\"}"),
        1.0
    );
    assert!(
        s.log.lock().unwrap().contains("loading"),
        "the failure is logged"
    );
}

#[test]
fn a_server_whose_every_engine_fails_exits_non_zero_and_bad_lists_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let profile = test_profile(dir.path(), 1, 4, 2);
    let model = common::exported().to_str().unwrap().to_string();
    let serve = |extra: &[&str]| {
        let mut args = vec!["serve", "--model", &model, "--port", "0", "--profile"];
        args.push(profile.to_str().unwrap());
        args.extend_from_slice(extra);
        common::ocrctl(&args)
    };
    let out = serve(&[
        "--providers",
        "cuda",
        "--strict-providers",
        "--devices",
        "98,99",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("on gpu:98") && err.contains("on gpu:99"),
        "{err}"
    );
    for (devices, msg) in [
        ("0,0", "gpu:0 is listed twice"),
        ("x", "`x` is not a device"),
        ("0", "needs a GPU provider"),
    ] {
        let out = serve(&["--devices", devices]);
        let err = String::from_utf8_lossy(&out.stderr);
        // (clap's own parse error exits with 2, ocrctl's checks with 1)
        assert!(!out.status.success(), "--devices {devices}: {err}");
        assert!(err.contains(msg), "--devices {devices}: {err}");
    }
}

#[test]
fn ocr_reads_with_several_engines_what_one_engine_reads() {
    let model = common::exported().to_str().unwrap().to_string();
    let images = common::fixture().join("images");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "ocr",
            "--accept-length",
            "--temperature",
            "0",
            "--model",
            &model,
            "--precision",
            "fp32",
            "--max-tokens",
            "12",
            "--json",
            "--batch-size",
            "2",
        ];
        args.extend_from_slice(extra);
        args.push(images.to_str().unwrap());
        common::ocrctl(&args)
    };
    let one = run(&[]);
    assert!(
        one.status.success(),
        "{}",
        String::from_utf8_lossy(&one.stderr)
    );
    let two = run(&["--devices", "cpu,cpu"]);
    assert!(
        two.status.success(),
        "{}",
        String::from_utf8_lossy(&two.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&two.stdout),
        String::from_utf8_lossy(&one.stdout)
    );
    assert_eq!(String::from_utf8_lossy(&one.stdout).lines().count(), 5);
    // A device that cannot load is named; the other reads every page.
    let degraded = run(&[
        "--devices",
        "97,cpu",
        "--providers",
        "cuda",
        "--strict-providers",
    ]);
    let err = String::from_utf8_lossy(&degraded.stderr);
    assert!(degraded.status.success(), "{err}");
    assert!(err.contains("loading the model on gpu:97"), "{err}");
    assert_eq!(degraded.stdout, one.stdout);
    let none = run(&[
        "--devices",
        "97,98",
        "--providers",
        "cuda",
        "--strict-providers",
    ]);
    assert!(!none.status.success());
}
