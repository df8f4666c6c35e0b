//! TensorRT-RTX ahead of time (`ocrctl build-engines`) on the fixture, with no GPU: engines and
//! EPContext models for a profile, a second run that builds nothing, `--check`, rebuilds when
//! the profile changes, and a runner that says in one line why it cannot use TensorRT-RTX here.

mod common;
use common::*;
use std::path::Path;

fn has_builder() -> bool {
    runs(venv_python(), &["-c", "import tensorrt_rtx_bindings"])
}

fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("ocrctl.json")).unwrap()).unwrap()
}

fn mtimes(dir: &Path) -> Vec<(String, std::time::SystemTime)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().to_string(),
                e.metadata().unwrap().modified().unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn engines_are_built_once_checked_and_rebuilt_when_the_profile_changes() {
    if !require_tool(
        "engines_are_built_once_checked_and_rebuilt_when_the_profile_changes",
        "tensorrt_rtx_bindings in .venv",
        has_builder(),
        "scripts/setup.sh --trt-rtx",
    ) {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("m");
    export_fixture(&m, &["--target", "tensorrt", "--precision", "int4-fp16"]);
    let model = m.to_str().unwrap();

    let out = ocrctl_ok(&["build-engines", "--model", model, "--profile", "16gb"]);
    assert!(out.contains("built 3 TensorRT-RTX 1.7.1"), "{out}");
    let engines = m.join("trt-rtx/16gb");
    for stem in [
        "vision_encoder_q4f16",
        "embed_tokens_q4f16",
        "decoder_model_merged_q4f16",
    ] {
        let e = engines.join(format!("{stem}.engine"));
        assert!(
            std::fs::metadata(&e).unwrap().len() > 1000,
            "{}",
            e.display()
        );
        assert!(engines.join(format!("{stem}_ctx.onnx")).is_file());
    }
    let set = &manifest(&m)["engines"]["16gb"];
    assert_eq!(set["builder"], "tensorrt-rtx");
    assert_eq!(
        set["compute_capabilities"],
        serde_json::json!(["sm86", "sm89", "sm120"])
    );
    assert_eq!(set["graphs"].as_object().unwrap().len(), 3);
    assert_eq!(
        set["graphs"]["decoder_model_merged"]["source"],
        "onnx/decoder_model_merged_q4f16.onnx"
    );

    // A second run builds nothing and touches nothing.
    let before = (
        mtimes(&engines),
        std::fs::read(m.join("ocrctl.json")).unwrap(),
    );
    let out = ocrctl_ok(&["build-engines", "--model", model, "--profile", "16gb"]);
    assert!(out.contains("up to date"), "{out}");
    assert_eq!(
        before,
        (
            mtimes(&engines),
            std::fs::read(m.join("ocrctl.json")).unwrap()
        )
    );

    let out = ocrctl_ok(&[
        "build-engines",
        "--model",
        model,
        "--profile",
        "16gb",
        "--check",
    ]);
    assert!(out.contains("EPContext models valid"), "{out}");
    // The export itself is still intact (engines are recorded apart from its files).
    ocrctl_ok(&["verify", model]);

    // The same profile name with another batch size: the engines no longer match.
    let text = std::fs::read_to_string("profiles/16gb.yaml").unwrap();
    let changed = d.path().join("16gb.yaml");
    std::fs::write(
        &changed,
        text.replace("max_batch_size: 6", "max_batch_size: 4"),
    )
    .unwrap();
    let changed = changed.to_str().unwrap();
    let err = ocrctl_err(&[
        "build-engines",
        "--model",
        model,
        "--profile",
        changed,
        "--check",
    ]);
    assert!(
        err.contains("changed since the engines were built"),
        "{err}"
    );
    let out = ocrctl(&["build-engines", "--model", model, "--profile", changed]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("building: profile 16gb's shape ranges"),
        "{stderr}"
    );
    ocrctl_ok(&[
        "build-engines",
        "--model",
        model,
        "--profile",
        changed,
        "--check",
    ]);

    // A damaged engine is named.
    let engine = engines.join("embed_tokens_q4f16.engine");
    let mut bytes = std::fs::read(&engine).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&engine, bytes).unwrap();
    let err = ocrctl_err(&[
        "build-engines",
        "--model",
        model,
        "--profile",
        changed,
        "--check",
    ]);
    assert!(err.contains("embed_tokens_q4f16.engine"), "{err}");
}

#[test]
fn the_runner_says_once_why_tensorrt_rtx_cannot_run_and_falls_back() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("m");
    export_fixture(&m, &["--target", "tensorrt", "--precision", "int4-fp16"]);
    let image = fixture().join("images/aligned.png");
    let args = [
        "ocr",
        "--accept-length",
        "--model",
        m.to_str().unwrap(),
        "--precision",
        "int4-fp16",
        "--providers",
        "tensorrt-rtx,cpu",
        "--max-tokens",
        "4",
        "--temperature",
        "0",
        image.to_str().unwrap(),
    ];
    let out = ocrctl(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // This machine has no NVIDIA driver (CI) or no RTX device: either way, one line.
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("tensorrt-rtx execution provider"))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("falling back to cpu"), "{stderr}");
    // With strict providers the same reason is an error.
    let mut strict = args.to_vec();
    strict.push("--strict-providers");
    let err = ocrctl_err(&strict);
    assert!(
        err.contains("tensorrt-rtx execution provider unavailable"),
        "{err}"
    );
}

#[test]
fn build_engines_refuses_an_ort_export_and_checks_nothing_unbuilt() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("m");
    export_fixture(&m, &["--precision", "int4-fp16"]);
    let model = m.to_str().unwrap();
    let err = ocrctl_err(&["build-engines", "--model", model, "--profile", "16gb"]);
    assert!(err.contains("export with --target tensorrt"), "{err}");
    let t = d.path().join("t");
    export_fixture(&t, &["--target", "tensorrt", "--precision", "int4-fp16"]);
    let err = ocrctl_err(&[
        "build-engines",
        "--model",
        t.to_str().unwrap(),
        "--profile",
        "16gb",
        "--check",
    ]);
    assert!(
        err.contains("no engines were built for profile 16gb"),
        "{err}"
    );
    let err = ocrctl_err(&[
        "build-engines",
        "--model",
        t.to_str().unwrap(),
        "--profile",
        "cpu",
    ]);
    assert!(err.contains("no tensorrt_rtx section"), "{err}");
}
