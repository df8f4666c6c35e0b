//! Bad input gets one clear error naming the file, tensor, field or library, a non-zero
//! exit, and nothing partial left behind.

mod common;
use common::*;
use serde_json::Value;
use std::path::Path;

fn export_err(ck: &Path, out: &Path) -> String {
    let e = ocrctl_err(&[
        "export",
        "--checkpoint",
        ck.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!out.exists(), "no output directory after a failed export");
    let leftovers: Vec<_> = std::fs::read_dir(out.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".partial-"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "temporary export directory left behind"
    );
    e
}

fn edit_config(ck: &Path, f: impl FnOnce(&mut Value)) {
    let p = ck.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

#[test]
fn missing_and_unknown_config_fields_are_named() {
    let (d, ck) = checkpoint_copy();
    edit_config(&ck, |v| {
        v["text_config"]
            .as_object_mut()
            .unwrap()
            .remove("num_hidden_layers");
    });
    let e = export_err(&ck, &d.path().join("out"));
    assert!(
        e.contains("config.json") && e.contains("text_config.num_hidden_layers"),
        "{e}"
    );

    let (d, ck) = checkpoint_copy();
    edit_config(&ck, |v| v["vision_config"]["use_magic"] = true.into());
    let e = export_err(&ck, &d.path().join("out"));
    assert!(e.contains("vision_config.use_magic"), "{e}");

    let (d, ck) = checkpoint_copy();
    edit_config(&ck, |v| v["model_type"] = "qwen2_vl".into());
    let e = export_err(&ck, &d.path().join("out"));
    assert!(e.contains("unsupported model_type `qwen2_vl`"), "{e}");

    let (d, ck) = checkpoint_copy();
    std::fs::write(ck.join("config.json"), "{ not json").unwrap();
    let e = export_err(&ck, &d.path().join("out"));
    assert!(
        e.contains("config.json") && e.contains("invalid JSON"),
        "{e}"
    );
}

#[test]
fn tensor_problems_name_the_tensor() {
    // A config that disagrees with the weights: the first tensor whose shape differs.
    let (d, ck) = checkpoint_copy();
    edit_config(&ck, |v| {
        let n = v["text_config"]["intermediate_size"].as_u64().unwrap();
        v["text_config"]["intermediate_size"] = (n + 8).into();
    });
    let e = export_err(&ck, &d.path().join("out"));
    assert!(
        e.contains("mlp.gate_proj.weight") && e.contains("expected shape"),
        "{e}"
    );

    // A renamed tensor (same header length) is missing.
    let (d, ck) = checkpoint_copy();
    patch_bytes(
        &ck.join("model.safetensors"),
        b"language_model.norm.weight",
        b"language_model.norX.weight",
    );
    let e = export_err(&ck, &d.path().join("out"));
    assert!(
        e.contains("`model.language_model.norm.weight` not found"),
        "{e}"
    );

    // An integer dtype cannot be a weight.
    let (d, ck) = checkpoint_copy();
    patch_bytes(&ck.join("model.safetensors"), b"\"BF16\"", b"\"I16\" ");
    let e = export_err(&ck, &d.path().join("out"));
    assert!(e.contains("dtype I16"), "{e}");
}

#[test]
fn truncated_or_corrupt_safetensors_name_the_file() {
    let (d, ck) = checkpoint_copy();
    let p = ck.join("model.safetensors");
    let b = std::fs::read(&p).unwrap();
    std::fs::write(&p, &b[..b.len() - 100]).unwrap();
    let e = export_err(&ck, &d.path().join("out"));
    assert!(
        e.contains("model.safetensors") && e.contains("not a valid safetensors"),
        "{e}"
    );

    std::fs::write(&p, b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": garbage!!}").unwrap();
    let e = export_err(&ck, &d.path().join("out"));
    assert!(
        e.contains("model.safetensors") && e.contains("not a valid safetensors"),
        "{e}"
    );

    std::fs::remove_file(&p).unwrap();
    let e = export_err(&ck, &d.path().join("out"));
    assert!(e.contains("no model.safetensors"), "{e}");
}

#[test]
fn existing_output_is_refused_without_force_and_kept_intact() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "mine").unwrap();
    let e = ocrctl_err(&[
        "export",
        "--checkpoint",
        checkpoint().to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(e.contains("already exists") && e.contains("--force"), "{e}");
    assert_eq!(
        std::fs::read_to_string(out.join("keep.txt")).unwrap(),
        "mine"
    );

    // --force replaces only an earlier export, never the user's own directory.
    let e = ocrctl_err(&[
        "export",
        "--checkpoint",
        checkpoint().to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--force",
    ]);
    assert!(e.contains("not an ocrctl export"), "{e}");
    assert_eq!(
        std::fs::read_to_string(out.join("keep.txt")).unwrap(),
        "mine"
    );
    let model = d.path().join("model");
    for _ in 0..2 {
        ocrctl_ok(&[
            "export",
            "--checkpoint",
            checkpoint().to_str().unwrap(),
            "--out",
            model.to_str().unwrap(),
            "--force",
        ]);
    }
    assert!(model.join("ocrctl.json").is_file());
}

#[test]
fn unknown_dummy_model_and_precision_are_rejected() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("o");
    let e = ocrctl_err(&[
        "export",
        "--checkpoint",
        "dummy:gpt-5",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(e.contains("dummy:gpt-5"), "{e}");
    let e = ocrctl_err(&[
        "export",
        "--checkpoint",
        "dummy:tiny",
        "--out",
        out.to_str().unwrap(),
        "--precision",
        "fp8",
    ]);
    assert!(e.contains("fp8"), "{e}");
    assert!(!out.exists());
}

#[test]
fn unreadable_images_are_named_and_the_rest_still_run() {
    let model = exported();
    let d = tempfile::tempdir().unwrap();
    let bad = d.path().join("broken.png");
    std::fs::write(&bad, b"\x89PNG\r\n\x1a\nthis is not a png").unwrap();
    let good = fixture().join("images/aligned.png");
    let out = ocrctl(&[
        "ocr",
        "--accept-length",
        "--model",
        model.to_str().unwrap(),
        "--max-tokens",
        "4",
        "--json",
        bad.to_str().unwrap(),
        good.to_str().unwrap(),
        "/nonexistent/page.png",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("broken.png") && err.contains("/nonexistent/page.png"),
        "{err}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Failed inputs have their row too (issue 41.5): `status` failed, naming the file.
    let (failed, lines): (Vec<&str>, Vec<&str>) = stdout
        .lines()
        .partition(|l| l.contains("\"status\":\"failed\""));
    assert_eq!(
        lines.len(),
        1,
        "the good image still produced output: {stdout}"
    );
    assert!(lines[0].contains("aligned.png"));
    assert_eq!(failed.len(), 2, "{stdout}");
    assert!(failed.iter().any(|l| l.contains("broken.png")), "{stdout}");
    assert!(failed.iter().any(|l| l.contains("/nonexistent/page.png")));
}

#[test]
fn a_missing_onnx_runtime_library_is_named() {
    let model = exported();
    let img = fixture().join("images/aligned.png");
    let e = ocrctl_err(&[
        "ocr",
        "--accept-length",
        "--model",
        model.to_str().unwrap(),
        "--ort-lib",
        "/nowhere/libonnxruntime.so.1.31.1",
        img.to_str().unwrap(),
    ]);
    assert!(e.contains("/nowhere/libonnxruntime.so.1.31.1"), "{e}");
}

#[test]
fn a_missing_precision_is_named() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("fp16only");
    ocrctl_ok(&[
        "export",
        "--checkpoint",
        "dummy:tiny",
        "--out",
        out.to_str().unwrap(),
        "--precision",
        "fp16",
    ]);
    let img = fixture().join("images/aligned.png");
    let e = ocrctl_err(&[
        "ocr",
        "--accept-length",
        "--model",
        out.to_str().unwrap(),
        img.to_str().unwrap(),
    ]);
    assert!(
        e.contains("precision fp32 was not exported") && e.contains("fp16"),
        "{e}"
    );
}

#[test]
fn a_missing_pdfium_library_is_named_with_the_fix() {
    let model = exported();
    let pdf = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pdf/two_pages.pdf");
    let e = ocrctl_err(&[
        "ocr",
        "--accept-length",
        "--model",
        model.to_str().unwrap(),
        "--pdfium-lib",
        "/nowhere/libpdfium.so",
        pdf.to_str().unwrap(),
    ]);
    assert!(
        e.contains(&pdf.display().to_string())
            && e.contains("/nowhere/libpdfium.so")
            && e.contains("scripts/setup.sh"),
        "{e}"
    );
    // The same through the environment variable.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ocrctl"))
        .args([
            "ocr",
            "--accept-length",
            "--model",
            model.to_str().unwrap(),
            pdf.to_str().unwrap(),
        ])
        .env("OCRCTL_PDFIUM_LIB", "/nowhere/else/libpdfium.so")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("/nowhere/else/libpdfium.so") && e.contains("OCRCTL_PDFIUM_LIB"),
        "{e}"
    );
}

/// The runtime options read `OCRCTL_*` like serve's own do (issue 12.6): a precision given only
/// through `OCRCTL_PRECISION` reaches `ocr` and `serve`.
#[test]
fn runtime_options_read_their_environment_variables() {
    let model = common::exported();
    let img = fixture().join("images/aligned.png");
    for args in [
        vec![
            "ocr",
            "--accept-length",
            "--model",
            model.to_str().unwrap(),
            img.to_str().unwrap(),
        ],
        vec!["serve", "--model", model.to_str().unwrap(), "--port", "0"],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ocrctl"))
            .args(&args)
            .env("OCRCTL_PRECISION", "int4")
            .env("OCRCTL_PROFILE", "cpu")
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            e.contains("int4") && e.contains("was not exported"),
            "{args:?}: {e}"
        );
    }
}

/// `--model` at the wrong kind of folder says what the folder is and what to run, once, with
/// no OS error printed twice (issue 12.3); `--checkpoint` at an empty folder likewise.
#[test]
fn wrong_directories_are_named_with_the_fix() {
    let img = fixture().join("images/aligned.png");
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("notes.txt");
    std::fs::write(&file, "x").unwrap();
    let empty = d.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let cases: [(&Path, &str); 4] = [
        (
            &checkpoint(),
            "is a checkpoint, not an export: run `ocrctl export --checkpoint",
        ),
        (&d.path().join("missing"), "no such directory"),
        (&file, "is a file"),
        (&empty, "is not an ocrctl export (it has no ocrctl.json)"),
    ];
    for (model, want) in cases {
        let e = ocrctl_err(&[
            "ocr",
            "--accept-length",
            "--model",
            model.to_str().unwrap(),
            img.to_str().unwrap(),
        ]);
        assert!(e.contains(want), "{}: {e}", model.display());
        assert!(!e.contains("os error"), "{e}");
    }
    let e = ocrctl_err(&[
        "export",
        "--checkpoint",
        empty.to_str().unwrap(),
        "--out",
        d.path().join("out").to_str().unwrap(),
    ]);
    assert!(e.contains("not a checkpoint (no config.json)"), "{e}");
    // An OS error that is the cause is printed once.
    let e = ocrctl_err(&[
        "ocr",
        "--accept-length",
        "--model",
        exported().to_str().unwrap(),
        "--precision",
        "fp32",
        d.path().join("nope.png").to_str().unwrap(),
    ]);
    assert_eq!(e.matches("No such file or directory").count(), 1, "{e}");
}

/// What used to be accepted silently gets an error or a one-line notice (issue 12.5).
#[test]
fn silent_acceptance_is_gone() {
    let model = exported();
    let m = model.to_str().unwrap();
    let img = fixture().join("images/aligned.png");
    let i = img.to_str().unwrap();
    let d = tempfile::tempdir().unwrap();
    let empty = d.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let e = ocrctl_err(&["ocr", "--model", m, empty.to_str().unwrap()]);
    assert!(e.contains("no image or PDF file in this folder"), "{e}");
    let e = ocrctl_err(&["ocr", "--model", m, "--max-tokens", "0", i]);
    assert!(e.contains("--max-tokens must be at least 1"), "{e}");
    let out_dir = d.path().join("md");
    let e = ocrctl_err(&[
        "ocr",
        "--accept-length",
        "--model",
        m,
        "--json",
        "--out",
        out_dir.to_str().unwrap(),
        i,
    ]);
    assert!(e.contains("--json") && e.contains("--out"), "{e}");
    let e = ocrctl_err(&[
        "export",
        "--checkpoint",
        checkpoint().to_str().unwrap(),
        "--out",
        d.path().join("x").to_str().unwrap(),
        "--block-size",
        "64",
    ]);
    assert!(e.contains("--block-size applies to int4"), "{e}");
    // A second run over the same --out says it replaces the files; a single image gets the
    // summary line too.
    let run = || {
        common::ocrctl(&[
            "ocr",
            "--accept-length",
            "--model",
            m,
            "--precision",
            "fp32",
            "--max-tokens",
            "2",
            "--out",
            out_dir.to_str().unwrap(),
            i,
        ])
    };
    let first = run();
    let err = String::from_utf8_lossy(&first.stderr);
    assert!(
        first.status.success() && err.contains("1 document(s), 1 page(s)"),
        "{err}"
    );
    assert!(!err.contains("will be replaced"), "{err}");
    let second = run();
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        err.contains("1 existing .md file(s)") && err.contains("--resume"),
        "{err}"
    );
}

/// The quick-start export (fp32, fp16) runs under every profile: a profile whose precision
/// was not exported falls back to the closest exported one with one line saying so (issue
/// 12.2); an explicit --precision is never replaced. Negative numbers reach the validation.
#[test]
fn profiles_fall_back_to_an_exported_precision() {
    let m = exported().to_str().unwrap().to_string();
    let img = fixture().join("images/aligned.png");
    for (profile, want) in [("cpu", "using fp32"), ("16gb", "using fp16")] {
        let out = common::ocrctl(&[
            "ocr",
            "--accept-length",
            "--model",
            &m,
            "--profile",
            profile,
            "--max-tokens",
            "2",
            img.to_str().unwrap(),
        ]);
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{profile}: {e}");
        assert!(
            e.contains(want) && e.contains("was not exported"),
            "{profile}: {e}"
        );
    }
    let e = ocrctl_err(&[
        "ocr",
        "--accept-length",
        "--model",
        &m,
        "--precision",
        "int4",
        img.to_str().unwrap(),
    ]);
    assert!(e.contains("int4") && e.contains("was not exported"), "{e}");
    let e = ocrctl_err(&[
        "ocr",
        "--accept-length",
        "--model",
        &m,
        "--temperature",
        "-1",
        img.to_str().unwrap(),
    ]);
    assert!(
        e.contains("--temperature must be a finite number >= 0"),
        "{e}"
    );
}

/// Tables stay aligned with long names, the eval summary's cosine is the mean with the
/// minimum on its own row, and doctor without a GPU does not ask for a larger one (12.6).
#[test]
fn reports_are_aligned_and_say_what_they_mean() {
    let m = exported().to_str().unwrap().to_string();
    let imgs: Vec<String> = ["aligned.png", "wide_downscale.png"]
        .iter()
        .map(|f| fixture().join("images").join(f).display().to_string())
        .collect();
    let mut args = vec![
        "eval",
        "--reference",
        &m,
        "--reference-precision",
        "fp32",
        "--candidate",
        &m,
        "--candidate-precision",
        "fp16",
        "--steps",
        "4",
    ];
    args.extend(imgs.iter().map(String::as_str));
    let out = ocrctl_ok(&args);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 5, "{out}");
    assert!(
        lines[3].starts_with("mean ") && lines[4].starts_with("min "),
        "{out}"
    );
    let width = lines[0].len();
    assert!(
        lines.iter().all(|l| l.len() == width),
        "columns misaligned:\n{out}"
    );
    let doctor = common::ocrctl(&["doctor"]);
    let text = String::from_utf8_lossy(&doctor.stdout);
    if text.contains("GPU            none found") {
        assert!(!text.contains("needs a larger GPU"), "{text}");
        assert!(text.contains("needs an NVIDIA GPU (none found)"), "{text}");
    }
}

/// ONNX Runtime's own error is reported once, plain, not again by its logger with colour codes
/// (issue 12.3).
#[test]
fn onnx_runtime_errors_are_printed_once_without_colour() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("m");
    export_fixture(&m, &["--decoder", "merged"]);
    let onnx = m.join("onnx/decoder_model_merged.onnx");
    let bytes = std::fs::read(&onnx).unwrap();
    std::fs::write(&onnx, &bytes[..100]).unwrap();
    let img = fixture().join("images/aligned.png");
    let e = ocrctl_err(&[
        "ocr",
        "--accept-length",
        "--model",
        m.to_str().unwrap(),
        "--no-verify",
        img.to_str().unwrap(),
    ]);
    assert_eq!(e.matches("Protobuf parsing failed").count(), 1, "{e}");
    assert!(!e.contains('\u{1b}'), "colour codes: {e:?}");
}

#[test]
fn kv_cache_flags_that_cannot_work_are_named() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("o");
    let run = |extra: &[&str]| export_fixture_err(&out, extra);
    let e = run(&["--kv-cache", "int8"]);
    assert!(e.contains("--kv-scale"), "{e}");
    let e = run(&["--kv-cache", "fp4"]);
    assert!(e.contains("`fp4`") && e.contains("fp8"), "{e}");
    let e = run(&["--kv-cache", "fp8", "--kv-scale", "0"]);
    assert!(e.contains("--kv-scale"), "{e}");
    let e = run(&["--kv-cache", "fp8", "--decoder", "merged"]);
    assert!(e.contains("--decoder gqa"), "{e}");
    assert!(!out.exists());
}

/// Issue 41 item 8: `on|off` switches list `on, off` (not clap's `true, false`) and
/// `--providers` lists every provider, `tensorrt-rtx` included, in `ocr -h` and `serve -h`.
#[test]
fn help_lists_on_off_switches_and_every_provider() {
    for cmd in ["ocr", "serve"] {
        let help = ocrctl_ok(&[cmd, "-h"]);
        assert!(!help.contains("true, false"), "{cmd} -h:\n{help}");
        for flag in ["--cuda-graphs", "--vision-stage", "--prefill-stage"] {
            let line = help
                .lines()
                .skip_while(|l| !l.trim_start().starts_with(flag))
                .find(|l| l.contains("possible values"))
                .unwrap_or_else(|| panic!("{cmd} -h: no values for {flag}:\n{help}"));
            assert!(line.contains("[possible values: on, off]"), "{line}");
        }
        assert!(
            help.contains("[possible values: tensorrt-rtx, tensorrt, cuda, cpu]"),
            "{cmd} -h:\n{help}"
        );
    }
}
