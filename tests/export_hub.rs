//! `ocrctl export --checkpoint OWNER/NAME`: the hub id is found in a Hugging Face cache laid out
//! as huggingface_hub writes it (snapshot files are links into `blobs/`), and gives the same
//! export as the folder; an id not in the cache names the command that downloads it.

mod common;
use common::*;
use ocrctl_exporters::manifest::Manifest;
use std::path::Path;
use std::process::Command;

/// A hub cache holding the fixture checkpoint as `lightonai/LightOnOCR-2-1B` at `refs/main`.
fn hub_cache() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let repo = root.path().join("models--lightonai--LightOnOCR-2-1B");
    let commit = "5d6f0b4c1e2a3b4c5d6e7f8091a2b3c4d5e6f708";
    let snap = repo.join("snapshots").join(commit);
    for d in [repo.join("refs"), repo.join("blobs"), snap.clone()] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    for (i, e) in std::fs::read_dir(checkpoint()).unwrap().enumerate() {
        let e = e.unwrap();
        let blob = repo.join("blobs").join(format!("blob{i}"));
        std::fs::copy(e.path(), &blob).unwrap();
        std::os::unix::fs::symlink(
            Path::new("../../blobs").join(format!("blob{i}")),
            snap.join(e.file_name()),
        )
        .unwrap();
    }
    root
}

fn export(checkpoint: &str, out: &Path, cache: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ocrctl"))
        .args([
            "export",
            "--checkpoint",
            checkpoint,
            "--out",
            out.to_str().unwrap(),
        ])
        .env("HF_HUB_CACHE", cache)
        .output()
        .unwrap()
}

#[test]
fn a_hub_id_in_the_cache_exports_like_its_folder() {
    let cache = hub_cache();
    let d = tempfile::tempdir().unwrap();
    let o = export(
        "lightonai/LightOnOCR-2-1B",
        &d.path().join("hub"),
        cache.path(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = export(
        checkpoint().to_str().unwrap(),
        &d.path().join("dir"),
        cache.path(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m = |n: &str| Manifest::load(&d.path().join(n)).unwrap();
    let (hub, dir) = (m("hub"), m("dir"));
    assert_eq!(hub.checkpoint_digest, dir.checkpoint_digest);
    assert!(!hub.source_files.is_empty());
    for n in ["config.json", "tokenizer.json"] {
        assert_eq!(
            std::fs::read(d.path().join("hub").join(n)).unwrap(),
            std::fs::read(d.path().join("dir").join(n)).unwrap(),
            "{n}"
        );
    }
}

#[test]
fn a_hub_id_missing_from_the_cache_names_the_download() {
    let cache = hub_cache();
    let d = tempfile::tempdir().unwrap();
    let o = export(
        "lightonai/LightOnOCR-2-1B-bbox",
        &d.path().join("m"),
        cache.path(),
    );
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not in the Hugging Face cache"), "{err}");
    assert!(
        err.contains("hf download lightonai/LightOnOCR-2-1B-bbox"),
        "{err}"
    );
    assert!(!d.path().join("m").exists());
    // Neither a folder nor a hub id: the old message, saying what --checkpoint takes.
    let o = export("no/such/dir", &d.path().join("m"), cache.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("checkpoint directory not found"), "{err}");
}
