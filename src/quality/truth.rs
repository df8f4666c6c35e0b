//! Pages and their expected texts for `ocrctl eval --truth DIR`.
//!
//! `DIR` holds pages as `ocrctl ocr` reads a folder (images and PDFs, by extension, sorted;
//! see [`crate::documents::inputs`]) and beside each one its expected text: `NAME.txt` or
//! `NAME.md` for `NAME.png` / `NAME.pdf` (one of them: both is an error). A PDF's text holds
//! all its pages separated by lines `<!-- page N -->`, the marker `ocrctl ocr --out` writes
//! ([`page_separator`](crate::documents::inputs::page_separator)), so a corrected `ocr --out`
//! file is a truth file; its number of parts must equal the PDF's pages. A page without its
//! text, or a text that does not fit, is a [`TruthError`] naming the file; the other pages
//! still count.

use crate::documents::inputs::{self, Document, InputError};
use std::path::{Path, PathBuf};

/// A page file whose expected text is missing or unusable, or a folder that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum TruthError {
    /// The folder, or a page file, could not be read.
    #[error(transparent)]
    Input(#[from] InputError),
    /// No `NAME.txt` / `NAME.md` beside a page file.
    #[error(
        "{page}: no expected text beside it ({stem}.txt or {stem}.md); the page is not scored"
    )]
    Missing { page: PathBuf, stem: String },
    /// Both `NAME.txt` and `NAME.md` exist.
    #[error("{page}: two expected texts, {txt} and {md}; keep one")]
    Ambiguous {
        page: PathBuf,
        txt: PathBuf,
        md: PathBuf,
    },
    /// The expected text could not be read (or is not UTF-8).
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A PDF's expected text has another number of pages than the PDF.
    #[error(
        "{truth}: {parts} page(s) (separated by `<!-- page N -->` lines) but {page} has {pages}"
    )]
    PageCount {
        truth: PathBuf,
        parts: usize,
        page: PathBuf,
        pages: usize,
    },
}

/// A document and the expected text of each of its pages.
#[derive(Debug, Clone)]
pub struct TruthDoc {
    pub doc: Document,
    /// The `.txt` or `.md` file.
    pub truth: PathBuf,
    /// One text per page of `doc`.
    pub pages: Vec<String>,
}

/// What [`load`] found: the documents that can be scored, and every page file that cannot.
#[derive(Debug, Default)]
pub struct TruthSet {
    pub docs: Vec<TruthDoc>,
    pub problems: Vec<TruthError>,
}

impl TruthSet {
    /// Pages to score.
    pub fn pages(&self) -> usize {
        self.docs.iter().map(|d| d.pages.len()).sum()
    }
}

/// Reads the pages of `dir` and their expected texts. Fails only when `dir` cannot be listed
/// or holds no page; each page file that cannot be used is a problem in the set.
pub fn load(dir: &Path, pdfium: Option<&Path>) -> Result<TruthSet, TruthError> {
    if !dir.is_dir() {
        return Err(TruthError::Read {
            path: dir.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "not a folder"),
        });
    }
    let mut set = TruthSet::default();
    for item in inputs::expand(&[dir.to_path_buf()]) {
        let path = item?;
        match load_doc(&path, pdfium) {
            Ok(d) => set.docs.push(d),
            Err(e) => set.problems.push(e),
        }
    }
    Ok(set)
}

fn load_doc(path: &Path, pdfium: Option<&Path>) -> Result<TruthDoc, TruthError> {
    let truth = truth_file(path)?;
    let text = std::fs::read_to_string(&truth).map_err(|source| TruthError::Read {
        path: truth.clone(),
        source,
    })?;
    let doc = Document::open(path, pdfium)?;
    let pages = split_pages(&text);
    if pages.len() != doc.pages() {
        return Err(TruthError::PageCount {
            truth,
            parts: pages.len(),
            page: path.to_path_buf(),
            pages: doc.pages(),
        });
    }
    Ok(TruthDoc { doc, truth, pages })
}

/// `NAME.txt` or `NAME.md` beside `page`.
fn truth_file(page: &Path) -> Result<PathBuf, TruthError> {
    let (txt, md) = (page.with_extension("txt"), page.with_extension("md"));
    match (txt.is_file(), md.is_file()) {
        (true, false) => Ok(txt),
        (false, true) => Ok(md),
        (true, true) => Err(TruthError::Ambiguous {
            page: page.to_path_buf(),
            txt,
            md,
        }),
        (false, false) => Err(TruthError::Missing {
            page: page.to_path_buf(),
            stem: page
                .with_extension("")
                .file_name()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
        }),
    }
}

/// `text` split at lines that are a page marker (`<!-- page N -->`, any N, spaces around).
pub fn split_pages(text: &str) -> Vec<String> {
    let mut pages = vec![String::new()];
    for line in text.split_inclusive('\n') {
        if is_marker(line.trim()) {
            pages.push(String::new());
        } else {
            pages.last_mut().expect("never empty").push_str(line);
        }
    }
    pages
}

fn is_marker(line: &str) -> bool {
    line.strip_prefix("<!--")
        .and_then(|s| s.strip_suffix("-->"))
        .and_then(|s| s.trim().strip_prefix("page"))
        .is_some_and(|n| {
            let n = n.trim();
            !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::documents::inputs::page_separator;

    #[test]
    fn a_pdfs_text_splits_at_the_marker_ocr_writes() {
        let md = format!("one\ntwo{}three\n", page_separator(2));
        assert_eq!(split_pages(&md), ["one\ntwo\n\n", "\nthree\n"]);
        assert_eq!(split_pages("no marker"), ["no marker"]);
        assert_eq!(split_pages("a\n  <!--page 3-->  \nb").len(), 2);
        // Not markers: other comments, text on the same line.
        assert_eq!(
            split_pages("<!-- page -->\n<!-- note -->\nx <!-- page 2 -->").len(),
            1
        );
    }

    #[test]
    fn pages_find_their_texts_and_missing_ones_are_named() {
        let d = tempfile::tempdir().unwrap();
        let img = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/tiny-lightonocr/images/aligned.png");
        for name in ["a.png", "b.png", "c.png", "e.v1.png"] {
            std::fs::copy(&img, d.path().join(name)).unwrap();
        }
        std::fs::write(d.path().join("a.txt"), "alpha").unwrap();
        std::fs::write(d.path().join("b.md"), "# beta").unwrap();
        std::fs::write(d.path().join("e.v1.md"), "x\n<!-- page 2 -->\ny").unwrap();
        std::fs::write(d.path().join("e.v1.txt"), "x").unwrap();
        let set = load(d.path(), None).unwrap();
        let texts: Vec<_> = set.docs.iter().map(|t| t.pages.clone()).collect();
        assert_eq!(
            texts,
            [vec!["alpha".to_string()], vec!["# beta".to_string()]]
        );
        let problems: Vec<String> = set.problems.iter().map(|e| e.to_string()).collect();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("c.png") && problems[0].contains("c.txt or c.md"));
        assert!(problems[1].contains("e.v1.txt") && problems[1].contains("e.v1.md"));
        assert!(matches!(set.problems[0], TruthError::Missing { .. }));

        std::fs::remove_file(d.path().join("e.v1.txt")).unwrap();
        let set = load(d.path(), None).unwrap();
        let e = set.problems[1].to_string();
        assert!(
            e.contains("2 page(s)") && e.contains("e.v1.png has 1"),
            "{e}"
        );
        assert!(load(&d.path().join("nowhere"), None).is_err());
    }
}
