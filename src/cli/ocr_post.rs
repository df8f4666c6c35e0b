//! `ocrctl ocr`'s page post-processing: `--figures` (crops of the bbox models' boxed figures,
//! [`ocrctl::output::figures`]) and `--tables` ([`ocrctl::output::tables`]).
//!
//! A page whose text holds a boxed image reference is loaded again at full resolution (a
//! loader of its own, so that reading the next pages keeps its PDF open), each box cropped
//! to `DIR/<stem>/page-P-figure-N.png` and its link rewritten: relative to the markdown file
//! when the figures go beside it (`--out DIR --figures`), else the file's path. With
//! `--json` each page carries `figures` (the box in page pixels, the file) and
//! `page_pixels`. A crop that cannot be written fails the page.

use clap::Args;
use ocrctl::documents::inputs::{Document, PageLoader};
use ocrctl::output::figures::{self, Figure};
use ocrctl::output::tables::{self, TableFormat};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The post-processing flags of `ocrctl ocr`.
#[derive(Args, Debug)]
pub struct PostArgs {
    /// Crop the figures that the bbox models (LightOnOCR-2-1B-bbox) write as
    /// `![image](image_N.png) x1,y1,x2,y2` from the full-resolution page into
    /// `DIR/<file stem>/page-P-figure-N.png` and link them; DIR is --out's unless given as
    /// `--figures=DIR` (needed with --json or plain text).
    #[arg(long, value_name = "DIR", num_args = 0..=1, require_equals = true)]
    figures: Option<Option<PathBuf>>,
    /// Write tables as `markdown` (pipe tables where they fit, HTML for spanned cells) or
    /// `html` (pipe tables made HTML); default: as the model wrote them.
    #[arg(long, value_name = "html|markdown")]
    tables: Option<TableFormat>,
}

/// Post-processing of a run's pages, as the flags asked.
pub struct Post {
    /// Where crops go (`DIR`, under which each document has its folder).
    figures: Option<PathBuf>,
    /// Links are `<stem>/page-P-figure-N.png` (beside the markdown file) rather than paths.
    relative_links: bool,
    tables: Option<TableFormat>,
    loader: Mutex<PageLoader>,
}

impl PostArgs {
    /// The post-processing to run; `out` is `--out`. Fails when `--figures` has no folder.
    pub fn resolve(
        &self,
        out: Option<&Path>,
        pdfium: Option<PathBuf>,
        max_pixels: u64,
    ) -> anyhow::Result<Post> {
        let figures = match (&self.figures, out) {
            (Some(None), Some(out)) => Some(out.to_path_buf()),
            (Some(None), None) => anyhow::bail!(
                "--figures needs a folder to write the crops to: give --out DIR (they go to \
                 DIR/<file stem>/) or --figures=DIR"
            ),
            (Some(Some(d)), _) => Some(d.clone()),
            (None, _) => None,
        };
        if let Some(d) = &figures {
            std::fs::create_dir_all(d)
                .map_err(|e| anyhow::anyhow!("--figures {}: {e}", d.display()))?;
        }
        Ok(Post {
            relative_links: figures.is_some() && figures.as_deref() == out,
            figures,
            tables: self.tables,
            loader: Mutex::new(PageLoader::new(pdfium, max_pixels)),
        })
    }
}

impl Post {
    /// Page `page` (0-based, read order) of `doc`, named `name` in errors, with its figures
    /// cropped and written and its tables converted; with `--figures`, the JSON fields to add
    /// to the page's object (`figures`, and `page_pixels` when the page was loaded).
    pub fn apply(
        &self,
        doc: &Document,
        page: usize,
        name: &str,
        text: String,
    ) -> Result<(String, Option<Value>), String> {
        let (text, fields) = match &self.figures {
            Some(dir) if figures::has_figures(&text) => {
                let (text, figs, size) = self.crop(dir, doc, page, name, &text)?;
                (text, Some(json!({"figures": figs, "page_pixels": size})))
            }
            Some(_) => (text, Some(json!({"figures": []}))),
            None => (text, None),
        };
        let text = match self.tables {
            Some(f) => tables::convert(&text, f),
            None => text,
        };
        Ok((text, fields))
    }

    /// Crops the figures of `text` from the page loaded at full resolution into
    /// `dir/<stem>/`; the rewritten text, the figures (with their files) and the page's size.
    fn crop(
        &self,
        dir: &Path,
        doc: &Document,
        page: usize,
        name: &str,
        text: &str,
    ) -> Result<(String, Vec<Figure>, [u32; 2]), String> {
        let img = self
            .loader
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .load_full(doc, page)
            .map_err(|e| format!("{name}: loading the page for its figures: {e}"))?;
        let stem = crate::cli::ocr_output::stem(&doc.path);
        let number = doc.page_number(page);
        let folder = dir.join(&stem);
        let file = |n| folder.join(figures::file_name(number, n));
        let mut got = figures::crop_figures(text, &img, |n| {
            if self.relative_links {
                format!("{stem}/{}", figures::file_name(number, n))
            } else {
                file(n).display().to_string()
            }
        });
        for f in &mut got.figures {
            let Some(crop) = f.crop.take() else { continue };
            let path = file(f.figure);
            let written = std::fs::create_dir_all(&folder)
                .map_err(|e| e.to_string())
                .and_then(|()| figures::png_bytes(&crop).map_err(|e| e.to_string()))
                .and_then(|png| std::fs::write(&path, png).map_err(|e| e.to_string()));
            written.map_err(|e| {
                format!(
                    "{name}: figure {}: cannot write {}: {e}",
                    f.figure,
                    path.display()
                )
            })?;
            f.file = Some(path.display().to_string());
        }
        Ok((got.text, got.figures, [img.width(), img.height()]))
    }
}
