//! `ocrctl ocr` over nested folders: `--recursive`, a `**` pattern, `--files-from FILE|-`,
//! and entries it does not read counted in the summary line.

mod common;
use common::*;
use serde_json::Value;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// `in/a.png`, `in/notes.txt`, `in/sub/b.png`, `in/sub/deep/c.png`.
fn tree(root: &Path) {
    let img = fixture().join("images/aligned.png");
    std::fs::create_dir_all(root.join("sub/deep")).unwrap();
    for f in ["a.png", "sub/b.png", "sub/deep/c.png"] {
        std::fs::copy(&img, root.join(f)).unwrap();
    }
    std::fs::write(root.join("notes.txt"), "not a page").unwrap();
}

fn ocr_args(extra: &[&str]) -> Vec<String> {
    let m = exported().to_str().unwrap().to_string();
    let mut v: Vec<String> = [
        "ocr",
        "--temperature",
        "0",
        "--max-tokens",
        "2",
        "--accept-length",
        "--json",
        "--model",
        &m,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// Files of the JSON rows, relative to `root`, and stderr.
fn files(o: &std::process::Output, root: &Path) -> (Vec<String>, String) {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    let f = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let p = v["file"].as_str().unwrap().to_string();
            Path::new(&p)
                .strip_prefix(root)
                .unwrap()
                .display()
                .to_string()
        })
        .collect();
    (f, err)
}

fn run(extra: &[&str]) -> std::process::Output {
    let args = ocr_args(extra);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    ocrctl(&refs)
}

#[test]
fn folders_recurse_on_request_and_skipped_entries_are_counted() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("in");
    tree(&root);
    let r = root.to_str().unwrap();

    let (f, err) = files(&run(&[r]), &root);
    assert_eq!(f, ["a.png"]);
    assert!(
        err.contains("2 folder entries skipped (not images or PDFs or subfolders)"),
        "{err}"
    );

    let (f, err) = files(&run(&["--recursive", r]), &root);
    assert_eq!(f, ["a.png", "sub/b.png", "sub/deep/c.png"]);
    assert!(
        err.contains("1 folder entries skipped (not images or PDFs)"),
        "{err}"
    );

    let pattern = root.join("**/*.png");
    let (f, _) = files(&run(&[pattern.to_str().unwrap()]), &root);
    assert_eq!(f, ["a.png", "sub/b.png", "sub/deep/c.png"]);
    let pattern = root.join("sub/**");
    let (f, _) = files(&run(&[pattern.to_str().unwrap()]), &root);
    assert_eq!(f, ["sub/b.png", "sub/deep/c.png"]);
}

#[test]
fn inputs_come_from_a_list_file_or_stdin() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("in");
    tree(&root);
    let list = format!(
        "{}\n\n{}\n",
        root.join("sub/deep/c.png").display(),
        root.join("a.png").display()
    );
    let lf = d.path().join("list.txt");
    std::fs::write(&lf, &list).unwrap();
    let (f, _) = files(&run(&["--files-from", lf.to_str().unwrap()]), &root);
    assert_eq!(f, ["sub/deep/c.png", "a.png"]);

    let args = ocr_args(&["--files-from", "-"]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_ocrctl"))
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(list.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    let (f, _) = files(&o, &root);
    assert_eq!(f, ["sub/deep/c.png", "a.png"]);

    let e = ocrctl_err(
        &ocr_args(&["--files-from", "/nonexistent/list"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert!(
        e.contains("--files-from") && e.contains("/nonexistent/list"),
        "{e}"
    );
}
