//! Results of `ocrctl ocr`, written as pages finish: in input order, one document at a time.
//!
//! Pages finish out of order (continuous batching); [`Output`] holds finished pages until
//! every earlier page is done, then emits them: plain text on stdout, one JSON object per
//! page, or one markdown file per document (`--out`), written when its last page is done and
//! only if every page finished (so `--resume` retries it), or with failed pages marked when
//! the document's [`verdict`] allows it (`--keep-partial`, `--max-failed-pages`). Pages of a
//! PDF are separated by [`page_separator`]. Each page's outcome is counted, and each input
//! that failed recorded ([`Failures`]). Only the document being emitted and pages that
//! finished early are held. A progress bar on stderr counts pages as they finish.

use crate::cli::ocr_outcome::{error_row, not_finished, text_layer_block, Failures};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use ocrctl::documents::inputs::{DocKind, Document};
use ocrctl::documents::pdf::sandbox::{OpenPdf, PdfReader};
use ocrctl::generation::outcome::{
    failed_marker, verdict, DocVerdict, FailReason, PageOutcome, PageStatus,
};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use ocrctl::documents::inputs::page_separator;

/// `<dir>/<file stem>.md`, the markdown file of a document.
pub fn md_path(dir: &Path, file: &Path) -> PathBuf {
    dir.join(format!("{}.md", stem(file)))
}

/// The name a document's outputs take: its file name without the extension.
pub fn stem(file: &Path) -> String {
    file.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "page".into())
}

/// How results are written.
pub enum Mode {
    /// Text on stdout.
    Text,
    /// One JSON object per page on stdout.
    Json,
    /// One markdown file per document in this folder.
    Markdown(PathBuf),
}

/// A finished page: its text (of the last attempt) and, for `--json`, the object to print;
/// or an error message that names the file (and page). And how it ended.
pub struct PageResult {
    pub text: Result<(String, Option<Value>), String>,
    pub outcome: PageOutcome,
}

impl PageResult {
    /// A page that failed with `msg` (naming the file and page) on attempt `attempts`.
    pub fn error(msg: String, attempts: usize) -> PageResult {
        PageResult {
            text: Err(msg),
            outcome: PageOutcome::failed(FailReason::Error, attempts),
        }
    }
}

/// What is done with documents whose pages failed, and what messages say of them.
pub struct FailurePolicy {
    /// The largest fraction of failed pages a written document may have.
    pub max_failed: f64,
    /// `--max-tokens` (named when a page reaches it).
    pub max_tokens: usize,
}

/// The text layers of failed PDF pages (`--fallback text`), read through the run's PDF
/// reader (the worker process, with its limits); the last document read stays open.
pub struct TextLayer {
    reader: PdfReader,
    open: Option<(usize, OpenPdf)>,
}

impl TextLayer {
    pub fn new(reader: PdfReader) -> TextLayer {
        TextLayer { reader, open: None }
    }

    /// Page `page` (of the run's selection) of document `d`, `doc`: its text layer, or why
    /// there is none.
    fn text(&mut self, d: usize, doc: &Document, page: usize) -> Result<String, String> {
        if self.open.as_ref().map(|(i, _)| *i) != Some(d) {
            self.open = None;
            let bytes = std::fs::read(&doc.path).map_err(|e| e.to_string())?;
            let name = doc.path.display().to_string();
            let pdf = self.reader.open(bytes, &name).map_err(|e| e.to_string())?;
            self.open = Some((d, pdf));
        }
        let (_, pdf) = self.open.as_mut().expect("opened above");
        pdf.page_text(doc.page_index(page))
            .map_err(|e| e.to_string())
    }
}

/// The in-order writer. `docs` are all documents of the run, pages numbered through them
/// ("units": document 0's pages, then document 1's, …).
pub struct Output<'a> {
    docs: &'a [Document],
    /// First unit of each document.
    starts: Vec<usize>,
    mode: Mode,
    finished: BTreeMap<usize, PageResult>,
    next: usize,
    /// Texts of the current document's pages (markdown mode).
    doc_texts: Vec<String>,
    /// The current document's failed pages (`page`, `reason`, `attempts`).
    doc_failed: Vec<Value>,
    policy: FailurePolicy,
    /// `--fallback text`: where failed PDF pages' text layers come from.
    text_layer: Option<TextLayer>,
    /// Documents with at least one failed page.
    pub failed_docs: usize,
    /// Documents (and other inputs) that failed, for `failures.jsonl`.
    pub failures: Failures,
    /// Pages that finished (first time or retried).
    pub pages_ok: usize,
    /// Pages that finished after a retry.
    pub pages_retried: usize,
    /// Pages that failed, by reason (`length`, `loop`, `error`).
    pub pages_failed: [usize; 3],
    /// Tokens generated.
    pub tokens: usize,
    done: u64,
    start: Instant,
    bar: ProgressBar,
}

impl<'a> Output<'a> {
    /// A writer for `docs`; the progress bar shows when there is more than one page, stderr is
    /// a terminal and not `quiet`.
    pub fn new(
        docs: &'a [Document],
        mode: Mode,
        quiet: bool,
        policy: FailurePolicy,
        text_layer: Option<TextLayer>,
    ) -> Self {
        let mut starts = Vec::with_capacity(docs.len());
        let mut total = 0;
        for d in docs {
            starts.push(total);
            total += d.pages();
        }
        let bar = if !quiet && total > 1 && std::io::stderr().is_terminal() {
            let bar =
                ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("{bar:30} {pos}/{len} pages  {elapsed}  {msg}")
                    .expect("valid template"),
            );
            bar.enable_steady_tick(Duration::from_millis(500));
            bar
        } else {
            ProgressBar::hidden()
        };
        Self {
            docs,
            starts,
            mode,
            finished: BTreeMap::new(),
            next: 0,
            doc_texts: Vec::new(),
            doc_failed: Vec::new(),
            policy,
            text_layer,
            failed_docs: 0,
            failures: Failures::default(),
            pages_ok: 0,
            pages_retried: 0,
            pages_failed: [0; 3],
            tokens: 0,
            done: 0,
            start: Instant::now(),
            bar,
        }
    }

    /// Document index and 0-based page of `unit`.
    pub fn locate(&self, unit: usize) -> (usize, usize) {
        let d = self.starts.partition_point(|&s| s <= unit) - 1;
        (d, unit - self.starts[d])
    }

    /// How errors name page `page` (0-based) of document `d`: the file, plus the page number
    /// for a PDF.
    pub fn page_name(&self, d: usize, page: usize) -> String {
        let doc = &self.docs[d];
        match doc.kind {
            DocKind::Image => doc.path.display().to_string(),
            DocKind::Pdf { .. } => {
                format!("{}: page {}", doc.path.display(), doc.page_number(page))
            }
        }
    }

    /// Counts a generated token (progress rate).
    pub fn token(&mut self) {
        self.tokens += 1;
        if self.tokens.is_multiple_of(8) {
            self.update_rate();
        }
    }

    fn update_rate(&self) {
        let secs = self.start.elapsed().as_secs_f64().max(1e-9);
        self.bar.set_message(format!(
            "{}, {:.1} tokens/s",
            page_rate(self.done as usize, secs),
            self.tokens as f64 / secs
        ));
    }

    /// Records the result of `unit` and writes everything that is now in order.
    pub fn finish(&mut self, unit: usize, result: PageResult) {
        self.done += 1;
        self.bar.inc(1);
        self.update_rate();
        self.finished.insert(unit, result);
        while let Some(r) = self.finished.remove(&self.next) {
            let (d, page) = self.locate(self.next);
            self.next += 1;
            self.emit(d, page, r);
        }
    }

    /// Prints a message on stderr without garbling the progress bar.
    pub fn report(&self, msg: &str) {
        self.bar.suspend(|| eprintln!("{msg}"));
    }

    fn emit(&mut self, d: usize, page: usize, r: PageResult) {
        let doc = &self.docs[d];
        let outcome = r.outcome;
        match (&r.text, outcome.reason) {
            (Err(msg), _) => self.report(&format!("error: {msg}")),
            (Ok(_), Some(_)) => self.report(&format!(
                "error: {}",
                not_finished(&self.page_name(d, page), &outcome, self.policy.max_tokens)
            )),
            (Ok(_), None) => {}
        }
        self.count(&outcome);
        let mut marker = outcome
            .reason
            .map(|why| failed_marker(doc.page_number(page), why));
        let layer = marker.as_ref().and_then(|_| self.fallback_text(d, page));
        if let Some(why) = outcome.reason {
            let mut v =
                json!({"page": doc.page_number(page), "reason": why, "attempts": outcome.attempts});
            if let Err(msg) = &r.text {
                v["error"] = json!(msg);
            }
            if layer.is_some() {
                v["fallback"] = json!("text_layer");
            }
            self.doc_failed.push(v);
        }
        if let (Some(m), Some(t)) = (&marker, &layer) {
            marker = Some(text_layer_block(m, doc.page_number(page), t));
        }
        match &self.mode {
            Mode::Json => {
                let v = match r.text {
                    Ok((_, json)) => {
                        let mut v = json.expect("JSON mode builds the object");
                        if let (Some(o), Value::Object(fields)) =
                            (v.as_object_mut(), json!(outcome))
                        {
                            o.extend(fields);
                        }
                        v
                    }
                    Err(msg) => error_row(
                        &doc.path,
                        Some(doc.page_number(page)),
                        &msg,
                        outcome.attempts,
                    ),
                };
                let mut v = v;
                if let Some(t) = layer {
                    v["text_layer"] = json!(t);
                }
                self.bar.suspend(|| println!("{v}"));
            }
            Mode::Text => {
                let sep = match page {
                    // Several documents in one stream: each opens with its file's name.
                    0 if self.docs.len() > 1 => document_header(&doc.path),
                    0 => String::new(),
                    _ => page_separator(doc.page_number(page)),
                };
                let text = match (marker, r.text) {
                    (Some(m), _) => m,
                    (None, Ok((text, _))) => text,
                    (None, Err(_)) => String::new(),
                };
                self.bar.suspend(|| print!("{sep}{text}"));
            }
            Mode::Markdown(_) => match (marker, r.text) {
                (Some(m), _) => self.doc_texts.push(m),
                (None, Ok((text, _))) => self.doc_texts.push(text),
                (None, Err(_)) => {}
            },
        }
        if page + 1 == doc.pages() {
            self.end_document(d);
        }
    }

    /// With `--fallback text`, the text layer of failed page `page` of PDF document `d` when it
    /// has one (a warning names the page when it cannot be read).
    fn fallback_text(&mut self, d: usize, page: usize) -> Option<String> {
        let doc = &self.docs[d];
        if !matches!(doc.kind, DocKind::Pdf { .. }) {
            return None;
        }
        match self.text_layer.as_mut()?.text(d, doc, page) {
            Ok(t) if !t.trim().is_empty() => Some(t),
            Ok(_) => None,
            Err(e) => {
                let name = self.page_name(d, page);
                self.report(&format!(
                    "warning: {name}: no text layer to fall back on: {e}"
                ));
                None
            }
        }
    }

    /// Counts a page's outcome.
    fn count(&mut self, o: &PageOutcome) {
        match o.reason {
            None => self.pages_ok += 1,
            Some(r) => self.pages_failed[r as usize] += 1,
        }
        self.pages_retried += usize::from(o.status == PageStatus::Retried);
    }

    /// `3 ok, 1 retried, 1 failed (length 1)`: the pages' outcomes for the summary line.
    pub fn page_summary(&self) -> String {
        let failed: usize = self.pages_failed.iter().sum();
        let mut s = format!(
            "{} ok, {} retried, {failed} failed",
            self.pages_ok - self.pages_retried,
            self.pages_retried
        );
        let why: Vec<String> = [FailReason::Length, FailReason::Loop, FailReason::Error]
            .iter()
            .filter(|r| self.pages_failed[**r as usize] > 0)
            .map(|r| format!("{r} {}", self.pages_failed[*r as usize]))
            .collect();
        if !why.is_empty() {
            s.push_str(&format!(" ({})", why.join(", ")));
        }
        s
    }

    /// After a document's last page: writes its markdown as its [`verdict`] says and records
    /// it as failed when a page failed or the file could not be written.
    fn end_document(&mut self, d: usize) {
        let doc = &self.docs[d];
        let failed = std::mem::take(&mut self.doc_failed);
        let texts = std::mem::take(&mut self.doc_texts);
        let mut row = (!failed.is_empty()).then(|| {
            json!({
                "file": doc.path.display().to_string(),
                "error": format!("{} of {} page(s) failed", failed.len(), doc.pages()),
                "pages": failed,
            })
        });
        match &self.mode {
            Mode::Text => self.bar.suspend(|| println!()),
            Mode::Markdown(dir) => {
                let path = md_path(dir, &doc.path);
                let n = failed.len();
                // Pages the text layer stands in for are not missing from the document.
                let missing = failed
                    .iter()
                    .filter(|f| f.get("fallback").is_none())
                    .count();
                let v = match verdict(missing, doc.pages(), self.policy.max_failed) {
                    DocVerdict::Complete if n > 0 => DocVerdict::Partial,
                    v => v,
                };
                if let Some(r) = row.as_mut() {
                    r["written"] = json!(if v == DocVerdict::Partial {
                        json!("partial")
                    } else {
                        json!(false)
                    });
                }
                if v == DocVerdict::Failed {
                    if doc.kind != DocKind::Image {
                        self.report(&format!(
                            "error: {}: {} not written because a page failed",
                            doc.path.display(),
                            path.display()
                        ));
                    }
                } else if let Err(e) = write_md(&path, &texts, doc) {
                    let msg = format!("{}: {e}", doc.path.display());
                    self.report(&format!("error: {msg}"));
                    row.get_or_insert_with(|| json!({"file": doc.path.display().to_string()}))
                        ["error"] = json!(msg);
                } else if v == DocVerdict::Partial {
                    self.report(&format!(
                        "error: {}: written to {} with {n} of {} page(s) failed, each marked \
                         `<!-- page N failed: REASON -->`{}",
                        doc.path.display(),
                        path.display(),
                        doc.pages(),
                        match n - missing {
                            0 => String::new(),
                            k => format!(", {k} of them followed by the PDF's text layer"),
                        }
                    ));
                }
            }
            Mode::Json => {}
        }
        if let Some(r) = row {
            self.failed_docs += 1;
            self.failures.rows.push(r);
        }
    }

    /// Removes the progress bar; returns the seconds since the writer was made.
    pub fn close(&self) -> f64 {
        self.bar.finish_and_clear();
        debug_assert!(self.finished.is_empty(), "every page was emitted");
        self.start.elapsed().as_secs_f64()
    }
}

/// `2.35 pages/s`, or `12.4 s/page` when that would print below 1 (a slow CPU run printed
/// "0.00 pages/s"), or `no page done`.
pub fn page_rate(pages: usize, secs: f64) -> String {
    let rate = pages as f64 / secs.max(1e-9);
    match pages {
        0 => "no page done".into(),
        _ if rate >= 1.0 => format!("{rate:.2} pages/s"),
        _ => format!("{:.1} s/page", 1.0 / rate),
    }
}

/// Writes a document's pages (joined by [`page_separator`]) through a temporary file.
///
/// The temporary file is a fresh one with a random name in the same folder, created
/// exclusively (`O_EXCL`: never through a link someone planted there), then renamed over
/// `path`. (A fixed `NAME.md.partial` was opened through a planted symlink, and
/// `Path::with_extension` makes `..md` into `..`.)
fn write_md(path: &Path, pages: &[String], doc: &Document) -> std::io::Result<()> {
    let mut md = String::new();
    for (i, text) in pages.iter().enumerate() {
        if i > 0 {
            md.push_str(&page_separator(doc.page_number(i)));
        }
        md.push_str(text);
    }
    md.push('\n');
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    // The data reaches the disk before the rename publishes it, and the rename before we
    // report success: after a crash `--resume` sees either the whole file or none.
    let write = || -> std::io::Result<()> {
        let mut tmp = tempfile::Builder::new()
            .prefix(".ocrctl-")
            .suffix(".md.partial")
            // What `File::create` gives (less the umask), not the temporary file's 0600.
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .tempfile_in(dir)?;
        std::io::Write::write_all(&mut tmp, md.as_bytes())?;
        tmp.as_file().sync_all()?;
        tmp.persist(path).map_err(|e| e.error)?;
        std::fs::File::open(dir)?.sync_all()?;
        Ok(())
    };
    write().map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// The line that opens a document's text on stdout when several documents share it.
pub(crate) fn document_header(path: &Path) -> String {
    format!("<!-- file: {} -->\n", path.display())
}

#[cfg(test)]
mod tests {
    use super::page_rate;

    #[test]
    fn slow_runs_print_seconds_a_page_not_zero_pages_a_second() {
        assert_eq!(page_rate(7, 2.0), "3.50 pages/s");
        assert_eq!(page_rate(1, 1.0), "1.00 pages/s");
        assert_eq!(page_rate(2, 150.0), "75.0 s/page");
        assert_eq!(page_rate(0, 3.0), "no page done");
    }
}
