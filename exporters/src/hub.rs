//! `--checkpoint lightonai/LightOnOCR-2-1B`: a Hugging Face hub id resolved in the standard
//! hub cache (the layout `huggingface_hub` writes: `models--OWNER--NAME/refs/REV` holds a commit,
//! `snapshots/COMMIT/` the files), so a model fetched by `hf download` or by transformers is
//! found where it already is. Nothing is downloaded: where the snapshot is missing, the error
//! gives the command that fetches it.
//!
//! The cache root is `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`
//! (huggingface_hub's order: <https://huggingface.co/docs/huggingface_hub/package_reference/environment_variables>).

use crate::ExportError;
use std::path::{Path, PathBuf};

/// A hub id `OWNER/NAME`, with an optional `@REVISION` (a branch, tag or commit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubId {
    pub owner: String,
    pub name: String,
    pub revision: Option<String>,
}

impl HubId {
    /// `OWNER/NAME[@REV]` when `s` has that shape (hub names: letters, digits, `-`, `_`, `.`;
    /// not starting with `.` or `-`), else `None`.
    pub fn parse(s: &str) -> Option<HubId> {
        let (repo, revision) = match s.split_once('@') {
            Some((r, rev)) if !rev.is_empty() && !rev.contains(['/', '\\']) || is_ref(rev) => {
                (r, Some(rev.to_string()))
            }
            Some(_) => return None,
            None => (s, None),
        };
        let (owner, name) = repo.split_once('/')?;
        let part = |p: &str| {
            !p.is_empty()
                && p.len() <= 96
                && !p.starts_with(['.', '-'])
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        (part(owner) && part(name)).then(|| HubId {
            owner: owner.into(),
            name: name.into(),
            revision,
        })
    }

    /// `OWNER/NAME` (without the revision).
    pub fn repo(&self) -> String {
        format!("{}/{}", self.owner, self.name)
    }

    /// The command that puts this model in the cache.
    pub fn download_command(&self) -> String {
        match &self.revision {
            Some(r) => format!("hf download {} --revision {r}", self.repo()),
            None => format!("hf download {}", self.repo()),
        }
    }
}

/// Refs with a slash (`refs/pr/1`) are revisions too.
fn is_ref(rev: &str) -> bool {
    rev.starts_with("refs/pr/") && rev[8..].chars().all(|c| c.is_ascii_digit()) && rev.len() > 8
}

/// The hub cache root from the environment, as huggingface_hub picks it.
pub fn cache_root() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("HF_HUB_CACHE")
        .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| var("HOME").map(|h| h.join(".cache/huggingface/hub")))
}

/// The snapshot folder of `id` in the cache at `root`, or an error naming what is missing and
/// the command that downloads it.
pub fn resolve_in(id: &HubId, root: &Path) -> Result<PathBuf, ExportError> {
    let repo_dir = root.join(format!("models--{}--{}", id.owner, id.name));
    let missing = |what: String| {
        ExportError::Invalid(format!(
            "{}: {what}; download it with `{}` (huggingface_hub's CLI) and run again, or pass \
             the folder that holds its config.json",
            id.repo(),
            id.download_command()
        ))
    };
    if !repo_dir.is_dir() {
        return Err(missing(format!(
            "not in the Hugging Face cache ({})",
            root.display()
        )));
    }
    let rev = id.revision.as_deref().unwrap_or("main");
    let commit = if rev.len() == 40 && rev.chars().all(|c| c.is_ascii_hexdigit()) {
        rev.to_string()
    } else {
        let refs = repo_dir.join("refs").join(rev);
        std::fs::read_to_string(&refs)
            .map(|c| c.trim().to_string())
            .map_err(|_| {
                missing(format!(
                    "revision `{rev}` is not in the cache ({} missing)",
                    refs.display()
                ))
            })?
    };
    let snap = repo_dir.join("snapshots").join(&commit);
    if !snap.join("config.json").is_file() {
        return Err(missing(format!(
            "the cached snapshot {} has no config.json (an interrupted download?)",
            snap.display()
        )));
    }
    Ok(snap)
}

/// `--checkpoint`'s folder: `s` itself when it is a folder, else the cached snapshot of the
/// hub id `s`. `None` when `s` is neither a folder nor shaped like a hub id.
pub fn resolve(s: &str) -> Option<Result<PathBuf, ExportError>> {
    if Path::new(s).is_dir() {
        return Some(Ok(PathBuf::from(s)));
    }
    let id = HubId::parse(s)?;
    Some(match cache_root() {
        Some(root) => resolve_in(&id, &root),
        None => Err(ExportError::Invalid(format!(
            "{}: no Hugging Face cache (HF_HUB_CACHE, HF_HOME and HOME are unset); download it \
             with `{}` and pass its folder",
            id.repo(),
            id.download_command()
        ))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> HubId {
        HubId::parse(s).unwrap_or_else(|| panic!("{s} should parse"))
    }

    #[test]
    fn hub_ids_parse_and_paths_do_not() {
        let h = id("lightonai/LightOnOCR-2-1B");
        assert_eq!(
            (h.owner.as_str(), h.name.as_str()),
            ("lightonai", "LightOnOCR-2-1B")
        );
        assert_eq!(h.revision, None);
        assert_eq!(id("a/b@v1.0").revision.as_deref(), Some("v1.0"));
        assert_eq!(id("a/b@refs/pr/12").revision.as_deref(), Some("refs/pr/12"));
        for not in [
            "/abs/path",
            "./rel/dir",
            "a/b/c",
            "noslash",
            "a/",
            "/b",
            "../x",
            "a/.b",
            "a/b@",
            "a/b@x/y",
            "a b/c",
        ] {
            assert_eq!(HubId::parse(not), None, "{not}");
        }
        assert_eq!(
            id("o/n@v2").download_command(),
            "hf download o/n --revision v2"
        );
    }

    /// A cache laid out as huggingface_hub writes it.
    fn cache(commit: &str, with_config: bool) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let repo = root.path().join("models--lightonai--LightOnOCR-2-1B");
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), format!("{commit}\n")).unwrap();
        let snap = repo.join("snapshots").join(commit);
        std::fs::create_dir_all(&snap).unwrap();
        if with_config {
            std::fs::write(snap.join("config.json"), "{}").unwrap();
        }
        root
    }

    #[test]
    fn a_cached_snapshot_is_found_by_ref_or_commit() {
        let c = "0123456789abcdef0123456789abcdef01234567";
        let root = cache(c, true);
        let snap = root
            .path()
            .join("models--lightonai--LightOnOCR-2-1B/snapshots")
            .join(c);
        assert_eq!(
            resolve_in(&id("lightonai/LightOnOCR-2-1B"), root.path()).unwrap(),
            snap
        );
        let by_commit = id(&format!("lightonai/LightOnOCR-2-1B@{c}"));
        assert_eq!(resolve_in(&by_commit, root.path()).unwrap(), snap);
    }

    #[test]
    fn what_is_missing_is_named_with_the_download_command() {
        let root = cache("ab".repeat(20).as_str(), false);
        let err = |s: &str| resolve_in(&id(s), root.path()).unwrap_err().to_string();
        let e = err("lightonai/LightOnOCR-2-1B-bbox");
        assert!(e.contains("not in the Hugging Face cache"), "{e}");
        assert!(
            e.contains("`hf download lightonai/LightOnOCR-2-1B-bbox`"),
            "{e}"
        );
        let e = err("lightonai/LightOnOCR-2-1B@v9");
        assert!(e.contains("revision `v9` is not in the cache"), "{e}");
        let e = err("lightonai/LightOnOCR-2-1B");
        assert!(e.contains("has no config.json"), "{e}");
    }
}
