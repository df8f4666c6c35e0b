//! What the CLI writes and replaces (issue 42: N8, N10): `ocr --out` publishes each markdown
//! file through a fresh temporary file, and `export --force` replaces only an ocrctl export.

use super::common;
use super::image;
use std::path::Path;

fn ocr_out(out: &Path, inputs: &[&Path]) -> std::process::Output {
    let model = common::exported();
    let mut args = vec![
        "ocr",
        "--accept-length",
        "--temperature",
        "0",
        "--model",
        model.to_str().unwrap(),
        "--precision",
        "fp32",
        "--max-tokens",
        "4",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend(inputs.iter().map(|p| p.to_str().unwrap()));
    common::ocrctl(&args)
}

/// N8: `ocr --out` wrote `NAME.md.partial` with `File::create`, which follows a symlink
/// planted there (the victim file was overwritten, and `NAME.md` became that link). N10: an
/// input named `..png` was never written (its temporary name came out as `..`).
#[test]
fn ocr_out_writes_no_file_through_a_planted_link_and_writes_dot_dot_png() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, "keep me").unwrap();
    std::os::unix::fs::symlink(&victim, out.join("aligned.md.partial")).unwrap();
    let dots = dir.path().join("..png");
    std::fs::copy(image("aligned.png"), &dots).unwrap();
    let run = ocr_out(&out, &[&image("aligned.png"), &dots]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    for name in ["aligned.md", "..md"] {
        let md = out.join(name);
        let meta = std::fs::symlink_metadata(&md).unwrap();
        assert!(meta.file_type().is_file(), "{name} is a plain file");
        assert!(meta.len() > 0, "{name} holds the text");
    }
    // No temporary file is left behind.
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["..md", "aligned.md", "aligned.md.partial"]);
}

/// N10: `export --force` wiped a folder whose `ocrctl.json` was `{}` (any folder could be
/// made to look like an export). Now the manifest must be one ocrctl reads, and the error
/// names it.
#[test]
fn export_force_refuses_a_folder_whose_manifest_is_not_ocrctls() {
    let dir = tempfile::tempdir().unwrap();
    let notes = dir.path().join("mine");
    std::fs::create_dir(&notes).unwrap();
    std::fs::write(notes.join("notes.txt"), "keep me").unwrap();
    std::fs::write(notes.join("ocrctl.json"), "{}").unwrap();
    let err = common::export_fixture_err(&notes, &["--precision", "fp32", "--force"]);
    assert!(err.contains("mine/ocrctl.json"), "{err}");
    assert!(err.contains("not an ocrctl manifest"), "{err}");
    assert_eq!(
        std::fs::read_to_string(notes.join("notes.txt")).unwrap(),
        "keep me"
    );
}
