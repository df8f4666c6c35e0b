//! Finding and loading the ONNX Runtime shared library (`load-dynamic`).
//!
//! ocrctl links nothing at build time; it looks for `libonnxruntime.so.*` from the PyPI
//! wheel (`onnxruntime==1.31.1`, or `onnxruntime-gpu`) in this order:
//! 1. `--ort-lib PATH` / `OCRCTL_ORT_LIB` (explicit; must exist),
//! 2. next to the `ocrctl` executable,
//! 3. `.venv/lib/python3*/site-packages/onnxruntime/capi/` in the executable's directory or
//!    any parent (what `scripts/setup.sh` creates), in the current directory or any parent,
//!    then `$VIRTUAL_ENV` (see [`crate::runtime::libsearch`]),
//! 4. the site-packages of `python3` on `PATH` (`import onnxruntime`), and common system
//!    locations (`/usr/local/lib/python3*/…`, `/opt/ortgpu/onnxruntime/capi`).
//!
//! When nothing is found the error lists every place searched and the command that fixes it.

use crate::runtime::libsearch;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Minimum ONNX Runtime version ocrctl is built for (ort's `api-31`).
pub const REQUIRED_ORT: &str = "1.31";

/// Errors finding or loading ONNX Runtime.
#[derive(Debug, thiserror::Error)]
pub enum OrtLibError {
    #[error("ONNX Runtime library not found. Searched:\n  {searched}\nInstall it with `scripts/setup.sh` (creates .venv with onnxruntime=={REQUIRED_ORT}.1) or `pip install onnxruntime=={REQUIRED_ORT}.1`, or pass --ort-lib PATH")]
    NotFound { searched: String },
    #[error("{path}: the ONNX Runtime library given by {origin} does not exist")]
    Missing { path: PathBuf, origin: String },
    #[error("{path}: could not load ONNX Runtime (needs >= {REQUIRED_ORT}): {message}")]
    Load { path: PathBuf, message: String },
}

fn libs_in(dir: &Path) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libonnxruntime.so") || n == "libonnxruntime.dylib")
        })
        .filter(|p| p.is_file())
        .collect();
    // Prefer the versioned name (the wheel ships no plain symlink).
    found.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    found.into_iter().next()
}

/// Where the `onnxruntime` wheel keeps the library, under site-packages.
const WHEEL_SUBDIR: &str = "onnxruntime/capi";

/// Candidate directories in search order (explicit paths excluded): [`libsearch::wheel_dirs`]
/// of the `onnxruntime` wheel, then `/opt/ortgpu` (where the GPU machine recipe unpacks it).
pub fn candidate_dirs() -> Vec<PathBuf> {
    let mut dirs = libsearch::wheel_dirs(WHEEL_SUBDIR);
    dirs.push(PathBuf::from("/opt/ortgpu/onnxruntime/capi"));
    dirs
}

/// Locates the library: an explicit path wins, else the first hit in [`candidate_dirs`].
pub fn find(explicit: Option<&Path>) -> Result<PathBuf, OrtLibError> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(OrtLibError::Missing {
                path: p.to_path_buf(),
                origin: "--ort-lib/OCRCTL_ORT_LIB".into(),
            })
        };
    }
    let dirs = candidate_dirs();
    let mut seen = Vec::new();
    for d in &dirs {
        if let Some(lib) = libs_in(d) {
            match version_of(&lib) {
                Some(v) if v < MIN_VERSION => {
                    seen.push(format!(
                        "{} (too old: {}.{}.{})",
                        lib.display(),
                        v.0,
                        v.1,
                        v.2
                    ));
                    continue;
                }
                _ => return Ok(lib),
            }
        }
        let s = d.display().to_string();
        if !seen.contains(&s) {
            seen.push(s);
        }
    }
    Err(OrtLibError::NotFound {
        searched: seen.join("\n  "),
    })
}

/// Oldest ONNX Runtime ocrctl accepts (ort's `api-31`).
pub const MIN_VERSION: (u32, u32, u32) = (1, 31, 0);

/// The version in a file name such as `libonnxruntime.so.1.31.1`, if present.
pub fn version_of(lib: &Path) -> Option<(u32, u32, u32)> {
    let name = lib.file_name()?.to_str()?;
    let v = name.strip_prefix("libonnxruntime.so.")?;
    let mut it = v.split('.').map(|x| x.parse::<u32>().ok());
    Some((
        it.next()??,
        it.next().flatten().unwrap_or(0),
        it.next().flatten().unwrap_or(0),
    ))
}

/// The library [`environment`] loaded, once it has.
pub fn loaded_library() -> Option<&'static Path> {
    ENV.get().map(|(p, _)| p.as_path())
}

static ENV: OnceLock<(PathBuf, ort::environment::Environment)> = OnceLock::new();

/// Loads ONNX Runtime once per process and returns the environment and library path.
pub fn environment(
    explicit: Option<&Path>,
) -> Result<(&'static Path, ort::environment::Environment), OrtLibError> {
    if let Some((p, env)) = ENV.get() {
        return Ok((p.as_path(), env.clone()));
    }
    // ONNX Runtime allows one environment per process: serialise the first initialisation
    // (threads of one process, e.g. tests, may race here).
    static INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = INIT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((p, env)) = ENV.get() {
        return Ok((p.as_path(), env.clone()));
    }
    let path = find(explicit)?;
    let env = ort::init_from(&path)
        .map_err(|e| OrtLibError::Load {
            path: path.clone(),
            message: e.to_string(),
        })?
        .with_name("ocrctl")
        .with_telemetry(false)
        .with_logger(std::sync::Arc::new(log_line))
        .build()
        .map_err(|e| OrtLibError::Load {
            path: path.clone(),
            message: e.to_string(),
        })?;
    if let Some(level) = log_level() {
        env.set_log_level(level);
    }
    let (p, env) = ENV.get_or_init(|| (path, env));
    Ok((p.as_path(), env.clone()))
}

/// The level `OCRCTL_ORT_LOG` asks ONNX Runtime to log at (`verbose`, `info`, `warning`,
/// `error`), for diagnosing a provider (e.g. `info` shows the CUDA provider's graph captures);
/// `None` when unset or not one of those.
pub fn log_level() -> Option<ort::logging::LogLevel> {
    use ort::logging::LogLevel;
    static LEVEL: OnceLock<Option<LogLevel>> = OnceLock::new();
    *LEVEL.get_or_init(|| match std::env::var("OCRCTL_ORT_LOG").ok()?.as_str() {
        "verbose" => Some(LogLevel::Verbose),
        "info" => Some(LogLevel::Info),
        "warning" => Some(LogLevel::Warning),
        "error" => Some(LogLevel::Error),
        other => {
            tracing::warn!(
                "OCRCTL_ORT_LOG={other:?} is not one of verbose, info, warning, error; ignored"
            );
            None
        }
    })
}

/// ONNX Runtime's log messages, one plain line each (its own logger colours them even when
/// stderr is not a terminal). Errors are not printed here: they come back as the failing
/// call's error, which ocrctl reports once; below warnings nothing is printed unless
/// `OCRCTL_ORT_LOG` asks for it ([`log_level`]).
fn log_line(level: ort::logging::LogLevel, _category: &str, _id: &str, _loc: &str, msg: &str) {
    use ort::logging::LogLevel;
    let least = log_level()
        .unwrap_or(LogLevel::Warning)
        .min(LogLevel::Warning);
    if level >= least && level < LogLevel::Error {
        match level {
            LogLevel::Warning => tracing::warn!(target: "onnxruntime", "{}", msg.trim()),
            _ => tracing::info!(target: "onnxruntime", "{}", msg.trim()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_missing_library_is_named() {
        let e = find(Some(Path::new("/nonexistent/libonnxruntime.so.1.31.1"))).unwrap_err();
        assert!(
            e.to_string()
                .contains("/nonexistent/libonnxruntime.so.1.31.1"),
            "{e}"
        );
    }

    #[test]
    fn versions_are_read_from_file_names() {
        assert_eq!(
            version_of(Path::new("/x/libonnxruntime.so.1.30.0")),
            Some((1, 30, 0))
        );
        assert_eq!(
            version_of(Path::new("libonnxruntime.so.1.31.1")),
            Some((1, 31, 1))
        );
        assert_eq!(version_of(Path::new("libonnxruntime.so")), None);
        assert!(version_of(Path::new("libonnxruntime.so.1.30.0")).unwrap() < MIN_VERSION);
    }

    #[test]
    fn versioned_library_names_are_found() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("libonnxruntime.so.1.31.1"), b"").unwrap();
        std::fs::write(d.path().join("libonnxruntime_providers_shared.so"), b"").unwrap();
        assert_eq!(
            libs_in(d.path()).unwrap(),
            d.path().join("libonnxruntime.so.1.31.1")
        );
    }
}
