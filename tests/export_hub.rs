//! `ocrctl export --checkpoint OWNER/NAME`: the hub id is found in a Hugging Face cache laid out
//! as huggingface_hub writes it (snapshot files are links into `blobs/`), and gives the same
//! export as the folder; an id not in the cache is downloaded into it from `HF_ENDPOINT` (a
//! local stand-in for the hub here), and where it cannot be, the error names the command that
//! downloads it.

mod common;
use common::*;
use ocrctl_exporters::manifest::Manifest;
use sha2::Digest;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

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
        // Nothing listens there: a download attempt fails at once, never reaching the network.
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .env_remove("HF_HUB_OFFLINE")
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

/// A stand-in for the hub's HTTP API serving the fixture checkpoint as `lightonai/LightOnOCR-2-1B`
/// at `COMMIT`: the repository info, and files by range as huggingface_hub and hf-hub ask for
/// them (a first byte for the metadata, then the rest). Records each request's
/// `Authorization` header. Answers until the test ends.
struct FakeHub {
    url: String,
    auth: Arc<Mutex<Vec<String>>>,
}

const COMMIT: &str = "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567";

impl FakeHub {
    fn start() -> FakeHub {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let auth = Arc::new(Mutex::new(Vec::new()));
        let seen = auth.clone();
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let mut r = BufReader::new(s.try_clone().unwrap());
                let (mut line, mut range, mut who) = (String::new(), None, String::new());
                if r.read_line(&mut line).is_err() {
                    continue;
                }
                loop {
                    let mut h = String::new();
                    if r.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                        break;
                    }
                    let (k, v) = h.split_once(':').unwrap_or((&h, ""));
                    match k.trim().to_ascii_lowercase().as_str() {
                        "range" => range = Some(v.trim().to_string()),
                        "authorization" => who = v.trim().to_string(),
                        _ => {}
                    }
                }
                seen.lock().unwrap().push(who);
                let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                answer(s, &path, range.as_deref());
            }
        });
        FakeHub { url, auth }
    }
}

fn answer(mut s: std::net::TcpStream, path: &str, range: Option<&str>) {
    let repo = "lightonai/LightOnOCR-2-1B";
    let files: Vec<String> = std::fs::read_dir(checkpoint())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let reply = |s: &mut std::net::TcpStream, status: &str, headers: &str, body: &[u8]| {
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{headers}\r\n",
            body.len()
        );
        let _ = s.write_all(head.as_bytes()).and_then(|_| s.write_all(body));
    };
    if path == format!("/api/models/{repo}/revision/main") {
        let mut siblings: Vec<serde_json::Value> = files
            .iter()
            .map(|f| serde_json::json!({ "rfilename": f }))
            .collect();
        // Files an export does not read are listed too, and must not be fetched.
        siblings.push(serde_json::json!({ "rfilename": "README.md" }));
        let body = serde_json::json!({ "sha": COMMIT, "siblings": siblings }).to_string();
        return reply(
            &mut s,
            "200 OK",
            "Content-Type: application/json\r\n",
            body.as_bytes(),
        );
    }
    let Some(name) = path.strip_prefix(&format!("/{repo}/resolve/main/")) else {
        return reply(&mut s, "404 Not Found", "", b"");
    };
    let Ok(mut f) = std::fs::File::open(checkpoint().join(name)) else {
        return reply(&mut s, "404 Not Found", "", b"");
    };
    let mut data = Vec::new();
    f.read_to_end(&mut data).unwrap();
    let (from, to) = match range.and_then(|r| r.strip_prefix("bytes=")) {
        Some(r) => {
            let (a, b) = r.split_once('-').unwrap();
            let a: usize = a.parse().unwrap();
            let b = b.parse().map_or(data.len(), |b: usize| b + 1);
            (a.min(data.len()), b.min(data.len()))
        }
        None => (0, data.len()),
    };
    let etag = format!("{:x}", sha2::Sha256::digest(&data));
    let headers = format!(
        "X-Repo-Commit: {COMMIT}\r\nETag: \"{etag}\"\r\nContent-Range: bytes {from}-{}/{}\r\n",
        to.max(1) - 1,
        data.len()
    );
    reply(&mut s, "206 Partial Content", &headers, &data[from..to]);
}

fn export_from(hub: &str, cache: &Path, out: &Path, env: &[(&str, &str)]) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ocrctl"));
    c.args([
        "export",
        "--checkpoint",
        "lightonai/LightOnOCR-2-1B",
        "--out",
    ])
    .arg(out)
    .env("HF_HUB_CACHE", cache)
    .env("HF_ENDPOINT", hub)
    .env_remove("HF_HUB_OFFLINE")
    .env_remove("HF_TOKEN");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

#[test]
fn a_hub_id_missing_from_the_cache_is_downloaded_into_it() {
    let hub = FakeHub::start();
    let cache = tempfile::tempdir().unwrap();
    let d = tempfile::tempdir().unwrap();
    let o = export_from(
        &hub.url,
        cache.path(),
        &d.path().join("m"),
        &[("HF_TOKEN", "hf_test")],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("downloading lightonai/LightOnOCR-2-1B"),
        "{err}"
    );
    // The cache as huggingface_hub lays it out: the ref, and every file of the checkpoint in
    // the snapshot with the fixture's bytes; nothing an export does not read.
    let repo = cache.path().join("models--lightonai--LightOnOCR-2-1B");
    assert_eq!(
        std::fs::read_to_string(repo.join("refs/main"))
            .unwrap()
            .trim(),
        COMMIT
    );
    let snap = repo.join("snapshots").join(COMMIT);
    for e in std::fs::read_dir(checkpoint()).unwrap() {
        let e = e.unwrap();
        let got = std::fs::read(snap.join(e.file_name())).unwrap();
        assert_eq!(got, std::fs::read(e.path()).unwrap(), "{:?}", e.file_name());
    }
    assert!(!snap.join("README.md").exists());
    assert!(hub
        .auth
        .lock()
        .unwrap()
        .iter()
        .all(|a| a == "Bearer hf_test"));
    assert!(Manifest::load(&d.path().join("m")).is_ok());
    // A second export reads the cache: the hub is not asked again.
    let asked = hub.auth.lock().unwrap().len();
    let o = export_from(
        "http://127.0.0.1:9",
        cache.path(),
        &d.path().join("again"),
        &[],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(hub.auth.lock().unwrap().len(), asked);
}

#[test]
fn offline_or_unreachable_names_the_download_command() {
    let cache = tempfile::tempdir().unwrap();
    let d = tempfile::tempdir().unwrap();
    for env in [&[("HF_HUB_OFFLINE", "1")][..], &[]] {
        let o = export_from("http://127.0.0.1:9", cache.path(), &d.path().join("m"), env);
        assert_eq!(o.status.code(), Some(1), "{env:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("not in the Hugging Face cache"), "{err}");
        assert!(
            err.contains("hf download lightonai/LightOnOCR-2-1B"),
            "{err}"
        );
        assert!(!d.path().join("m").exists());
    }
}
