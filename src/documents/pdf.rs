//! PDF input: every page rendered to an RGB image with pdfium, ready for [`crate::model::preprocess`].
//!
//! pdfium comes from the `pypdfium2` wheel on PyPI (`scripts/setup.sh` installs it into
//! `.venv`), loaded at run time like ONNX Runtime: see [`find_library`] for where it is looked for.
//! Pages are rendered at [`PDF_DPI`] on a white background with annotations (and form fields
//! that have an appearance stream) drawn, scaled down so that the longest side is at most
//! [`PDF_MAX_SIDE`] pixels — the render itself is scaled, nothing is rendered larger and
//! resized — which is also the model's longest edge, so preprocessing only pads to the
//! 28-pixel grid. The page size is checked before anything is allocated: a crafted page of
//! any size costs at most one 1540 × 1540 bitmap.
//!
//! ```no_run
//! let bytes = std::fs::read("scan.pdf")?;
//! let pages = ocrctl::documents::pdf::render_pdf(&bytes, "scan.pdf", None)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`PdfDocument`] opens a document once and renders pages one at a time (what `ocrctl ocr`
//! does, to keep memory bounded); [`render_pdf`] renders them all.

mod pdfium;
pub mod sandbox;
mod wire;
pub mod worker;

use image::RgbImage;
use pdfium::{with_loaded, with_pdfium, Handle};
use std::borrow::Cow;
use std::path::{Path, PathBuf};

pub use pdfium::{
    candidate_dirs, find_library, library_version, PDFIUM_LIB_ENV, PYPDFIUM2_VERSION,
};

/// Rendering resolution in dots per inch (a PDF point is 1/72 inch).
pub const PDF_DPI: f32 = 200.0;
/// Longest side of a rendered page in pixels (LightOnOCR's `longest_edge`).
pub const PDF_MAX_SIDE: u32 = ocrctl_exporters::contract::image::LONGEST_EDGE;
/// Documents with more pages than this are refused.
pub const PDF_MAX_PAGES: usize = 500;

/// Errors opening or rendering a PDF. Every message names the document (`name`). They cross
/// from the [`sandbox`]'s worker process to its parent as JSON.
#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum PdfError {
    /// No pdfium library in any of the places searched.
    #[error(
        "{name}: cannot read PDFs: the pdfium library (libpdfium.so from the pypdfium2 wheel) \
         was not found. Searched:\n  {searched}\nInstall it with `scripts/setup.sh` (puts \
         pypdfium2=={PYPDFIUM2_VERSION} into .venv), or pass --pdfium-lib PATH or set \
         {PDFIUM_LIB_ENV}"
    )]
    LibraryNotFound {
        /// The document that needed the library.
        name: String,
        /// The folders searched, one per line.
        searched: String,
    },
    /// The library path given explicitly does not exist.
    #[error(
        "{name}: cannot read PDFs: the pdfium library {path} given by {origin} does not exist \
         (`scripts/setup.sh` installs one into .venv)"
    )]
    LibraryMissing {
        /// The document that needed the library.
        name: String,
        /// The path given.
        path: PathBuf,
        /// `--pdfium-lib` or the environment variable.
        origin: String,
    },
    /// The library exists but could not be loaded or lacks a function.
    #[error("{name}: cannot read PDFs: could not load pdfium from {path}: {message}")]
    LibraryLoad {
        /// The document that needed the library.
        name: String,
        /// The library file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The document is encrypted and needs a password (or an unsupported security handler).
    #[error(
        "{name}: the PDF is encrypted ({detail}); decrypt it first, e.g. with `qpdf --decrypt`"
    )]
    Encrypted {
        /// The document at fault.
        name: String,
        /// Password-protected, or an unsupported security handler.
        detail: Cow<'static, str>,
    },
    /// pdfium could not parse the data.
    #[error("{name}: not a PDF or a damaged one ({detail})")]
    Broken {
        /// The document at fault.
        name: String,
        /// pdfium's error.
        detail: String,
    },
    /// The document has no pages.
    #[error("{name}: the PDF has no pages")]
    NoPages {
        /// The document at fault.
        name: String,
    },
    /// The document has more than [`PDF_MAX_PAGES`] pages.
    #[error("{name}: the PDF has {pages} pages, more than the limit of {max}; split it")]
    TooManyPages {
        /// The document at fault.
        name: String,
        /// Its page count.
        pages: usize,
        /// [`PDF_MAX_PAGES`].
        max: usize,
    },
    /// One page could not be loaded or rendered.
    #[error("{name}: page {page}: {problem}")]
    Page {
        /// The document at fault.
        name: String,
        /// 1-based page number.
        page: usize,
        /// What went wrong.
        problem: String,
    },
    /// Opening the document or rendering a page went past a limit of the [`sandbox`]; its
    /// worker was stopped.
    #[error("{name}: {step}: {exceeded}")]
    Limit {
        /// The document at fault.
        name: String,
        /// Opening it, or which page.
        step: sandbox::Step,
        /// Which limit.
        exceeded: sandbox::Exceeded,
    },
    /// The [`sandbox`]'s worker process could not be started.
    #[error("{name}: cannot read PDFs: cannot start the PDF renderer process: {detail}")]
    WorkerStart {
        /// The document that needed it.
        name: String,
        /// What went wrong.
        detail: String,
    },
    /// The [`sandbox`]'s worker process stopped without an answer short of a limit (a
    /// crash), or answered nonsense.
    #[error("{name}: {step}: the PDF renderer process failed: {detail}")]
    Worker {
        /// The document being read.
        name: String,
        /// Opening it, or which page.
        step: sandbox::Step,
        /// What happened.
        detail: String,
    },
}

/// Whether `bytes` look like a PDF: `%PDF-` within the first 1024 bytes (where pdfium and
/// other readers accept the header).
pub fn is_pdf(bytes: &[u8]) -> bool {
    bytes[..bytes.len().min(1024)]
        .windows(5)
        .any(|w| w == b"%PDF-")
}

/// Pixel size `(width, height)` of a page of `width_pt × height_pt` points rendered at
/// [`PDF_DPI`], scaled down so that the longest side is at most [`PDF_MAX_SIDE`] (each side at
/// least 1). `None` for sizes that are not finite and positive.
pub fn render_size(width_pt: f32, height_pt: f32) -> Option<(u32, u32)> {
    let ok = |x: f32| x.is_finite() && x > 0.0;
    if !ok(width_pt) || !ok(height_pt) {
        return None;
    }
    let (w, h) = (f64::from(width_pt), f64::from(height_pt));
    let longest = w.max(h);
    let scale = (f64::from(PDF_DPI) / 72.0).min(f64::from(PDF_MAX_SIDE) / longest);
    let px = |side: f64| ((side * scale).round() as u32).clamp(1, PDF_MAX_SIDE);
    Some((px(w), px(h)))
}

/// Pixel size `(width, height)` of a page of `width_pt × height_pt` points rendered at
/// [`PDF_DPI`] with no side cap, scaled down only when it would have more than `max_pixels`
/// pixels (each side at least 1): the full-resolution page that figures are cropped from.
/// `None` for sizes that are not finite and positive.
pub fn full_render_size(width_pt: f32, height_pt: f32, max_pixels: u64) -> Option<(u32, u32)> {
    let ok = |x: f32| x.is_finite() && x > 0.0;
    if !ok(width_pt) || !ok(height_pt) {
        return None;
    }
    let dpi_scale = f64::from(PDF_DPI) / 72.0;
    let (w, h) = (
        f64::from(width_pt) * dpi_scale,
        f64::from(height_pt) * dpi_scale,
    );
    let fit = (max_pixels.max(1) as f64 / (w * h)).sqrt().min(1.0);
    // pdfium takes sides as C ints.
    let px = |side: f64| ((side * fit).floor() as u32).clamp(1, i32::MAX as u32);
    Some((px(w), px(h)))
}

/// Renders every page of a PDF held in memory (see the module documentation). `name` names
/// the document in errors; `lib` is an explicit pdfium library path (else it is searched).
pub fn render_pdf(bytes: &[u8], name: &str, lib: Option<&Path>) -> Result<Vec<RgbImage>, PdfError> {
    let doc = PdfDocument::open(bytes, name, lib)?;
    (0..doc.page_count()).map(|i| doc.render_page(i)).collect()
}

/// An open PDF document. Its data stays borrowed (or owned) while it is open; every call
/// takes the process-wide pdfium lock, so documents may be used from any thread.
pub struct PdfDocument<'a> {
    doc: Handle,
    pages: usize,
    name: String,
    // pdfium reads from this buffer until the document is closed; keep it after `doc`.
    _bytes: Cow<'a, [u8]>,
}

// SAFETY: pdfium handles are not tied to a thread; every use holds pdfium's global lock.
unsafe impl Send for PdfDocument<'_> {}

impl<'a> PdfDocument<'a> {
    /// Opens a document from its bytes and counts its pages, refusing encrypted, damaged,
    /// empty and over-long ([`PDF_MAX_PAGES`]) documents.
    pub fn open(
        bytes: impl Into<Cow<'a, [u8]>>,
        name: &str,
        lib: Option<&Path>,
    ) -> Result<Self, PdfError> {
        let bytes = bytes.into();
        let (doc, code) = with_pdfium(lib, name, |f| {
            // SAFETY: the buffer outlives the document (see `_bytes`); no password.
            let doc = unsafe {
                (f.load_mem_document64)(bytes.as_ptr().cast(), bytes.len(), std::ptr::null())
            };
            let code = if doc.is_null() {
                unsafe { (f.get_last_error)() }
            } else {
                0
            };
            (doc, code)
        })?;
        let name = name.to_string();
        if doc.is_null() {
            return Err(match code {
                pdfium::FPDF_ERR_PASSWORD => PdfError::Encrypted {
                    name,
                    detail: "password-protected".into(),
                },
                pdfium::FPDF_ERR_SECURITY => PdfError::Encrypted {
                    name,
                    detail: "unsupported security handler".into(),
                },
                pdfium::FPDF_ERR_FORMAT => PdfError::Broken {
                    name,
                    detail: "pdfium: file format error".into(),
                },
                pdfium::FPDF_ERR_FILE => PdfError::Broken {
                    name,
                    detail: "pdfium: file not found or could not be read".into(),
                },
                code => PdfError::Broken {
                    name,
                    detail: format!("pdfium error {code}"),
                },
            });
        }
        let mut this = Self {
            doc,
            pages: 0,
            name,
            _bytes: bytes,
        };
        // SAFETY: `doc` is an open document.
        let count = with_loaded(|f| unsafe { (f.get_page_count)(doc) });
        let name = this.name.clone();
        this.pages = match usize::try_from(count) {
            Err(_) => {
                return Err(PdfError::Broken {
                    name,
                    detail: format!("pdfium reports {count} pages"),
                })
            }
            Ok(0) => return Err(PdfError::NoPages { name }),
            Ok(n) if n > PDF_MAX_PAGES => {
                return Err(PdfError::TooManyPages {
                    name,
                    pages: n,
                    max: PDF_MAX_PAGES,
                })
            }
            Ok(n) => n,
        };
        Ok(this)
    }

    /// Number of pages (1 ..= [`PDF_MAX_PAGES`]).
    pub fn page_count(&self) -> usize {
        self.pages
    }

    /// The name given to [`PdfDocument::open`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Renders page `index` (0-based) as described in the module documentation. Errors name
    /// the 1-based page number.
    pub fn render_page(&self, index: usize) -> Result<RgbImage, PdfError> {
        self.render_page_sized(index, render_size)
    }

    /// Renders page `index` (0-based) at [`PDF_DPI`] without the model's side cap, within
    /// `max_pixels` ([`full_render_size`]): what figures are cropped from.
    pub fn render_page_full(&self, index: usize, max_pixels: u64) -> Result<RgbImage, PdfError> {
        self.render_page_sized(index, |w, h| full_render_size(w, h, max_pixels))
    }

    /// Renders page `index` at the pixel size `size` gives for its size in points (as pdfium
    /// reports it: after the page's `/Rotate`, which the render applies).
    fn render_page_sized(
        &self,
        index: usize,
        size: impl FnOnce(f32, f32) -> Option<(u32, u32)>,
    ) -> Result<RgbImage, PdfError> {
        self.with_page(index, |f, page, page_err| {
            // SAFETY (whole block): `page` is loaded (and closed by `with_page`), the bitmap is
            // checked for null and released by a guard, and its buffer is read within its
            // `stride · height` bytes while it is alive.
            let (w_pt, h_pt) = unsafe { ((f.get_page_width_f)(page), (f.get_page_height_f)(page)) };
            let (w, h) = size(w_pt, h_pt)
                .ok_or_else(|| page_err(format!("invalid page size {w_pt} x {h_pt} pt")))?;
            let (wi, hi) = (w as i32, h as i32);
            // 4 bytes per pixel (BGRx), no alpha channel.
            let bitmap = unsafe { (f.bitmap_create)(wi, hi, 0) };
            if bitmap.is_null() {
                return Err(page_err(format!("cannot allocate a {w}x{h} bitmap")));
            }
            let _bitmap = Defer(|| unsafe { (f.bitmap_destroy)(bitmap) });
            unsafe {
                (f.bitmap_fill_rect)(bitmap, 0, 0, wi, hi, 0xFFFF_FFFF);
                (f.render_page_bitmap)(bitmap, page, 0, 0, wi, hi, 0, pdfium::FPDF_ANNOT);
            }
            let buf = unsafe { (f.bitmap_get_buffer)(bitmap) }.cast::<u8>();
            let stride = usize::try_from(unsafe { (f.bitmap_get_stride)(bitmap) }).unwrap_or(0);
            let (w, h) = (w as usize, h as usize);
            if buf.is_null() || stride < 4 * w {
                return Err(page_err(format!(
                    "pdfium returned no {w}x{h} bitmap buffer"
                )));
            }
            let src = unsafe { std::slice::from_raw_parts(buf, stride * h) };
            let mut rgb = Vec::with_capacity(3 * w * h);
            for row in src.chunks_exact(stride) {
                for px in row[..4 * w].chunks_exact(4) {
                    rgb.extend_from_slice(&[px[2], px[1], px[0]]);
                }
            }
            Ok(RgbImage::from_raw(w as u32, h as u32, rgb).expect("3 bytes per pixel"))
        })
    }
}

impl PdfDocument<'_> {
    /// Runs `f` with pdfium's functions, page `index` (0-based) loaded, and the error of a
    /// problem with that page (naming the document and the 1-based page); closes the page
    /// afterwards.
    fn with_page<T>(
        &self,
        index: usize,
        f: impl FnOnce(&pdfium::Fns, Handle, &dyn Fn(String) -> PdfError) -> Result<T, PdfError>,
    ) -> Result<T, PdfError> {
        let page_err = |problem: String| PdfError::Page {
            name: self.name.clone(),
            page: index + 1,
            problem,
        };
        if index >= self.pages {
            return Err(page_err(format!(
                "no such page (the document has {})",
                self.pages
            )));
        }
        with_loaded(|fns| {
            // SAFETY: `self.doc` is open; the page is checked for null and closed by a guard
            // after `f`, which gets it only while it is loaded.
            let page = unsafe { (fns.load_page)(self.doc, index as i32) };
            if page.is_null() {
                let code = unsafe { (fns.get_last_error)() };
                return Err(page_err(format!(
                    "cannot load the page (pdfium error {code})"
                )));
            }
            let _page = Defer(|| unsafe { (fns.close_page)(page) });
            f(fns, page, &page_err)
        })
    }

    /// The text layer of page `index` (0-based) as pdfium extracts it (reading order as the
    /// PDF draws it; empty for a scan without one), at most [`MAX_TEXT_CHARS`] characters.
    pub fn page_text(&self, index: usize) -> Result<String, PdfError> {
        self.with_page(index, |f, page, page_err| {
            // SAFETY (whole block): `page` is loaded, the text page is checked for null and
            // released by a guard, and the buffer holds the `n + 1` units pdfium may write.
            let text = unsafe { (f.text_load_page)(page) };
            if text.is_null() {
                return Err(page_err("cannot read the page's text layer".into()));
            }
            let _text = Defer(|| unsafe { (f.text_close_page)(text) });
            let n = unsafe { (f.text_count_chars)(text) }.clamp(0, MAX_TEXT_CHARS as i32);
            let mut buf = vec![0u16; n as usize + 1];
            let got = unsafe { (f.text_get_text)(text, 0, n, buf.as_mut_ptr()) };
            buf.truncate(usize::try_from(got).unwrap_or(0).saturating_sub(1));
            Ok(String::from_utf16_lossy(&buf).replace("\r\n", "\n"))
        })
    }
}

/// The most characters of a page's text layer read (a real page has a few thousand).
pub const MAX_TEXT_CHARS: usize = 1 << 20;

impl Drop for PdfDocument<'_> {
    fn drop(&mut self) {
        // SAFETY: `self.doc` is open and closed exactly once, before `_bytes` is dropped.
        with_loaded(|f| unsafe { (f.close_document)(self.doc) });
    }
}

/// Runs a closure when dropped (releases pdfium handles on every path).
struct Defer<F: FnMut()>(F);

impl<F: FnMut()> Drop for Defer<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

#[cfg(test)]
mod tests;
