//! What `ocrctl ocr` reads: command-line inputs (files, folders, glob patterns) expanded
//! into documents — an image is a document of one page, a PDF one of N pages — and the
//! pages loaded one at a time.
//!
//! - A folder gives its image and PDF files (by extension), sorted; its subfolders' too with
//!   `--recursive` ([`expand_counted`]), else they are skipped and counted.
//! - A path that does not exist and contains `*`, `?` or `[` is a glob pattern (quote it so
//!   that the shell does not expand it), matched one path component at a time with
//!   [`globset`] (see [`component_matcher`]): `*` and `?` match within one component (never
//!   a `/`), `[abc]`, `[a-z]`, `[!a]` (or `[^a]`) and `[[:digit:]]` match one character of a
//!   set (`[*]` a literal `*`; an unclosed `[` is itself literal), `{a,b}` either
//!   alternative; a backslash is an ordinary character. Like in shells, a wildcard does not
//!   match a leading `.` unless the component starts with one. Matches are the image and PDF
//!   files (by extension), sorted. A pattern that matches none, or that is malformed (`[z-a]`,
//!   an unclosed `{`), is an error. A component `**` matches any number of folders
//!   (`scans/**/*.pdf`: every PDF below `scans`, not in hidden folders).
//! - Any other path is a file: a PDF if it starts with the PDF magic or ends in `.pdf`,
//!   else an image (its format is detected when it is loaded).
//!
//! [`Document::open`] counts a PDF's pages (and refuses encrypted or broken ones) without
//! rendering; [`PageLoader`] renders or decodes a page only when asked and keeps at most one
//! PDF open, so memory does not grow with the number or length of the documents. Both read
//! PDFs with a [`PdfReader`]: `ocrctl ocr` gives them a sandboxed one (worker processes with
//! time and memory limits, [`pdf::sandbox`]).

use crate::documents::pdf::sandbox::{OpenPdf, PdfReader};
use crate::documents::pdf::{self, PdfError};
use crate::documents::ranges::{PageRanges, RangeError};
use crate::model::preprocess::{self, PreprocessError};
use crate::quality::calibrate::IMAGE_EXTENSIONS;
use image::RgbImage;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Errors expanding inputs or loading a page. Every message names the file or pattern.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// A folder (or a folder a pattern walks) could not be listed.
    #[error("cannot list folder {path}: {source}")]
    Folder {
        /// The folder at fault.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A folder holds no image or PDF file.
    #[error("{path}: no image or PDF file in this folder (png, jpg, webp, tif, pdf; subfolders are read with --recursive)")]
    EmptyFolder {
        /// The folder as given.
        path: PathBuf,
    },
    /// A glob pattern is malformed (e.g. a reversed range `[z-a]`, an unclosed `{`).
    #[error("{pattern}: not a valid glob pattern: {reason}")]
    Pattern {
        /// The pattern as given.
        pattern: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A glob pattern matched no image or PDF file.
    #[error("{pattern}: no image or PDF file matches this pattern")]
    NoMatch {
        /// The pattern as given.
        pattern: String,
    },
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file at fault.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// An image could not be loaded.
    #[error(transparent)]
    Image(#[from] PreprocessError),
    /// A PDF could not be opened or a page rendered.
    #[error(transparent)]
    Pdf(#[from] PdfError),
    /// `--pages` names a page the document does not have.
    #[error(transparent)]
    Pages(#[from] RangeError),
}

/// File extensions (lower case) taken from folders and patterns.
pub fn accepted_extension(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .is_some_and(|e| e == "pdf" || IMAGE_EXTENSIONS.contains(&e.as_str()))
}

fn is_pattern(p: &Path) -> bool {
    !p.exists() && p.to_string_lossy().contains(['*', '?', '['])
}

/// One shard of a batch job: `index` of `count` (0-based), from `--shard K/N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: u64,
    pub count: u64,
}

impl std::str::FromStr for Shard {
    type Err = String;

    /// `K/N` with `0 <= K < N`.
    fn from_str(s: &str) -> Result<Shard, String> {
        let err = || format!("expected K/N with 0 <= K < N (e.g. 0/4), got {s:?}");
        let (k, n) = s.split_once('/').ok_or_else(err)?;
        let (index, count) = (
            k.trim().parse().map_err(|_| err())?,
            n.trim().parse().map_err(|_| err())?,
        );
        if count == 0 || index >= count {
            return Err(err());
        }
        Ok(Shard { index, count })
    }
}

impl Shard {
    /// Whether `path` belongs to this shard. Decided by the file's name alone (FNV-1a, 64-bit),
    /// so the shards do not depend on the order of a listing, on where the folder is mounted
    /// or what it is called, and every file falls in exactly one shard. (FNV-1a is written out
    /// here because its value must never change between versions; a hashing crate's default
    /// hasher makes no such promise.)
    pub fn contains(&self, path: &Path) -> bool {
        let name = path.file_name().map_or_else(
            || path.as_os_str().as_encoded_bytes().to_vec(),
            |n| n.as_encoded_bytes().to_vec(),
        );
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h % self.count == self.index
    }
}

/// Expands inputs into files in order: folders and patterns as described in the module
/// documentation, other paths as given. Inputs that fail (an unreadable folder, a pattern
/// matching nothing) give an error each; the others still expand.
pub fn expand(inputs: &[PathBuf]) -> Vec<Result<PathBuf, InputError>> {
    expand_counted(inputs, false).0
}

/// [`expand`], reading folders' subfolders too when `recursive`; also returns how many
/// folder entries were skipped (files that are not images or PDFs, and subfolders when not
/// `recursive`).
pub fn expand_counted(
    inputs: &[PathBuf],
    recursive: bool,
) -> (Vec<Result<PathBuf, InputError>>, usize) {
    let mut out = Vec::new();
    let mut skipped = 0;
    for input in inputs {
        if input.is_dir() {
            match list_folder(input, recursive, &mut skipped) {
                Ok(files) if files.is_empty() => out.push(Err(InputError::EmptyFolder {
                    path: input.clone(),
                })),
                Ok(files) => out.extend(files.into_iter().map(Ok)),
                Err(e) => out.push(Err(e)),
            }
        } else if is_pattern(input) {
            match glob(input) {
                Ok(files) if files.is_empty() => out.push(Err(InputError::NoMatch {
                    pattern: input.display().to_string(),
                })),
                Ok(files) => out.extend(files.into_iter().map(Ok)),
                Err(e) => out.push(Err(e)),
            }
        } else {
            out.push(Ok(input.clone()));
        }
    }
    (out, skipped)
}

/// Paths listed one per line in `list` (`-`: standard input), for `--files-from`; blank
/// lines are ignored.
pub fn read_list(list: &Path) -> Result<Vec<PathBuf>, InputError> {
    let text = if list == Path::new("-") {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).map(|_| s)
    } else {
        std::fs::read_to_string(list)
    };
    let text = text.map_err(|source| InputError::Read {
        path: list.to_path_buf(),
        source,
    })?;
    Ok(text
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.trim().is_empty())
        .map(PathBuf::from)
        .collect())
}

/// The image and PDF files of `dir`, sorted (with its subfolders' when `recursive`, each
/// folder's files before its subfolders'); other entries are counted in `skipped`.
fn list_folder(
    dir: &Path,
    recursive: bool,
    skipped: &mut usize,
) -> Result<Vec<PathBuf>, InputError> {
    let rd = std::fs::read_dir(dir).map_err(|source| InputError::Folder {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    let (mut files, mut dirs) = (Vec::new(), Vec::new());
    for p in entries {
        if p.is_file() && accepted_extension(&p) {
            files.push(p);
        } else if recursive && p.is_dir() && !p.is_symlink() {
            dirs.push(p);
        } else {
            *skipped += 1;
        }
    }
    for d in dirs {
        files.extend(list_folder(&d, true, skipped)?);
    }
    Ok(files)
}

/// `dir` and every folder below it (not through symbolic links, not hidden ones), sorted.
fn folders_below(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    let base = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let Ok(rd) = std::fs::read_dir(base) else {
        return out;
    };
    let mut subs: Vec<PathBuf> = rd
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| !e.file_name().as_encoded_bytes().starts_with(b"."))
        .map(|e| dir.join(e.file_name()))
        .collect();
    subs.sort();
    for s in subs {
        out.extend(folders_below(&s));
    }
    out
}

/// Files matching `pattern` (wildcards in any component), image and PDF files only, sorted.
fn glob(pattern: &Path) -> Result<Vec<PathBuf>, InputError> {
    use std::path::Component;
    let mut current: Vec<PathBuf> = vec![PathBuf::new()];
    let comps: Vec<Component> = pattern.components().collect();
    for (i, comp) in comps.iter().enumerate() {
        let last = i + 1 == comps.len();
        let part = comp.as_os_str().to_string_lossy();
        if part == "**" {
            // Any number of folders (none too); as the last component, every file below.
            current = current.iter().flat_map(|b| folders_below(b)).collect();
            if last {
                current = current
                    .iter()
                    .flat_map(|d| list_folder(d, false, &mut 0).unwrap_or_default())
                    .collect();
            }
            continue;
        }
        if !matches!(comp, Component::Normal(_)) || !part.contains(['*', '?', '[', '{']) {
            current = current
                .iter()
                .map(|base| base.join(comp.as_os_str()))
                .collect();
            continue;
        }
        let matcher = component_matcher(&part).map_err(|e| InputError::Pattern {
            pattern: pattern.display().to_string(),
            reason: e.kind().to_string(),
        })?;
        let mut next = Vec::new();
        for base in &current {
            let dir = if base.as_os_str().is_empty() {
                Path::new(".")
            } else {
                base.as_path()
            };
            let Ok(rd) = std::fs::read_dir(dir) else {
                continue;
            };
            for e in rd.filter_map(Result::ok) {
                let name = e.file_name();
                // Like shells, a wildcard does not match a leading dot unless the pattern has one.
                if name.as_encoded_bytes().starts_with(b".") && !part.starts_with('.') {
                    continue;
                }
                if matcher.is_match(Path::new(&name)) {
                    let p = base.join(&name);
                    if last || p.is_dir() {
                        next.push(p);
                    }
                }
            }
        }
        current = next;
    }
    let mut files: Vec<PathBuf> = current
        .into_iter()
        .filter(|p| p.is_file() && accepted_extension(p))
        .collect();
    files.sort();
    files.dedup();
    Ok(files)
}

/// The matcher for one path component of a pattern (see the module documentation):
/// [`globset`] syntax with wildcards that never cross a `/`, unclosed `[` taken literally
/// and backslashes as ordinary characters (file names may contain them; `[*]` escapes).
/// Fails on a malformed pattern such as `[z-a]` or an unclosed `{`.
pub fn component_matcher(pattern: &str) -> Result<globset::GlobMatcher, globset::Error> {
    Ok(globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(false)
        .allow_unclosed_class(true)
        .build()?
        .compile_matcher())
}

/// What a document is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DocKind {
    /// An image file: one page.
    Image,
    /// A PDF with this many pages.
    Pdf {
        /// Number of pages.
        pages: usize,
    },
}

/// One input file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    /// The file.
    pub path: PathBuf,
    /// Image or PDF.
    pub kind: DocKind,
    /// The PDF pages to read (0-based, in order) when `--pages` chose some; else all.
    selected: Option<Vec<usize>>,
}

impl Document {
    /// Classifies `path` (see the module documentation); a PDF is opened in this process to
    /// count its pages, which refuses encrypted, damaged, empty and over-long ones. Images are
    /// not read yet.
    pub fn open(path: &Path, pdfium: Option<&Path>) -> Result<Self, InputError> {
        Self::open_with(path, &PdfReader::InProcess(pdfium.map(Path::to_path_buf)))
    }

    /// Like [`Document::open`], opening a PDF with `reader`.
    pub fn open_with(path: &Path, reader: &PdfReader) -> Result<Self, InputError> {
        let read_err = |source| InputError::Read {
            path: path.to_path_buf(),
            source,
        };
        let mut head = Vec::with_capacity(1024);
        std::fs::File::open(path)
            .and_then(|f| f.take(1024).read_to_end(&mut head))
            .map_err(read_err)?;
        let pdf_ext = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("pdf"));
        let kind = if pdf::is_pdf(&head) || pdf_ext {
            let bytes = std::fs::read(path).map_err(read_err)?;
            let doc = reader.open(bytes, &path.display().to_string())?;
            DocKind::Pdf {
                pages: doc.page_count(),
            }
        } else {
            DocKind::Image
        };
        Ok(Self {
            path: path.to_path_buf(),
            kind,
            selected: None,
        })
    }

    /// Reads only the pages `ranges` selects of a PDF (an image is always read whole). Fails,
    /// naming the file and its page count, when a page is past the end.
    pub fn select(&mut self, ranges: &PageRanges) -> Result<(), InputError> {
        if let DocKind::Pdf { pages } = self.kind {
            self.selected = Some(ranges.select(pages, &self.path.display().to_string())?);
        }
        Ok(())
    }

    /// Number of pages to read (1 for an image; a PDF's selected pages, else all).
    pub fn pages(&self) -> usize {
        match (&self.kind, &self.selected) {
            (DocKind::Image, _) => 1,
            (DocKind::Pdf { .. }, Some(s)) => s.len(),
            (DocKind::Pdf { pages }, None) => *pages,
        }
    }

    /// The 0-based index in the file of the `i`-th page read.
    pub fn page_index(&self, i: usize) -> usize {
        match (&self.selected, self.kind) {
            // Past the selection: past the end of the file too, which rendering reports.
            (Some(s), DocKind::Pdf { pages }) => s.get(i).copied().unwrap_or(pages + i - s.len()),
            _ => i,
        }
    }

    /// The 1-based page number in the file of the `i`-th page read (what output shows).
    pub fn page_number(&self, i: usize) -> usize {
        self.page_index(i) + 1
    }

    /// How messages name page `page` (0-based): the file, plus the page number for a PDF.
    pub fn page_name(&self, page: usize) -> String {
        match self.kind {
            DocKind::Image => self.path.display().to_string(),
            DocKind::Pdf { .. } => format!("{}: page {}", self.path.display(), page + 1),
        }
    }
}

/// Loads pages on demand, keeping the PDF being read open (and only that one).
pub struct PageLoader {
    reader: PdfReader,
    max_pixels: u64,
    open: Option<(PathBuf, OpenPdf)>,
}

impl PageLoader {
    /// PDFs rendered in this process. `pdfium`: explicit library path; `max_pixels`: image
    /// budget (see [`preprocess::load_image`]).
    pub fn new(pdfium: Option<PathBuf>, max_pixels: u64) -> Self {
        Self::with_reader(PdfReader::InProcess(pdfium), max_pixels)
    }

    /// PDFs read with `reader` (e.g. a sandboxed one).
    pub fn with_reader(reader: PdfReader, max_pixels: u64) -> Self {
        Self {
            reader,
            max_pixels,
            open: None,
        }
    }

    /// The `index`-th page read (0-based; see [`Document::page_index`]) of `doc` as RGB, as
    /// the model reads it. Moving on to another document closes the PDF held so far.
    pub fn load(&mut self, doc: &Document, index: usize) -> Result<RgbImage, InputError> {
        self.load_sized(doc, index, false)
    }

    /// Like [`PageLoader::load`], at full resolution: an image as it is (after its EXIF
    /// orientation), a PDF page rendered at [`pdf::PDF_DPI`] without the model's side cap
    /// (within the pixel budget): what figures are cropped from.
    pub fn load_full(&mut self, doc: &Document, index: usize) -> Result<RgbImage, InputError> {
        self.load_sized(doc, index, true)
    }

    fn load_sized(
        &mut self,
        doc: &Document,
        index: usize,
        full: bool,
    ) -> Result<RgbImage, InputError> {
        if self.open.as_ref().is_some_and(|(p, _)| p != &doc.path) {
            self.open = None;
        }
        match doc.kind {
            DocKind::Image => Ok(preprocess::load_image(&doc.path, self.max_pixels)?),
            DocKind::Pdf { .. } => {
                if self.open.is_none() {
                    let bytes = std::fs::read(&doc.path).map_err(|source| InputError::Read {
                        path: doc.path.clone(),
                        source,
                    })?;
                    let name = doc.path.display().to_string();
                    let pdf = self.reader.open(bytes, &name)?;
                    self.open = Some((doc.path.clone(), pdf));
                }
                let (_, pdf) = self.open.as_mut().expect("opened above");
                let i = doc.page_index(index);
                Ok(if full {
                    pdf.render_page_full(i, self.max_pixels)?
                } else {
                    pdf.render_page(i)?
                })
            }
        }
    }

    /// Closes the PDF held, if any.
    pub fn close(&mut self) {
        self.open = None;
    }
}

/// What separates page `page` (1-based, ≥ 2) from the page before it, in markdown files,
/// plain-text output and the server's `/v1/ocr` answers: a blank line, an HTML comment
/// naming the page (invisible when the markdown is rendered, unlike `---`, which OCR output
/// may itself contain), a blank line.
pub fn page_separator(page: usize) -> String {
    format!("\n\n<!-- page {page} -->\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_partition_any_listing_by_file_name() {
        let names: Vec<PathBuf> = (0..500)
            .map(|i| PathBuf::from(format!("scan-{i:04}.pdf")))
            .collect();
        let shards: Vec<Shard> = (0..7).map(|k| format!("{k}/7").parse().unwrap()).collect();
        let mut sizes = vec![0usize; 7];
        for n in &names {
            let owners: Vec<usize> = (0..7).filter(|k| shards[*k].contains(n)).collect();
            assert_eq!(owners.len(), 1, "{} in shards {owners:?}", n.display());
            sizes[owners[0]] += 1;
            // Where the folder is mounted, or what it is called, changes nothing.
            let moved = Path::new("/mnt/other/renamed").join(n);
            assert!(shards[owners[0]].contains(&moved));
        }
        assert!(sizes.iter().all(|s| *s > 40), "unbalanced: {sizes:?}");
        for bad in ["4/4", "1", "a/2", "0/0", "-1/3"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
    }

    #[test]
    fn wildcards_match_like_a_shell() {
        let m = |p: &str, n: &str| component_matcher(p).unwrap().is_match(n);
        assert!(m("*.pdf", "scan.pdf"));
        assert!(m("*.pdf", ".pdf"));
        assert!(!m("*.pdf", "scan.pdf.png"));
        assert!(m("page-??.png", "page-01.png"));
        assert!(!m("page-??.png", "page-1.png"));
        assert!(m("*a*b*", "xxaYYbzz"));
        assert!(!m("*a*b", "xxaYYbzz"));
        assert!(m("[ab]*", "b7"));
        assert!(!m("[!ab]*", "b7"));
        assert!(m("p[0-9][0-9]", "p42"));
        assert!(!m("p[0-9]", "px"));
        assert!(m("[]]x", "]x"));
        assert!(m("a[b", "a[b"), "an unclosed class is literal");
        assert!(m("*", ""));
        assert!(!m("?", ""));
        // What globset adds, and what it must not change.
        assert!(m("scan-{a,b}.pdf", "scan-b.pdf"));
        assert!(!m("scan-{a,b}.pdf", "scan-c.pdf"));
        assert!(m("p[[:digit:]]", "p7"));
        assert!(m("[*]x", "*x") && !m("[*]x", "ax"));
        assert!(m(r"a\*", r"a\b"), "a backslash is an ordinary character");
        assert!(
            !m("*", "a/b") && !m("a?b", "a/b"),
            "wildcards do not cross a /"
        );
        assert!(m("**", "x") && m("a**b", "ab"));
        assert!(component_matcher("[z-a]").is_err());
        assert!(component_matcher("{a,b").is_err());
    }

    #[test]
    fn folders_and_patterns_expand_sorted_and_filtered() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        for f in [
            "b.pdf",
            "a.PNG",
            "c.txt",
            "d.jpg",
            ".hidden.pdf",
            "sub/e.pdf",
            "sub/f.pdf",
        ] {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, b"x").unwrap();
        }
        let ok = |v: Vec<Result<PathBuf, InputError>>| -> Vec<String> {
            v.into_iter()
                .map(|r| {
                    let p = r.unwrap();
                    p.strip_prefix(root).unwrap().display().to_string()
                })
                .collect()
        };
        assert_eq!(
            ok(expand(&[root.to_path_buf()])),
            [".hidden.pdf", "a.PNG", "b.pdf", "d.jpg"]
        );
        assert_eq!(ok(expand(&[root.join("*.pdf")])), ["b.pdf"]);
        assert_eq!(
            ok(expand(&[root.join("*/?.pdf")])),
            ["sub/e.pdf", "sub/f.pdf"]
        );
        assert_eq!(ok(expand(&[root.join("[a-b].*")])), ["a.PNG", "b.pdf"]);
        // Explicit files are kept whatever their extension; order is preserved.
        assert_eq!(
            ok(expand(&[root.join("c.txt"), root.join("sub/e.pdf")])),
            ["c.txt", "sub/e.pdf"]
        );
        let r = expand(&[root.join("*.tiff")]);
        let e = r[0].as_ref().unwrap_err();
        assert!(matches!(e, InputError::NoMatch { .. }));
        assert!(e.to_string().contains("*.tiff"), "{e}");
        // A wildcard only matches a leading dot when the component starts with one.
        assert_eq!(ok(expand(&[root.join(".*.pdf")])), [".hidden.pdf"]);
        assert_eq!(ok(expand(&[root.join("{b,d}.*")])), ["b.pdf", "d.jpg"]);
        let r = expand(&[root.join("[z-a]*.pdf")]);
        let e = r[0].as_ref().unwrap_err();
        assert!(matches!(e, InputError::Pattern { .. }), "{e}");
        assert!(e.to_string().contains("[z-a]*.pdf"), "{e}");
    }

    #[test]
    fn documents_are_classified_by_content_and_extension() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let doc = Document::open(&fixtures.join("pdf/two_pages.pdf"), None).unwrap();
        assert_eq!(doc.kind, DocKind::Pdf { pages: 2 });
        let img = fixtures.join("tiny-lightonocr/images/aligned.png");
        assert_eq!(Document::open(&img, None).unwrap().kind, DocKind::Image);

        // A PDF without the .pdf extension is still a PDF.
        let d = tempfile::tempdir().unwrap();
        let renamed = d.path().join("scan.bin");
        std::fs::copy(fixtures.join("pdf/two_pages.pdf"), &renamed).unwrap();
        assert_eq!(Document::open(&renamed, None).unwrap().pages(), 2);

        for (f, want) in [
            ("pdf/encrypted.pdf", "encrypted"),
            ("pdf/truncated.pdf", "damaged"),
        ] {
            let p = fixtures.join(f);
            let e = Document::open(&p, None).unwrap_err().to_string();
            assert!(
                e.contains(&p.display().to_string()) && e.contains(want),
                "{e}"
            );
        }
        let e = Document::open(Path::new("/nonexistent/x.png"), None).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/x.png"), "{e}");
    }

    #[test]
    fn the_loader_renders_pages_and_switches_documents() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let pdf = Document::open(&fixtures.join("pdf/two_pages.pdf"), None).unwrap();
        let img =
            Document::open(&fixtures.join("tiny-lightonocr/images/aligned.png"), None).unwrap();
        let mut l = PageLoader::new(None, preprocess::DEFAULT_MAX_PIXELS);
        assert_eq!(l.load(&pdf, 1).unwrap().dimensions(), (1540, 82));
        assert_eq!(l.load(&pdf, 0).unwrap().dimensions(), (224, 56));
        assert_eq!(l.load(&img, 0).unwrap().dimensions(), (224, 56));
        assert!(
            l.open.is_none(),
            "the PDF is closed once the loader moves on"
        );
        let e = l.load(&pdf, 2).unwrap_err().to_string();
        assert!(e.contains("two_pages.pdf: page 3"), "{e}");
    }

    #[test]
    fn a_page_selection_reads_only_those_pages() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let path = fixtures.join("pdf/two_pages.pdf");
        let mut pdf = Document::open(&path, None).unwrap();
        pdf.select(&"2-".parse().unwrap()).unwrap();
        assert_eq!((pdf.pages(), pdf.page_number(0)), (1, 2));
        let mut l = PageLoader::new(None, preprocess::DEFAULT_MAX_PIXELS);
        // Page 2 of the file (1540 x 82), not page 1 (224 x 56).
        assert_eq!(l.load(&pdf, 0).unwrap().dimensions(), (1540, 82));
        let e = l.load(&pdf, 1).unwrap_err().to_string();
        assert!(e.contains("two_pages.pdf: page 3"), "{e}");

        let mut pdf = Document::open(&path, None).unwrap();
        let e = pdf.select(&"1,3".parse().unwrap()).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{}: pages 1,3: page 3 is past the end (the document has 2 pages)",
                path.display()
            )
        );
        // An image is one page whatever the selection.
        let mut img =
            Document::open(&fixtures.join("tiny-lightonocr/images/aligned.png"), None).unwrap();
        img.select(&"2-3".parse().unwrap()).unwrap();
        assert_eq!((img.pages(), img.page_number(0)), (1, 1));
    }
}
