//! Where ocrctl looks for the shared libraries it loads at run time from Python wheels
//! (ONNX Runtime from `onnxruntime`, pdfium from `pypdfium2`): the site-packages of
//! `.venv` folders near the executable and the current directory, `$VIRTUAL_ENV`, `python3`
//! on `PATH`, and system prefixes. [`crate::runtime::ortlib`] and [`crate::documents::pdf`] put these together
//! in their own order.

use std::path::{Path, PathBuf};

/// `<prefix>/lib/python3*/site-packages/<sub>` for every `python3*` folder under
/// `<prefix>/lib`, sorted; empty when there is none.
pub fn site_packages_under(prefix: &Path, sub: &str) -> Vec<PathBuf> {
    let lib = prefix.join("lib");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&lib)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("python3"))
                })
                .map(|p| p.join("site-packages").join(sub))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The executable's directory (symlinks resolved), if known.
pub fn exe_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let exe = exe.canonicalize().unwrap_or(exe);
    exe.parent().map(Path::to_path_buf)
}

/// `.venv` folders to search, in order: in the executable's directory and each of its
/// parents, then in the current directory and each of its parents, then `$VIRTUAL_ENV`.
/// Duplicates are dropped; the folders need not exist.
pub fn venv_prefixes() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = Vec::new();
    let mut push = |p: PathBuf| {
        if !v.contains(&p) {
            v.push(p);
        }
    };
    if let Some(d) = exe_dir() {
        for anc in d.ancestors() {
            push(anc.join(".venv"));
        }
    }
    if let Ok(cwd) = std::env::current_dir() {
        for anc in cwd.ancestors() {
            push(anc.join(".venv"));
        }
    }
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
        push(PathBuf::from(venv));
    }
    v
}

/// The folder of Python package `module` as `python3` on `PATH` imports it, if it does.
pub fn python_package_dir(module: &str) -> Option<PathBuf> {
    // `module` is one of ocrctl's own constants, never user input.
    let code = format!("import os, {module}; print(os.path.dirname({module}.__file__))");
    let out = std::process::Command::new("python3")
        .args(["-c", &code])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?;
    Some(PathBuf::from(s.trim()))
}

/// The folders that may hold a wheel's library, in search order: next to the executable,
/// `<venv>/lib/python3*/site-packages/<sub>` for each of [`venv_prefixes`], the same folder of
/// the package as `python3` imports it, then the `/usr/local` and `/usr` site-packages. `sub`
/// is the path under site-packages (`onnxruntime/capi`, `pypdfium2_raw`); its first
/// component is the Python package.
pub fn wheel_dirs(sub: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = exe_dir() {
        dirs.push(d);
    }
    for venv in venv_prefixes() {
        dirs.extend(site_packages_under(&venv, sub));
    }
    let (package, rest) = sub.split_once('/').unwrap_or((sub, ""));
    if let Some(d) = python_package_dir(package) {
        dirs.push(if rest.is_empty() { d } else { d.join(rest) });
    }
    dirs.extend(site_packages_under(Path::new("/usr/local"), sub));
    dirs.extend(site_packages_under(Path::new("/usr"), sub));
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn site_packages_of_every_python_are_listed() {
        let d = tempfile::tempdir().unwrap();
        for v in ["python3.12", "python3.11", "perl5"] {
            std::fs::create_dir_all(d.path().join("lib").join(v)).unwrap();
        }
        assert_eq!(
            site_packages_under(d.path(), "pkg/capi"),
            vec![
                d.path().join("lib/python3.11/site-packages/pkg/capi"),
                d.path().join("lib/python3.12/site-packages/pkg/capi"),
            ]
        );
        assert!(site_packages_under(&d.path().join("absent"), "pkg").is_empty());
    }

    #[test]
    fn venvs_near_the_current_directory_are_searched() {
        let cwd = std::env::current_dir().unwrap();
        let v = venv_prefixes();
        for anc in cwd.ancestors() {
            assert!(v.contains(&anc.join(".venv")), "{}", anc.display());
        }
        let unique: std::collections::HashSet<_> = v.iter().collect();
        assert_eq!(unique.len(), v.len(), "no duplicates: {v:?}");
    }
}
