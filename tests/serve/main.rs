//! `ocrctl serve` end to end on the tiny fixture (CPU, fp32): answers equal `ocrctl ocr`,
//! streaming, logprobs, concurrency against batching, queue overflow, bad input, API key,
//! shutdown, and the upload page in headless Chromium. The Chromium and `openai`-client tests
//! need what `scripts/setup.sh --test` installs; without it they print a `skipped:` line and
//! pass, unless `OCRCTL_REQUIRE_TEST_TOOLS=1` (as in CI) makes that a failure.
//!
//! One test binary (one link), its tests in modules: `answers` (what a request gets back),
//! `input` (what a request may send), `lifecycle` (start, health, shutdown), `clients`
//! (the browser page, the `openai` client, PDF uploads). This file holds the shared helpers.

mod answers;
mod bench;
mod clients;
#[path = "../common/mod.rs"]
mod common;
mod input;
mod jobs;
mod lifecycle;
mod outcomes;

use common::server::{
    chat_body, chat_text, concurrent_chats, fixture_images, gauge, multipart, post_json_to,
    request, test_profile, Server,
};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

const MAX_TOKENS: usize = 24;

fn image(name: &str) -> PathBuf {
    common::fixture().join("images").join(name)
}

const IMAGES: [(&str, &str); 5] = [
    ("aligned.png", "image/png"),
    ("photo.jpg", "image/jpeg"),
    ("portrait.png", "image/png"),
    ("unaligned.png", "image/png"),
    ("wide_downscale.png", "image/png"),
];

/// `ocrctl ocr --json` (fp32, one thread) on the fixture image with `extra` flags: its JSON line.
fn cli_json(name: &str, max_tokens: usize, extra: &[&str]) -> Value {
    let model = common::exported();
    let max = max_tokens.to_string();
    let img = image(name);
    let mut args = vec![
        "ocr",
        "--accept-length",
        "--model",
        model.to_str().unwrap(),
        "--precision",
        "fp32",
        "--threads",
        "1",
        "--max-tokens",
        &max,
        "--json",
    ];
    args.extend_from_slice(extra);
    args.push(img.to_str().unwrap());
    let out = common::ocrctl_ok(&args);
    serde_json::from_str(out.lines().next().unwrap()).unwrap()
}

/// [`cli_json`] greedy, with each step's top-2.
fn cli(name: &str, max_tokens: usize) -> Value {
    cli_json(
        name,
        max_tokens,
        &["--temperature", "0", "--top-logprobs", "2"],
    )
}

fn server(dir: &Path, batch: usize, queue: usize, extra: &[&str]) -> Server {
    let profile = test_profile(dir, batch, queue, 2);
    let mut args = vec!["--profile", profile.to_str().unwrap()];
    args.extend_from_slice(extra);
    Server::start(common::exported(), &args, true)
}

/// [`cli_json`]'s text.
fn cli_text(name: &str, max_tokens: usize, extra: &[&str]) -> String {
    cli_json(name, max_tokens, extra)["text"]
        .as_str()
        .unwrap()
        .to_string()
}
