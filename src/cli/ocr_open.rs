//! `ocrctl ocr`'s documents: its inputs expanded (files, folders, patterns, `--files-from`),
//! sharded, checked against `--out` (`--resume` skips finished documents, two inputs may not
//! write one file) and opened, each failure named and recorded.

use crate::cli::ocr::OcrArgs;
use crate::cli::ocr_outcome::{error_row, input_name, Failures};
use crate::cli::ocr_output::md_path;
use anyhow::Context;
use ocrctl::documents::inputs::{self, Document};
use ocrctl::generation::outcome;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Expands the inputs and opens every document, reporting (and recording) those that fail;
/// with `--json`, a row for each file that fails. With `--out --resume`, documents whose
/// markdown file exists and is complete (no failed page marked) are skipped (and counted).
/// Also returns the folder entries not read (other files; subfolders without `--recursive`).
pub fn open_documents(a: &OcrArgs) -> anyhow::Result<(Vec<Document>, Failures, usize, usize)> {
    // Pages are counted in worker processes too: a document can blow up while it opens.
    let reader = a.pdf.reader(a.pdfium_lib.clone());
    let (mut docs, mut failed, mut skipped, mut overwritten) =
        (Vec::new(), Failures::default(), 0, 0);
    let file_failed = |failed: &mut Failures, path: &Path, msg: String| {
        eprintln!("error: {msg}");
        if a.json && a.out.is_none() {
            println!("{}", error_row(path, None, &msg, 0));
        }
        failed.input(&path.display().to_string(), &msg);
    };
    let mut md_owner: HashMap<PathBuf, PathBuf> = HashMap::new();
    let mut listed = a.inputs.clone();
    if let Some(f) = &a.files_from {
        listed.extend(inputs::read_list(f).context("--files-from")?);
    }
    let (items, not_read) = inputs::expand_counted(&listed, a.recursive);
    for item in items {
        let path = match item {
            Ok(p) => p,
            Err(e) => {
                eprintln!("error: {e}");
                failed.input(&input_name(&e), &e.to_string());
                continue;
            }
        };
        if a.shard.is_some_and(|s| !s.contains(&path)) {
            continue;
        }
        if let Some(dir) = &a.out {
            let md = md_path(dir, &path);
            // A finished file holds at least a newline: an empty one (a crash before the
            // data reached the disk) is not a finished document.
            if std::fs::metadata(&md).is_ok_and(|m| m.len() > 0) {
                if a.resume && !partial(&md) {
                    skipped += 1;
                    continue;
                }
                overwritten += usize::from(!a.resume);
            }
            if let Some(other) = md_owner.get(&md) {
                let msg = format!(
                    "{}: its output {} is already that of {}; rename one of them",
                    path.display(),
                    md.display(),
                    other.display()
                );
                file_failed(&mut failed, &path, msg);
                continue;
            }
            md_owner.insert(md, path.clone());
        }
        let opened = Document::open_with(&path, &reader).and_then(|mut d| {
            a.pages.as_ref().map_or(Ok(()), |r| d.select(r))?;
            Ok(d)
        });
        match opened {
            Ok(d) => docs.push(d),
            Err(e) => file_failed(&mut failed, &path, e.to_string()),
        }
    }
    if overwritten > 0 {
        eprintln!(
            "note: {overwritten} existing .md file(s) in {} will be replaced (--resume skips them)",
            a.out.as_deref().unwrap_or(Path::new(".")).display()
        );
    }
    Ok((docs, failed, skipped, not_read))
}

/// Whether the markdown file at `md` is a partial document (`--keep-partial`), which
/// `--resume` does again.
fn partial(md: &Path) -> bool {
    std::fs::read_to_string(md).is_ok_and(|t| outcome::has_failed_marker(&t))
}
