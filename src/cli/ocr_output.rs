//! Results of `ocrctl ocr`, written as pages finish: in input order, one document at a time.
//!
//! Pages finish out of order (continuous batching); [`Output`] holds finished pages until
//! every earlier page is done, then emits them: plain text on stdout, one JSON object per
//! page, or one markdown file per document (`--out`), written when its last page is done and
//! only if every page succeeded (so `--resume` retries it). Pages of a PDF are separated by
//! [`page_separator`]. Only the document being emitted and pages that finished early are
//! held. A progress bar on stderr counts pages as they finish.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use ocrctl::documents::inputs::{DocKind, Document};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use ocrctl::documents::inputs::page_separator;

/// `<dir>/<file stem>.md`, the markdown file of a document.
pub fn md_path(dir: &Path, file: &Path) -> PathBuf {
    let stem = file
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "page".into());
    dir.join(format!("{stem}.md"))
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

/// A finished page: its text and, for `--json`, the object to print; or an error message
/// that names the file (and page).
pub type PageResult = Result<(String, Option<Value>), String>;

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
    doc_failed: bool,
    /// Documents with at least one failed page.
    pub failed_docs: usize,
    /// Pages that succeeded.
    pub pages_ok: usize,
    /// Tokens generated.
    pub tokens: usize,
    done: u64,
    start: Instant,
    bar: ProgressBar,
}

impl<'a> Output<'a> {
    /// A writer for `docs`; the progress bar shows when there is more than one page, stderr is
    /// a terminal and not `quiet`.
    pub fn new(docs: &'a [Document], mode: Mode, quiet: bool) -> Self {
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
            doc_failed: false,
            failed_docs: 0,
            pages_ok: 0,
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
            "{:.2} pages/s, {:.1} tokens/s",
            self.done as f64 / secs,
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
        let last = page + 1 == doc.pages();
        match r {
            Err(msg) => {
                self.report(&format!("error: {msg}"));
                self.doc_failed = true;
            }
            Ok((text, json)) => {
                self.pages_ok += 1;
                match &self.mode {
                    Mode::Json => {
                        let v = json.expect("JSON mode builds the object");
                        self.bar.suspend(|| println!("{v}"));
                    }
                    Mode::Text => {
                        let sep = if page == 0 {
                            String::new()
                        } else {
                            page_separator(doc.page_number(page))
                        };
                        self.bar.suspend(|| print!("{sep}{text}"));
                    }
                    Mode::Markdown(_) => self.doc_texts.push(text),
                }
            }
        }
        if !last {
            return;
        }
        match &self.mode {
            Mode::Text => self.bar.suspend(|| println!()),
            Mode::Markdown(dir) => {
                let path = md_path(dir, &doc.path);
                if !self.doc_failed {
                    if let Err(e) = write_md(&path, &self.doc_texts, doc) {
                        self.report(&format!("error: {}: {e}", doc.path.display()));
                        self.doc_failed = true;
                    }
                } else if doc.kind != DocKind::Image {
                    self.report(&format!(
                        "error: {}: {} not written because a page failed",
                        doc.path.display(),
                        path.display()
                    ));
                }
            }
            Mode::Json => {}
        }
        self.failed_docs += usize::from(self.doc_failed);
        self.doc_failed = false;
        self.doc_texts.clear();
    }

    /// Removes the progress bar; returns the seconds since the writer was made.
    pub fn close(&self) -> f64 {
        self.bar.finish_and_clear();
        debug_assert!(self.finished.is_empty(), "every page was emitted");
        self.start.elapsed().as_secs_f64()
    }
}

/// Writes a document's pages (joined by [`page_separator`]) through a temporary file.
fn write_md(path: &Path, pages: &[String], doc: &Document) -> std::io::Result<()> {
    let mut md = String::new();
    for (i, text) in pages.iter().enumerate() {
        if i > 0 {
            md.push_str(&page_separator(doc.page_number(i)));
        }
        md.push_str(text);
    }
    md.push('\n');
    let tmp = path.with_extension("md.partial");
    // The data reaches the disk before the rename publishes it, and the rename before we
    // report success: after a crash `--resume` sees either the whole file or none.
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        std::io::Write::write_all(&mut f, md.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    };
    write().map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}
