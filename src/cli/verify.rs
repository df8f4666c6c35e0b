//! `ocrctl verify`: checks every file of an export against the sha256 digests its
//! `ocrctl.json` recorded (what `ocr`, `serve`, `bench` and `eval` also do, for the files
//! they load, unless `--no-verify`).
//!
//! ```text
//! ocrctl verify out/model
//! ```

use anyhow::Context;
use clap::Args;
use ocrctl_exporters::export::Manifest;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `ocrctl verify`.
#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// Exported model directory (from `ocrctl export`).
    dir: PathBuf,
}

/// Verifies every recorded file; exits non-zero naming the first damaged one.
pub fn run(a: VerifyArgs) -> anyhow::Result<ExitCode> {
    let m = Manifest::load(&a.dir).with_context(|| format!("{}", a.dir.display()))?;
    if m.files.is_empty() {
        anyhow::bail!(
            "{}: this export records no file digests (made by an older ocrctl); export it again to verify it",
            a.dir.display()
        );
    }
    let r = ocrctl_exporters::verify::verify(&a.dir, &m.files, |_| true)?;
    println!(
        "{}: all {} files intact ({:.1} MiB in {:.2} s)",
        a.dir.display(),
        r.files,
        r.bytes as f64 / (1024.0 * 1024.0),
        r.elapsed.as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}
