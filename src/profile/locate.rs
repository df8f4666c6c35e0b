//! Finding a profile by name or path: `$OCRCTL_PROFILES_DIR`, the built-ins, `profiles/` folders.

use super::*;

/// Whether an argument names a file rather than a profile.
pub(crate) fn looks_like_path(s: &str) -> bool {
    s.contains('/') || s.contains('\\') || s.ends_with(".yaml") || s.ends_with(".yml")
}

pub(crate) fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && !s.starts_with('.')
}

/// The built-in profile a mistyped `name` most likely meant: within two edits (`16g`,
/// `16GB`, `cpus`), case aside.
fn closest_builtin(name: &str) -> Option<&'static str> {
    let name = name.to_ascii_lowercase();
    BUILTIN
        .iter()
        .map(|(n, _)| (ocrctl_exporters::manifest::edit_distance(&name, n), *n))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, n)| n)
}

#[cfg(test)]
mod suggest_tests {
    use super::*;

    #[test]
    fn a_mistyped_profile_name_suggests_the_built_in_it_is_close_to() {
        assert_eq!(closest_builtin("16g"), Some("16gb"));
        assert_eq!(closest_builtin("24GB"), Some("24gb"));
        assert_eq!(closest_builtin("cpus"), Some("cpu"));
        assert_eq!(closest_builtin("datacenter"), None);
        let e = locate("80g").unwrap_err().to_string();
        assert!(e.ends_with("; did you mean `80gb`?"), "{e}");
    }
}

/// The YAML text of a built-in profile.
pub fn builtin(name: &str) -> Option<&'static str> {
    BUILTIN.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

pub(crate) fn env_dir() -> Option<PathBuf> {
    std::env::var_os(PROFILES_DIR_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// `profiles/` folders of the executable's ancestors, then `./profiles`.
pub(crate) fn fallback_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        for a in exe.ancestors().skip(1) {
            let d = a.join("profiles");
            if d.is_dir() && !dirs.contains(&d) {
                dirs.push(d);
            }
        }
    }
    if let Ok(cwd) = std::env::current_dir() {
        let d = cwd.join("profiles");
        if d.is_dir() && !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    dirs
}

/// Folders searched for `<name>.yaml`, in order (`$OCRCTL_PROFILES_DIR` first; the built-ins
/// are consulted between it and the others).
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = env_dir().into_iter().collect();
    for d in fallback_dirs() {
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    dirs
}

pub(crate) fn read(path: &Path) -> Result<String, ProfileError> {
    std::fs::read_to_string(path).map_err(|e| ProfileError::Read {
        file: path.to_path_buf(),
        error: e,
    })
}

/// Finds a profile by name or path and returns where it is and its YAML text.
pub fn locate(name_or_path: &str) -> Result<(ProfileSource, String), ProfileError> {
    if looks_like_path(name_or_path) {
        let p = PathBuf::from(name_or_path);
        let text = read(&p)?;
        return Ok((ProfileSource::File(p), text));
    }
    let name = name_or_path;
    let not_found = |searched: &[PathBuf]| ProfileError::NotFound {
        name: name.to_string(),
        hint: closest_builtin(name).map_or(String::new(), |n| format!("; did you mean `{n}`?")),
        builtins: BUILTIN
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", "),
        searched: if searched.is_empty() {
            "no profiles folder".to_string()
        } else {
            searched
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        },
    };
    if !valid_name(name) {
        return Err(not_found(&search_dirs()));
    }
    let file = format!("{name}.yaml");
    if let Some(d) = env_dir() {
        let p = d.join(&file);
        if p.is_file() {
            let text = read(&p)?;
            return Ok((ProfileSource::File(p), text));
        }
    }
    if let Some(text) = builtin(name) {
        return Ok((ProfileSource::BuiltIn(name.to_string()), text.to_string()));
    }
    for d in fallback_dirs() {
        let p = d.join(&file);
        if p.is_file() {
            let text = read(&p)?;
            return Ok((ProfileSource::File(p), text));
        }
    }
    Err(not_found(&search_dirs()))
}

/// One entry of [`available`]: a profile name and what loading it gave.
#[derive(Debug)]
pub struct Listed {
    /// The name `Profile::load` resolves.
    pub name: String,
    /// The profile, or why it does not load.
    pub profile: Result<Profile, ProfileError>,
}

/// Every profile loadable by name: the built-ins, then other `*.yaml` files of the search
/// folders in name order. Files that do not parse are listed with their error.
pub fn available() -> Vec<Listed> {
    let mut names: Vec<String> = BUILTIN.iter().map(|(n, _)| n.to_string()).collect();
    let mut extra = Vec::new();
    for d in search_dirs() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.extension().and_then(|x| x.to_str()) != Some("yaml") {
                continue;
            }
            if let Some(stem) = p.file_stem().and_then(|s| s.to_str()) {
                if valid_name(stem)
                    && !names.iter().any(|n| n == stem)
                    && !extra.contains(&stem.to_string())
                {
                    extra.push(stem.to_string());
                }
            }
        }
    }
    extra.sort();
    names.extend(extra);
    names
        .into_iter()
        .map(|name| {
            let profile = Profile::load(&name);
            Listed { name, profile }
        })
        .collect()
}
