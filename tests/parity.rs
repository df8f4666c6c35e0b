//! Parity with the transformers reference on the committed tiny fixture.
//!
//! `tests/fixtures/tiny-lightonocr/golden/` holds what transformers computed from the
//! committed checkpoint (see `scripts/make_fixture.py`): pixel values, image features, and
//! 40 greedy steps with their top-5 log-probabilities per image. Here the fixture is
//! exported with `ocrctl export` and run with ONNX Runtime on the CPU.
//!
//! Tolerances: fp32 top-5 log-probabilities within [`FP32_LOGPROB_TOL`] and exact greedy ids;
//! fp16 within [`FP16_LOGPROB_TOL`] with exact greedy ids (float16 weights and activations,
//! norms and softmax in float32).

mod common;
use common::golden::{check_top5, golden, ids};
use common::*;
use ocrctl::generation::engine::Engine;
use ocrctl::model::preprocess::{self, PreprocessConfig};
use ocrctl::model::prompt::Prompter;
use ocrctl::runtime::backend::Backend;
use ocrctl::runtime::ortmodel::{LoadOptions, OrtModel};
use ocrctl_exporters::export::{DecoderVariant, Precision};
use serde_json::Value;

/// Largest allowed |Δ| of an image feature, fp32 (features reach ~57 in the fixture).
pub const FP32_FEATURE_TOL: f32 = 1e-4;
/// Largest allowed |Δ| of an image feature, fp16 (≈ 1e-3 relative at the fixture's scale).
pub const FP16_FEATURE_TOL: f32 = 0.06;
/// Largest allowed |Δ logprob| of a top-5 token, fp32.
pub const FP32_LOGPROB_TOL: f32 = 1e-3;
/// Largest allowed |Δ logprob| of a top-5 token, fp16.
pub const FP16_LOGPROB_TOL: f32 = 0.05;

fn load(precision: Precision) -> OrtModel {
    // The merged decoder; tests/gqa.rs checks the GQA decoder against the same goldens.
    let opts = LoadOptions {
        decoder: Some(DecoderVariant::Merged),
        ..LoadOptions::new(precision)
    };
    OrtModel::load(exported(), &opts).expect("model loads")
}

#[test]
fn preprocessing_reproduces_the_reference_pixels() {
    let g = golden();
    let cfg = PreprocessConfig::from_model_dir(&checkpoint(), 14, 2).unwrap();
    for im in g.images() {
        let stem = im["stem"].as_str().unwrap();
        let mut img = preprocess::load_image(
            &fixture().join(im["file"].as_str().unwrap()),
            preprocess::DEFAULT_MAX_PIXELS,
        )
        .unwrap();
        // JPEG decoders may differ by a level or two (IDCT rounding): where the reference
        // recorded Pillow's decoded pixels, check ours against them, then preprocess
        // Pillow's pixels so the resize and normalisation are compared exactly.
        let decoded = format!("decoded_rgb.{stem}");
        if let Some(shape) = g.tensors.shape(&decoded).map(|s| s.to_vec()) {
            let pil = g.tensors.get_u8(&decoded, &shape).unwrap();
            assert_eq!(shape, vec![img.height() as usize, img.width() as usize, 3]);
            let worst = img
                .as_raw()
                .iter()
                .zip(&pil)
                .map(|(a, b)| a.abs_diff(*b))
                .max()
                .unwrap();
            assert!(
                worst <= 4,
                "{stem}: our JPEG decode differs from Pillow's by {worst} levels"
            );
            img = image::RgbImage::from_raw(img.width(), img.height(), pil).unwrap();
        }
        let p = preprocess::preprocess(&img, &cfg);
        let want = g.pixel_values(stem);
        let got = p.pixel_values.to_array();
        assert_eq!(got.shape(), want.shape(), "{stem}: processed size");
        assert_eq!(
            p.num_image_tokens as u64,
            im["num_image_tokens"].as_u64().unwrap(),
            "{stem}"
        );
        let d = max_abs_diff(got.as_slice().unwrap(), want.as_slice().unwrap());
        assert!(d <= 1e-6, "{stem}: pixel values differ by {d}");
    }
}

#[test]
fn prompt_ids_match_the_reference() {
    let g = golden();
    let image_token = g.json["image_token_id"].as_u64().unwrap() as u32;
    let p = Prompter::from_model_dir(exported(), image_token).unwrap();
    for im in g.images() {
        let n = im["num_image_tokens"].as_u64().unwrap() as usize;
        assert_eq!(
            p.encode(&[n], None).unwrap(),
            ids(&im["prompt_ids"]),
            "{}",
            im["stem"]
        );
    }
}

fn check_features(precision: Precision, tol: f32) -> f32 {
    let g = golden();
    let mut m = load(precision);
    let mut worst = 0f32;
    for im in g.images() {
        let stem = im["stem"].as_str().unwrap();
        // The reference's own pixels, as float32.
        let pixels = preprocess::Pixels::dense(g.pixel_values(stem));
        let got = m.encode_image(&pixels).unwrap();
        let want = g.features(stem);
        assert_eq!(got.shape(), want.shape(), "{stem}");
        let d = max_abs_diff(got.as_slice().unwrap(), want.as_slice().unwrap());
        let scale = want.iter().fold(0f32, |a, x| a.max(x.abs()));
        assert!(
            d <= tol,
            "{stem}: image features differ by {d} (scale {scale})"
        );
        worst = worst.max(d);
    }
    eprintln!("{precision:?}: max image-feature difference {worst}");
    worst
}

#[test]
fn fp32_image_features_match_the_reference() {
    check_features(Precision::Fp32, FP32_FEATURE_TOL);
}

#[test]
fn fp16_image_features_match_the_reference() {
    check_features(Precision::Fp16, FP16_FEATURE_TOL);
}

/// Runs every fixture image end to end (our preprocessing, prompt, graphs, the engine the
/// product runs) for 40 greedy steps and compares ids and top-5 log-probabilities with the
/// reference.
fn check_generation(precision: Precision, tol: f32) {
    let g = golden();
    let image_token = g.json["image_token_id"].as_u64().unwrap() as u32;
    let mut engine = Engine::new(load(precision), 1, image_token);
    let prompter = Prompter::from_model_dir(exported(), image_token).unwrap();
    let cfg = PreprocessConfig::from_model_dir(exported(), 14, 2).unwrap();
    let mut worst = 0f32;
    for im in g.images() {
        let stem = im["stem"].as_str().unwrap();
        let want_ids = ids(&im["greedy_ids"]);
        // JPEG: Pillow's decoded pixels (our decoder's ±levels are checked separately), so
        // the tolerance below measures the model, not the JPEG decoder.
        let img = g.reference_image(im);
        let p = preprocess::preprocess(&img, &cfg);
        let prompt = prompter.encode(&[p.num_image_tokens], None).unwrap();
        let out = engine_greedy(&mut engine, prompt, p.pixel_values, want_ids.len());
        assert_eq!(
            out.token_ids, want_ids,
            "{stem} ({precision:?}): greedy ids"
        );
        worst = worst.max(check_top5(stem, &out.top_logprobs, &im["top5"], tol));
        // The reference decodes every generated id, special tokens included.
        let text = prompter.decode(&out.token_ids, false).unwrap();
        assert_eq!(
            text,
            im["greedy_text"].as_str().unwrap(),
            "{stem}: decoded text"
        );
    }
    eprintln!("{precision:?}: max top-5 logprob difference {worst}");
}

#[test]
fn fp32_greedy_generation_matches_the_reference() {
    check_generation(Precision::Fp32, FP32_LOGPROB_TOL);
}

#[test]
fn fp16_greedy_generation_matches_the_reference() {
    check_generation(Precision::Fp16, FP16_LOGPROB_TOL);
}

#[test]
fn the_cli_prints_the_reference_tokens_and_text() {
    let g = golden();
    let im = &g.images()[0];
    let n = ids(&im["greedy_ids"]).len().to_string();
    let file = fixture().join(im["file"].as_str().unwrap());
    let out = ocrctl_ok(&[
        "ocr",
        "--accept-length",
        "--model",
        exported().to_str().unwrap(),
        "--max-tokens",
        &n,
        "--temperature",
        "0",
        "--top-logprobs",
        "5",
        "--ignore-eos",
        "--json",
        file.to_str().unwrap(),
    ]);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(ids(&v["token_ids"]), ids(&im["greedy_ids"]));
    assert_eq!(
        v["top_logprobs"].as_array().unwrap().len(),
        ids(&im["greedy_ids"]).len()
    );
    assert_eq!(v["image_tokens"], im["num_image_tokens"]);
    // Without --ignore-eos the text stops at the first end-of-sequence token.
    let out = ocrctl_ok(&[
        "ocr",
        "--accept-length",
        "--temperature",
        "0",
        "--model",
        exported().to_str().unwrap(),
        "--max-tokens",
        &n,
        "--json",
        file.to_str().unwrap(),
    ]);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        v["text"].as_str().unwrap(),
        im["greedy_until_eos_text"].as_str().unwrap()
    );
}

/// The export's processor files make onnx-community readers (transformers.js,
/// fast-lightonocr) build LightOnOCR's prompt: no Pixtral row-break or image-end tokens
/// (the checkpoint's file names them), and a `preprocessor_config.json` with the image settings.
#[test]
fn the_exported_processor_files_give_consumers_lightonocrs_prompt() {
    let read = |n: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(exported().join(n)).unwrap()).unwrap()
    };
    let source: Value = serde_json::from_str(
        &std::fs::read_to_string(checkpoint().join("processor_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(source["image_break_token"], "<|vision_pad|>");
    let p = read("processor_config.json");
    assert_eq!(
        (
            p["image_break_token"].as_str(),
            p["image_end_token"].as_str()
        ),
        (Some(""), Some(""))
    );
    assert_eq!(p["image_processor"], source["image_processor"]);
    let pre = read("preprocessor_config.json");
    assert_eq!(
        pre["image_processor_type"],
        source["image_processor"]["image_processor_type"]
    );
    assert_eq!(pre["patch_size"], 14);
}
