//! The experimental paged decoder (`ocrctl export --decoder paged`, PagedAttention over a KV
//! cache in blocks): its graphs give the GQA decoder's logits for sequences sharing calls
//! (prompts, a chunked prompt and decode tokens together, blocks scattered), checked by
//! `scripts/check_paged.py` with numpy's PagedAttention, since ONNX Runtime runs that op on
//! CUDA only; and it is refused, naming why, where it cannot run.

mod common;
use common::*;
use std::process::Command;

/// Whether `scripts/check_paged.py` can run (it needs `onnx.reference`); a skipped test says so.
fn can_check(test: &str) -> bool {
    let has_onnx = runs(venv_python(), &["-c", "import onnx.reference"]);
    require_tool(test, "onnx in .venv", has_onnx, "scripts/setup.sh --test")
}

/// `scripts/check_paged.py` on `export` at `precision`: it passes, having compared every
/// sequence of every call, on the graph whose attention is `heads` ("4 query heads over 2 KV
/// heads").
fn check_paged(export: &std::path::Path, precision: &str, heads: &str) {
    let run = Command::new(venv_python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/check_paged.py"
        ))
        .arg(export)
        .args(["--precision", precision])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{precision}:\n{text}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    // Five calls of three sequences, each compared.
    assert_eq!(text.matches("token =").count(), 15, "{text}");
    assert!(text.contains("all equal within tolerance"), "{text}");
    assert!(text.contains(heads), "{text}");
}

#[test]
fn the_paged_decoder_gives_the_gqa_decoders_logits() {
    if !can_check("the_paged_decoder_gives_the_gqa_decoders_logits") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("export");
    export_fixture(
        &out,
        &["--precision", "fp16,int4-fp16", "--decoder", "gqa,paged"],
    );
    for precision in ["fp16", "int4-fp16"] {
        check_paged(&out, precision, "4 query heads over 2 KV heads");
    }
}

/// The query heads padded as for an 8-bit cache (4 per KV head instead of the fixture's 2;
/// zero rows in q_proj, zero columns in o_proj) in both graphs, over the exact float16 cache:
/// the padded paged graph gives the padded GQA graph's logits, which `tests/gqa.rs` checks
/// against the reference.
#[test]
fn the_paged_decoder_with_padded_query_heads_gives_the_gqa_decoders_logits() {
    use ocrctl_exporters::export::{DecoderVariant, ExportOptions, Precision};
    if !can_check("the_paged_decoder_with_padded_query_heads_gives_the_gqa_decoders_logits") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("padded");
    let opts = ExportOptions {
        precisions: vec![Precision::Fp16],
        decoders: vec![DecoderVariant::Gqa, DecoderVariant::Paged],
        pad_query_heads: true,
        ..ExportOptions::new(checkpoint().to_string_lossy().into(), out.clone())
    };
    ocrctl_exporters::export::export(&opts, &mut |_| {}).expect("export");
    check_paged(&out, "fp16", "8 query heads over 2 KV heads");
}

#[test]
fn the_paged_decoder_is_refused_where_it_cannot_run() {
    let dir = tempfile::tempdir().unwrap();
    let err = export_fixture_err(
        &dir.path().join("f32"),
        &["--precision", "fp32", "--decoder", "paged"],
    );
    assert!(
        err.contains("PagedAttention") && err.contains("--precision fp16 or int4-fp16"),
        "{err}"
    );
    let err = export_fixture_err(
        &dir.path().join("trt"),
        &[
            "--precision",
            "fp16",
            "--decoder",
            "paged",
            "--target",
            "tensorrt",
        ],
    );
    assert!(err.contains("--target ort"), "{err}");
    // An export with only the paged decoder, on the CPU: ocr says it runs on CUDA only.
    let out = dir.path().join("paged");
    export_fixture(&out, &["--precision", "fp16", "--decoder", "paged"]);
    let image = fixture().join("images").join("photo.jpg");
    let err = ocrctl_err(&[
        "ocr",
        "--model",
        out.to_str().unwrap(),
        "--precision",
        "fp16",
        image.to_str().unwrap(),
    ]);
    assert!(
        err.contains("decoder_model_paged")
            && err.contains("CUDA provider only")
            && err.contains("--decoder gqa"),
        "{err}"
    );
}
