//! INT4 exports of the fixture: ONNX Runtime's fusion into MatMulNBits, equality of the two
//! INT4 layouts, an end-to-end run against committed expectations, and bad settings.

mod common;
use common::*;
use ocrctl::generation::engine::Engine;
use ocrctl::model::preprocess::{self, PreprocessConfig};
use ocrctl::model::prompt::Prompter;
use ocrctl::runtime::ortmodel::{write_optimized_graph, LoadOptions, OrtModel};
use ocrctl_exporters::export::{Manifest, Precision};
use ocrctl_exporters::proto::read::summarize;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// One image's greedy ids and each step's top-5 (id, logprob).
type Run = (Vec<u32>, Vec<Vec<(u32, f32)>>);

/// Greedy ids and top-5 logprobs for every fixture image with the given model.
fn run_all(dir: &Path, precision: Precision, accuracy_level: u8, steps: usize) -> Vec<Run> {
    let mut lo = LoadOptions::new(precision);
    lo.accuracy_level = accuracy_level;
    let m = OrtModel::load(dir, &lo).unwrap();
    let cfg = m.manifest.model.clone();
    let mut engine = Engine::new(m, 1, cfg.image_token_id);
    let prompter = Prompter::from_model_dir(dir, cfg.image_token_id).unwrap();
    let pre = PreprocessConfig::from_model_dir(dir, 14, 2).unwrap();
    fixture_images()
        .iter()
        .map(|f| {
            let img = preprocess::load_image(f, preprocess::DEFAULT_MAX_PIXELS).unwrap();
            let p = preprocess::preprocess(&img, &pre);
            let ids = prompter.encode(&[p.num_image_tokens], None).unwrap();
            let g = engine_greedy(&mut engine, ids, p.pixel_values, steps);
            let top = g
                .top_logprobs
                .iter()
                .map(|s| s.iter().map(|t| (t.id, t.logprob)).collect())
                .collect();
            (g.token_ids, top)
        })
        .collect()
}

fn fixture_images() -> Vec<PathBuf> {
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture().join("golden/golden.json")).unwrap(),
    )
    .unwrap();
    golden["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| fixture().join(i["file"].as_str().unwrap()))
        .collect()
}

#[test]
fn ort_fuses_dequantize_matmul_into_matmulnbits_on_cpu() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("q");
    export_fixture(&out, &["--precision", "int4"]);
    let cfg = Manifest::load(&out).unwrap().model;
    // Quantized Linears: 7 per vision layer + 3 in the projector; 4 per decoder layer (Q/K/V
    // and gate/up packed into one matrix each, `layers::linears_packed`) + lm_head.
    let expect = [
        ("vision_encoder_q4.onnx", 7 * cfg.vision.num_layers + 3),
        ("decoder_model_merged_q4.onnx", 4 * cfg.text.num_layers + 1),
    ];
    for (file, n) in expect {
        let raw = std::fs::read(out.join("onnx").join(file)).unwrap();
        let (nodes, _) = summarize(&raw).unwrap();
        assert_eq!(
            nodes
                .iter()
                .filter(|n| n.op_type == "DequantizeLinear")
                .count(),
            n,
            "{file} as written"
        );
        let opt = d.path().join(format!("opt-{file}"));
        write_optimized_graph(
            &out.join("onnx").join(file),
            &opt,
            &LoadOptions::new(Precision::Int4),
        )
        .unwrap();
        let (nodes, inits) = summarize(&std::fs::read(&opt).unwrap()).unwrap();
        let count = |op: &str| nodes.iter().filter(|x| x.op_type == op).count();
        assert_eq!(
            count("MatMulNBits"),
            n,
            "{file}: every DequantizeLinear+MatMul pair fused"
        );
        assert_eq!(
            count("DequantizeLinear"),
            0,
            "{file}: no dequantization left"
        );
        // No weight was folded back to float: every float initializer is small (norms,
        // the patch conv, RoPE tables), none has a Linear weight's size.
        let linear_sizes = [
            cfg.text.hidden_size * cfg.text.intermediate_size,
            cfg.text.hidden_size * cfg.text.num_heads * cfg.text.head_dim,
            cfg.vision.hidden_size * cfg.vision.intermediate_size,
        ];
        for i in inits
            .iter()
            .filter(|i| i.data_type == 1 || i.data_type == 10)
        {
            assert!(
                !linear_sizes.contains(&(i.elements as usize)),
                "{file}: float weight {} ({} elements)",
                i.name,
                i.elements
            );
        }
    }
}

#[test]
fn qdq_and_matmulnbits_layouts_give_identical_outputs() {
    let d = tempfile::tempdir().unwrap();
    let (qdq, nbits) = (d.path().join("qdq"), d.path().join("nbits"));
    export_fixture(&qdq, &["--precision", "int4", "--block-size", "32"]);
    export_fixture(
        &nbits,
        &[
            "--precision",
            "int4",
            "--block-size",
            "32",
            "--int4-format",
            "matmulnbits",
            "--accuracy-level",
            "0",
        ],
    );
    let a = run_all(&qdq, Precision::Int4, 0, 12);
    let b = run_all(&nbits, Precision::Int4, 0, 12);
    assert_eq!(
        a, b,
        "same integers and scales, same fused kernel: identical tokens and logprobs"
    );
}

#[test]
fn int4_end_to_end_matches_the_committed_measurement() {
    // tests/fixtures/tiny-lightonocr/int4_expected.json was measured once with
    // scripts/measure_int4_fixture.sh (block 32, QDQ, round-to-nearest, accuracy level 0).
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture().join("int4_expected.json")).unwrap(),
    )
    .unwrap();
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("m");
    export_fixture(&out, &["--precision", "fp32,int4", "--block-size", "32"]);
    let fp32 = run_all(&out, Precision::Fp32, 0, 40);
    let int4 = run_all(&out, Precision::Int4, 0, 40);
    for (i, want) in expected["images"].as_array().unwrap().iter().enumerate() {
        let ids: Vec<u32> = want["int4_greedy_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(int4[i].0, ids, "image {i}: int4 greedy ids");
        let agree = fp32[i]
            .0
            .iter()
            .zip(&int4[i].0)
            .take_while(|(a, b)| a == b)
            .count();
        assert_eq!(
            agree as u64,
            want["agreement_with_fp32"].as_u64().unwrap(),
            "image {i}: agreement length"
        );
    }
}

#[test]
fn bad_block_sizes_are_refused_before_anything_is_written() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("q");
    let ck = checkpoint();
    let base = [
        "export",
        "--checkpoint",
        ck.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--precision",
        "int4",
    ];
    let e = ocrctl_err(&[&base[..], &["--block-size", "48"]].concat());
    assert!(
        e.contains("block size 48") && e.contains("power of two"),
        "{e}"
    );
    let e = ocrctl_err(&[&base[..], &["--block-size", "8"]].concat());
    assert!(e.contains("block size 8"), "{e}");
    // The fixture's text hidden size (96) is not a multiple of 64.
    let e = ocrctl_err(&[&base[..], &["--block-size", "64"]].concat());
    assert!(
        e.contains("does not divide") && e.contains("text hidden_size"),
        "{e}"
    );
    let e = ocrctl_err(
        &[
            &base[..],
            &["--target", "tensorrt", "--int4-format", "matmulnbits"],
        ]
        .concat(),
    );
    assert!(e.contains("TensorRT"), "{e}");
    assert!(!out.exists());
}

#[test]
fn calibration_needs_readable_images() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("q");
    let empty = d.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let ck = checkpoint();
    let base = [
        "export",
        "--checkpoint",
        ck.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--precision",
        "int4",
    ];
    let e = ocrctl_err(&[&base[..], &["--calibrate", empty.to_str().unwrap()]].concat());
    assert!(e.contains("no image files") && e.contains("empty"), "{e}");
    std::fs::write(empty.join("broken.png"), b"not an image").unwrap();
    let e = ocrctl_err(&[&base[..], &["--calibrate", empty.to_str().unwrap()]].concat());
    assert!(e.contains("could be read"), "{e}");
    let e = ocrctl_err(&[
        "export",
        "--checkpoint",
        ck.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--calibrate",
        empty.to_str().unwrap(),
    ]);
    assert!(
        e.contains("--calibrate applies to int4") && e.contains("8-bit KV cache"),
        "{e}"
    );
    assert!(!out.exists());
    let left: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(".ocrctl-calib"))
        .collect();
    assert!(left.is_empty(), "calibration scratch directory removed");
}

#[test]
fn awq_scales_are_folded_correctly_and_never_lose_to_rtn_on_the_proxy() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("awq");
    let calib = d.path().join("calib");
    std::fs::create_dir(&calib).unwrap();
    for f in fixture_images().iter().take(2) {
        std::fs::copy(f, calib.join(f.file_name().unwrap())).unwrap();
    }
    export_fixture(
        &out,
        &[
            "--precision",
            "int4",
            "--calibrate",
            calib.to_str().unwrap(),
        ],
    );
    let m = Manifest::load(&out).unwrap();
    let choices = m.awq.expect("manifest records the AWQ choices");
    let cfg = &m.model;
    assert_eq!(
        choices.len(),
        3 * (cfg.vision.num_layers + cfg.text.num_layers)
    );
    for c in &choices {
        assert!(
            c.awq_error <= c.rtn_error,
            "{}: {} > {}",
            c.first_weight,
            c.awq_error,
            c.rtn_error
        );
    }
    assert!(
        choices.iter().any(|c| c.alpha > 0.0),
        "some group benefits from scaling"
    );
    // The scales are folded correctly (a wrong fold garbles the model): the calibrated int4
    // model reads every fixture image exactly like the reference, up to and including EOS.
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture().join("golden/golden.json")).unwrap(),
    )
    .unwrap();
    let r = run_all(&out, Precision::Int4, 0, 12);
    for (im, (ids, _)) in golden["images"].as_array().unwrap().iter().zip(&r) {
        let n = im["steps_until_eos"].as_u64().unwrap() as usize + 1;
        let want: Vec<u32> = im["greedy_ids"].as_array().unwrap()[..n]
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(&ids[..n], &want[..], "{}", im["stem"]);
    }
}
