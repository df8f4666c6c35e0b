//! `ocrctl ocr`'s page-outcome flags and failure records (issues 38 and 41): `--retries`,
//! `--accept-length`, `--keep-partial`, `--max-failed-pages`, the exit codes, and
//! `failures.jsonl` in `--out`.
//!
//! Exit codes: [`EXIT_OK`] when every input was read, [`EXIT_SOME_FAILED`] when some failed
//! (each named on stderr, in `--json` and in `failures.jsonl`), 1 when nothing could run (no
//! model, bad flags). A batch job can tell "rerun me" (1) from "done, with casualties" (2).

use clap::Args;
use ocrctl::documents::inputs::{InputError, Shard};
use ocrctl::generation::outcome::{FailReason, PageOutcome, RetryPolicy};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Every input was read and every page finished.
pub const EXIT_OK: u8 = 0;
/// Some inputs failed (a file that could not be read, a page that did not finish); the
/// others were written.
pub const EXIT_SOME_FAILED: u8 = 2;

/// The page-outcome flags of `ocrctl ocr`.
#[derive(Args, Debug, Clone)]
pub struct OutcomeArgs {
    /// Try a page that ends at --max-tokens or in a loop this many more times (temperature
    /// rising to at least 0.5, 0.8, 1.0; a new seed each) before it fails.
    #[arg(long, default_value_t = RetryPolicy::DEFAULT_RETRIES)]
    pub retries: usize,
    /// A page that ends at --max-tokens is ok, not retried (previews with a small budget;
    /// implied by --ignore-eos, which asks for the whole budget).
    #[arg(long)]
    pub accept_length: bool,
    /// With --out: write a document whose pages failed anyway, with `<!-- page N failed:
    /// REASON -->` in each one's place (--resume redoes it); the exit code stays 2.
    #[arg(long, requires = "out")]
    pub keep_partial: bool,
    /// With --out: a document with more than this fraction (0 to 1) of its pages failed is
    /// not written; at or under it, it is written as with --keep-partial. Default: 0, or 1
    /// with --keep-partial.
    #[arg(long, value_name = "FRACTION", value_parser = parse_fraction, requires = "out")]
    pub max_failed_pages: Option<f64>,
    /// What stands in a failed PDF page's place: `none` (the failure marker alone) or `text`
    /// (the PDF's own text layer, below `<!-- page N: text layer -->`; a document whose failed
    /// pages all have one is written, the exit code stays 2).
    #[arg(long, value_enum, default_value = "none")]
    pub fallback: Fallback,
}

/// `--fallback`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    None,
    Text,
}

/// What stands in a failed page's place when its PDF's text layer `text` fills in for it:
/// the failure marker (so `--resume` redoes the document) and the text below a second one.
pub fn text_layer_block(marker: &str, page: usize, text: &str) -> String {
    format!(
        "{marker}\n<!-- page {page}: text layer -->\n{}",
        text.trim_end()
    )
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        _ => Err(format!("expected a fraction from 0 to 1, got {s:?}")),
    }
}

impl OutcomeArgs {
    /// The retry policy of the run.
    pub fn policy(&self) -> RetryPolicy {
        RetryPolicy {
            retries: self.retries,
            accept_length: self.accept_length,
        }
    }

    /// The largest fraction of failed pages a written document may have.
    pub fn max_failed(&self) -> f64 {
        self.max_failed_pages
            .unwrap_or(if self.keep_partial { 1.0 } else { 0.0 })
    }
}

/// What stderr says of a page that did not finish: the reason, the attempts and the way out.
pub fn not_finished(name: &str, outcome: &PageOutcome, max_tokens: usize) -> String {
    let what = match outcome.reason {
        Some(FailReason::Loop) => "kept repeating itself (the loop guard stopped it)".to_string(),
        _ => format!("reached --max-tokens {max_tokens} before the end of the page"),
    };
    format!(
        "{name}: did not finish: {what}, {} attempt(s) (--retries; --accept-length keeps a \
         cut page)",
        outcome.attempts
    )
}

/// The `--json` row of a page that failed with an error (nothing was generated).
pub fn error_row(file: &Path, page: Option<usize>, error: &str, attempts: usize) -> Value {
    let mut v = json!({
        "file": file.display().to_string(),
        "status": "failed",
        "reason": FailReason::Error,
        "error": error,
    });
    if let Some(p) = page {
        v["page"] = json!(p);
        v["attempts"] = json!(attempts);
    }
    v
}

/// The input as given that `e` is about (a folder, a pattern, a file).
pub fn input_name(e: &InputError) -> String {
    match e {
        InputError::Folder { path, .. }
        | InputError::EmptyFolder { path }
        | InputError::Read { path, .. } => path.display().to_string(),
        InputError::Pattern { pattern, .. } | InputError::NoMatch { pattern } => pattern.clone(),
        other => other.to_string(),
    }
}

/// The failed inputs of a run, for `failures.jsonl` and the exit code.
#[derive(Default)]
pub struct Failures {
    /// One JSON object per failed input: `file`, `error`, and for a document whose pages
    /// failed `pages` (`page`, `reason`, `attempts`) and `written` (`false` or `"partial"`).
    pub rows: Vec<Value>,
}

impl Failures {
    /// An input that could not be opened (or named no file: an empty folder, a pattern
    /// that matches nothing).
    pub fn input(&mut self, input: &str, error: &str) {
        self.rows.push(json!({"file": input, "error": error}));
    }

    /// The exit code of a run with these failures.
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(if self.rows.is_empty() {
            EXIT_OK
        } else {
            EXIT_SOME_FAILED
        })
    }

    /// Writes `failures.jsonl` (`failures.K-of-N.jsonl` with `--shard`, so the pods of one
    /// job sharing `dir` do not overwrite each other's) when anything failed, and removes a
    /// stale one when nothing did; returns the file when written.
    pub fn write(&self, dir: &Path, shard: Option<Shard>) -> std::io::Result<Option<PathBuf>> {
        let name = match shard {
            Some(s) => format!("failures.{}-of-{}.jsonl", s.index, s.count),
            None => "failures.jsonl".into(),
        };
        let path = dir.join(name);
        if self.rows.is_empty() {
            return match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(None),
            };
        }
        let mut text = String::new();
        for r in &self.rows {
            text.push_str(&r.to_string());
            text.push('\n');
        }
        std::fs::write(&path, text)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        Ok(Some(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_are_checked_and_keep_partial_allows_every_page() {
        assert_eq!(parse_fraction("0.25"), Ok(0.25));
        assert!(parse_fraction("1.5").unwrap_err().contains("0 to 1"));
        assert!(parse_fraction("x").is_err());
        let mut a = OutcomeArgs {
            retries: 2,
            accept_length: false,
            keep_partial: false,
            max_failed_pages: None,
            fallback: Fallback::None,
        };
        assert_eq!(a.max_failed(), 0.0);
        a.keep_partial = true;
        assert_eq!(a.max_failed(), 1.0);
        a.max_failed_pages = Some(0.1);
        assert_eq!(a.max_failed(), 0.1);
    }

    #[test]
    fn failures_write_one_row_per_input_and_clear_a_stale_file() {
        let d = tempfile::tempdir().unwrap();
        let mut f = Failures::default();
        assert_eq!(f.exit_code(), ExitCode::from(EXIT_OK));
        std::fs::write(d.path().join("failures.jsonl"), "old\n").unwrap();
        assert_eq!(f.write(d.path(), None).unwrap(), None);
        assert!(
            !d.path().join("failures.jsonl").exists(),
            "stale file removed"
        );
        f.input("a.pdf", "a.pdf: encrypted");
        f.input("b.png", "b.png: cannot decode");
        let shard = "1/4".parse().ok();
        let p = f.write(d.path(), shard).unwrap().unwrap();
        assert_eq!(p, d.path().join("failures.1-of-4.jsonl"));
        let rows: Vec<Value> = std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            rows[1],
            json!({"file": "b.png", "error": "b.png: cannot decode"})
        );
        assert_eq!(f.exit_code(), ExitCode::from(EXIT_SOME_FAILED));
    }
}
