//! sha256 of every file an export wrote, recorded in `ocrctl.json` and checked before a
//! model is loaded, so that a damaged export (a flipped byte or NaNs in `.onnx_data`, a
//! truncated copy) is refused with the file's name instead of answering garbage.
//!
//! Files are hashed in parallel, one thread per core pulling the next file, largest first,
//! so that one large `.onnx_data` does not end up last on a single thread.
//!
//! ```no_run
//! use ocrctl_exporters::export::Manifest;
//! use ocrctl_exporters::verify::verify;
//! let dir = std::path::Path::new("out/model");
//! let m = Manifest::load(dir)?;
//! let report = verify(dir, &m.files, |_| true)?;
//! println!("{} files, {} bytes in {:?}", report.files, report.bytes, report.elapsed);
//! # Ok::<(), ocrctl_exporters::ExportError>(())
//! ```

use crate::export::SourceFile;
use crate::ExportError;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What [`verify`] checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifyReport {
    pub files: usize,
    pub bytes: u64,
    pub elapsed: Duration,
}

/// sha256 and size of `path`, named `name` in the result.
pub fn digest_file(path: &Path, name: String) -> Result<SourceFile, ExportError> {
    let mut f = std::fs::File::open(path).map_err(|e| ExportError::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(|e| ExportError::io(path, e))?;
        if n == 0 {
            break;
        }
        bytes += n as u64;
        h.update(&buf[..n]);
    }
    Ok(SourceFile {
        name,
        bytes,
        sha256: format!("{:x}", h.finalize()),
    })
}

/// Runs `job` over `items` on one thread per core; the first error wins.
fn parallel<T: Sync, R: Send>(
    items: &[T],
    job: impl Fn(&T) -> Result<R, ExportError> + Sync,
) -> Result<Vec<R>, ExportError> {
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<(usize, R)>> = Mutex::new(Vec::with_capacity(items.len()));
    let err: Mutex<Option<ExportError>> = Mutex::new(None);
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(items.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= items.len() || err.lock().unwrap().is_some() {
                    return;
                }
                match job(&items[i]) {
                    Ok(r) => out.lock().unwrap().push((i, r)),
                    Err(e) => {
                        err.lock().unwrap().get_or_insert(e);
                        return;
                    }
                }
            });
        }
    });
    if let Some(e) = err.into_inner().unwrap() {
        return Err(e);
    }
    let mut out = out.into_inner().unwrap();
    out.sort_by_key(|(i, _)| *i);
    Ok(out.into_iter().map(|(_, r)| r).collect())
}

/// Every file under `root` but `skip` (relative, `/`-separated names), hashed in parallel,
/// in name order.
pub fn digest_tree(root: &Path, skip: &str) -> Result<Vec<SourceFile>, ExportError> {
    let mut found: Vec<(PathBuf, String, u64)> = Vec::new();
    let mut stack = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        for entry in std::fs::read_dir(&dir).map_err(|e| ExportError::io(&dir, e))? {
            let entry = entry.map_err(|e| ExportError::io(&dir, e))?;
            let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
            let meta = entry
                .metadata()
                .map_err(|e| ExportError::io(&entry.path(), e))?;
            if meta.is_dir() {
                stack.push((entry.path(), format!("{name}/")));
            } else if name != skip {
                found.push((entry.path(), name, meta.len()));
            }
        }
    }
    found.sort_by_key(|f| std::cmp::Reverse(f.2));
    let mut files = parallel(&found, |(p, n, _)| digest_file(p, n.clone()))?;
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(files)
}

/// Checks the files of `recorded` that `select` picks against their size and sha256 in
/// `dir`; the error names the first file that is missing, of another size or damaged.
pub fn verify(
    dir: &Path,
    recorded: &[SourceFile],
    select: impl Fn(&str) -> bool,
) -> Result<VerifyReport, ExportError> {
    let t = Instant::now();
    let mut todo: Vec<&SourceFile> = recorded.iter().filter(|f| select(&f.name)).collect();
    // Cheap checks first: a wrong size needs no hashing.
    for f in &todo {
        let p = dir.join(&f.name);
        let len = std::fs::metadata(&p)
            .map_err(|e| ExportError::io(&p, e))?
            .len();
        if len != f.bytes {
            return Err(ExportError::Invalid(format!(
                "{}: {len} bytes, the export recorded {} (the file is damaged or was replaced; \
                 export again, or pass --no-verify to load it anyway)",
                p.display(),
                f.bytes
            )));
        }
    }
    todo.sort_by_key(|f| std::cmp::Reverse(f.bytes));
    parallel(&todo, |f| {
        let p = dir.join(&f.name);
        let got = digest_file(&p, f.name.clone())?;
        if got.sha256 != f.sha256 {
            return Err(ExportError::Invalid(format!(
                "{}: sha256 {} does not match the export's record {} (the file is damaged; \
                 export again, or pass --no-verify to load it anyway)",
                p.display(),
                got.sha256,
                f.sha256
            )));
        }
        Ok(())
    })?;
    Ok(VerifyReport {
        files: todo.len(),
        bytes: todo.iter().map(|f| f.bytes).sum(),
        elapsed: t.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flipped_byte_or_a_truncation_is_named() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("onnx")).unwrap();
        std::fs::write(d.path().join("onnx/a.onnx_data"), vec![7u8; 3 << 20]).unwrap();
        std::fs::write(d.path().join("config.json"), b"{}").unwrap();
        std::fs::write(d.path().join("ocrctl.json"), b"{}").unwrap();
        let files = digest_tree(d.path(), "ocrctl.json").unwrap();
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["config.json", "onnx/a.onnx_data"]);
        let r = verify(d.path(), &files, |_| true).unwrap();
        assert_eq!((r.files, r.bytes), (2, (3 << 20) + 2));

        let mut bytes = std::fs::read(d.path().join("onnx/a.onnx_data")).unwrap();
        bytes[(1 << 20) + 5] ^= 1;
        std::fs::write(d.path().join("onnx/a.onnx_data"), &bytes).unwrap();
        let e = verify(d.path(), &files, |_| true).unwrap_err().to_string();
        assert!(
            e.contains("a.onnx_data") && e.contains("does not match"),
            "{e}"
        );
        // Only what is selected is read.
        assert!(verify(d.path(), &files, |n| n == "config.json").is_ok());

        bytes.truncate(100);
        std::fs::write(d.path().join("onnx/a.onnx_data"), &bytes).unwrap();
        let e = verify(d.path(), &files, |_| true).unwrap_err().to_string();
        assert!(e.contains("a.onnx_data") && e.contains("100 bytes"), "{e}");
        std::fs::remove_file(d.path().join("config.json")).unwrap();
        let e = verify(d.path(), &files, |_| true).unwrap_err().to_string();
        assert!(e.contains("config.json"), "{e}");
    }
}
