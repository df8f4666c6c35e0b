//! Where an export is written: the output folder checked, a staging folder beside it
//! (stale ones of dead exports removed), the manifest written last, and the staging folder
//! swapped into place, so a folder is either the old export or the new one.

use super::*;

/// Removes `.NAME.partial-PID` directories next to `out` left by exports whose process is
/// gone (killed mid-way: nothing else would ever remove their gigabytes).
pub(super) fn remove_stale_partials(parent: &Path, name: &str) {
    let prefix = format!(".{name}.partial-");
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let file_name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = file_name
            .strip_prefix(&prefix)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !process_alive(pid) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Whether process `pid` still runs (Linux: `/proc/PID`; elsewhere assume it does).
pub(super) fn process_alive(pid: u32) -> bool {
    if Path::new("/proc/self").exists() {
        Path::new(&format!("/proc/{pid}")).exists()
    } else {
        true
    }
}

/// Removes the temporary directory unless the export completed.
pub(super) struct TempDir(pub(super) PathBuf, pub(super) bool);

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.1 {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Refuses an export of no precision, and an `out` that exists unless `force` is set and it
/// is an earlier export.
pub(super) fn check_out(opts: &ExportOptions) -> Result<(), ExportError> {
    if opts.precisions.is_empty() {
        return Err(ExportError::Invalid("no precision requested".into()));
    }
    if opts.out.exists() && !opts.force {
        return Err(ExportError::Invalid(format!(
            "{}: already exists (use --force to replace it)",
            opts.out.display()
        )));
    }
    // --force replaces an earlier export, never some other directory (or a file).
    if opts.out.exists() && !opts.out.join(MANIFEST).is_file() {
        return Err(ExportError::Invalid(format!(
            "{}: exists and is not an ocrctl export (it has no {MANIFEST}); --force only \
             replaces an earlier export: choose another --out or remove it yourself",
            opts.out.display()
        )));
    }
    // Nor one whose manifest is not an ocrctl manifest (a planted `{}` would make any folder
    // look like an export).
    if opts.out.exists() {
        if let Err(e) = Manifest::load(&opts.out) {
            return Err(ExportError::Invalid(format!(
                "{e}; --force only replaces an earlier export: choose another --out or remove \
                 it yourself"
            )));
        }
    }
    Ok(())
}

/// `out`'s parent folder (created) and its own name.
pub(super) fn out_parent_and_name(opts: &ExportOptions) -> Result<(PathBuf, String), ExportError> {
    let parent = opts
        .out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| ExportError::io(parent, e))?;
    let name = opts.out.file_name().ok_or_else(|| {
        ExportError::Invalid(format!(
            "{}: not a usable output directory",
            opts.out.display()
        ))
    })?;
    Ok((parent.to_path_buf(), name.to_string_lossy().into_owned()))
}

/// A fresh `.<name>.partial-<pid>` beside `out` with its `onnx/` folder (earlier processes'
/// partial exports removed), deleted again unless the export completes.
pub(super) fn staging_dir(parent: &Path, name: &str) -> Result<TempDir, ExportError> {
    remove_stale_partials(parent, name);
    let tmp_path = parent.join(format!(".{name}.partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp_path);
    let onnx_dir = tmp_path.join("onnx");
    std::fs::create_dir_all(&onnx_dir).map_err(|e| ExportError::io(&onnx_dir, e))?;
    Ok(TempDir(tmp_path, false))
}

/// Adapts the processor config to the graphs, lists every file's digest in the manifest and
/// writes it into `tmp_path`.
pub(super) fn write_manifest(
    tmp_path: &Path,
    mut manifest: Manifest,
) -> Result<Manifest, ExportError> {
    let all: Vec<(Precision, &GraphInfo)> = manifest
        .graphs
        .iter()
        .flat_map(|(p, parts)| parts.values().map(move |g| (*p, g)))
        .collect();
    crate::processor::adapt_config(tmp_path, manifest.model.image_token_id, &all)?;
    manifest.files = crate::verify::digest_tree(tmp_path, MANIFEST)?;
    let mpath = tmp_path.join(MANIFEST);
    let text = serde_json::to_string_pretty(&manifest).expect("manifest serialises");
    std::fs::write(&mpath, text).map_err(|e| ExportError::io(&mpath, e))?;
    Ok(manifest)
}

/// Renames the finished export to `out`: the old export (with --force) is removed only after
/// the new one is in.
pub(super) fn swap_into_place(
    opts: &ExportOptions,
    parent: &Path,
    name: &str,
    tmp: &mut TempDir,
) -> Result<(), ExportError> {
    let old = parent.join(format!(".{name}.old-{}", std::process::id()));
    let had_old = opts.out.exists();
    if had_old {
        std::fs::rename(&opts.out, &old).map_err(|e| ExportError::io(&opts.out, e))?;
    }
    std::fs::rename(&tmp.0, &opts.out).map_err(|e| ExportError::io(&opts.out, e))?;
    tmp.1 = true;
    if had_old {
        let _ = std::fs::remove_dir_all(&old);
    }
    Ok(())
}
