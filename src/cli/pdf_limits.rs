//! `--pdf-page-timeout` and `--pdf-page-memory` (`ocr`, `serve`): the limits of the worker
//! processes that read PDFs ([`ocrctl::documents::pdf::sandbox`]).

use clap::Args;
use ocrctl::documents::pdf::sandbox::{
    PdfLimits, PdfReader, Sandbox, DEFAULT_MEMORY_MIB, DEFAULT_SECONDS,
};
use std::path::PathBuf;
use std::sync::Arc;

/// Limits on reading one PDF page.
#[derive(Args, Debug, Clone)]
pub struct PdfLimitArgs {
    /// Seconds opening a PDF or rendering one of its pages may take; past it the worker
    /// process that renders is stopped and the page (or document) fails, naming the limit.
    #[arg(long, env = "OCRCTL_PDF_PAGE_TIMEOUT", default_value_t = DEFAULT_SECONDS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub pdf_page_timeout: u64,
    /// Memory (address space, MiB) of the worker process that renders a PDF page; a page
    /// that needs more fails, naming the limit.
    #[arg(long, env = "OCRCTL_PDF_PAGE_MEMORY", default_value_t = DEFAULT_MEMORY_MIB,
          value_parser = clap::value_parser!(u64).range(64..))]
    pub pdf_page_memory: u64,
}

impl PdfLimitArgs {
    /// A reader that renders in worker processes with these limits (`pdfium`: the explicit
    /// library path, else searched).
    pub fn reader(&self, pdfium: Option<PathBuf>) -> PdfReader {
        let limits = PdfLimits {
            seconds: self.pdf_page_timeout,
            memory_mib: self.pdf_page_memory,
        };
        PdfReader::Sandboxed(Arc::new(Sandbox::new(pdfium, limits)))
    }
}
