//! Shared helpers for the integration tests: fixture paths, running the `ocrctl` binary,
//! and one fp32/fp16 export of the tiny fixture per test binary.
#![allow(dead_code)]

pub mod golden;
pub mod pdfgen;
pub mod server;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// `tests/fixtures/tiny-lightonocr`.
pub fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-lightonocr")
}

/// The fixture's checkpoint directory (hub layout).
pub fn checkpoint() -> PathBuf {
    fixture().join("checkpoint")
}

/// Runs `ocrctl` with `args`.
pub fn ocrctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ocrctl"))
        .args(args)
        .output()
        .expect("ocrctl runs")
}

/// Runs `ocrctl`, requiring success; returns stdout.
pub fn ocrctl_ok(args: &[&str]) -> String {
    let out = ocrctl(args);
    assert!(
        out.status.success(),
        "ocrctl {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs `ocrctl`, requiring failure; returns stderr.
pub fn ocrctl_err(args: &[&str]) -> String {
    let out = ocrctl(args);
    assert!(!out.status.success(), "ocrctl {args:?} should have failed");
    String::from_utf8(out.stderr).unwrap()
}

/// Exports the fixture checkpoint to `out` with extra `ocrctl export` flags; returns what
/// the export said on stderr.
pub fn export_fixture(out: &Path, extra: &[&str]) -> String {
    with_export_args(out, extra, |args| {
        let o = ocrctl(args);
        let log = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "ocrctl {args:?} failed:\n{log}");
        log
    })
}

/// Exports the fixture checkpoint to `out` with extra flags, requiring failure; returns stderr.
pub fn export_fixture_err(out: &Path, extra: &[&str]) -> String {
    with_export_args(out, extra, ocrctl_err)
}

fn with_export_args<R>(out: &Path, extra: &[&str], f: impl FnOnce(&[&str]) -> R) -> R {
    let ck = checkpoint();
    let mut args = vec![
        "export",
        "--checkpoint",
        ck.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    f(&args)
}

/// Whether a test that needs an optional tool (one `scripts/setup.sh --test` installs) should
/// run. When the tool is `present`, yes. When it is absent, the test is skipped: one line
/// `skipped: <test>: <tool> not found (<install>)` goes to stderr (written directly, so it
/// shows through the test harness's output capture) and this returns `false` — unless
/// `OCRCTL_REQUIRE_TEST_TOOLS=1` (CI sets it), in which case the absence fails the test.
pub fn require_tool(test: &str, tool: &str, present: bool, install: &str) -> bool {
    if present {
        return true;
    }
    let msg = format!("{test}: {tool} not found ({install})");
    if std::env::var("OCRCTL_REQUIRE_TEST_TOOLS").as_deref() == Ok("1") {
        panic!("{msg}; OCRCTL_REQUIRE_TEST_TOOLS=1 makes a missing test tool a failure");
    }
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "skipped: {msg}");
    false
}

/// `name` found as an executable file on `PATH`.
pub fn on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Whether `program args…` starts and exits successfully (its output is discarded).
pub fn runs(program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The repository's `.venv/bin/python` (made by `scripts/setup.sh`).
pub fn venv_python() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python")
}

/// Largest absolute difference of two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

static EXPORT: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();

/// The fixture exported once (fp32 + fp16, ORT target, both decoders) for this test binary.
pub fn exported() -> &'static Path {
    &EXPORT
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let out = dir.path().join("tiny");
            export_fixture(&out, &["--precision", "fp32,fp16"]);
            (dir, out)
        })
        .1
}

/// Copies the fixture checkpoint into a fresh temporary directory for mutation.
pub fn checkpoint_copy() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    std::fs::create_dir(&ck).unwrap();
    for e in std::fs::read_dir(checkpoint()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), ck.join(e.file_name())).unwrap();
    }
    (dir, ck)
}

/// Replaces the first occurrence of `from` by `to` (same length) in a file's bytes.
pub fn patch_bytes(path: &Path, from: &[u8], to: &[u8]) {
    assert_eq!(from.len(), to.len(), "patches keep the length");
    let mut b = std::fs::read(path).unwrap();
    let i = b
        .windows(from.len())
        .position(|w| w == from)
        .expect("pattern present");
    b[i..i + from.len()].copy_from_slice(to);
    std::fs::write(path, b).unwrap();
}

/// Greedy generation of one page through the engine the product runs (`Engine::run`, a
/// batch of one): `steps` new tokens, past any stop id, with the top-5 log-probabilities of
/// every step. The parity tests compare this with the transformers goldens.
pub fn engine_greedy<B: ocrctl::runtime::backend::Backend>(
    engine: &mut ocrctl::generation::engine::Engine<B>,
    prompt_ids: Vec<u32>,
    pixel_values: ocrctl::model::preprocess::Pixels,
    steps: usize,
) -> ocrctl::generation::generate::Generation {
    let mut req = ocrctl::generation::engine::GenRequest::text(prompt_ids, steps);
    req.images = vec![pixel_values];
    req.ignore_eos = true;
    req.top_logprobs = 5;
    engine
        .run([req], &mut |_| {})
        .pop()
        .expect("one result")
        .expect("generation succeeds")
}

/// The ONNX `metadata_props` value of `key` in the graph file `onnx`, as ONNX Runtime reads it.
pub fn graph_hint(onnx: &Path, key: &str) -> Option<String> {
    let (_, env) = ocrctl::runtime::ortlib::environment(None).expect("ONNX Runtime");
    let s = ort::session::Session::builder(&env)
        .and_then(|mut b| b.commit_from_file(onnx))
        .unwrap_or_else(|e| panic!("{}: {e}", onnx.display()));
    let value = s.metadata().expect("metadata").custom(key);
    value
}
