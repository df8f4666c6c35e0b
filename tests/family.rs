//! The LightOnOCR family beyond LightOnOCR-2-1B's layout (issue 38): tiny fixtures of the
//! v1 layout (LightOnOCR-1B-1025) and of the pruned-vocabulary layout
//! (LightOnOCR-0.9B-16k-1025), made by `scripts/make_family_fixtures.py` with
//! transformers goldens. Each is exported from its hub layout as shipped and run with ONNX
//! Runtime on the CPU: pixels exact, prompt ids exact, features within 1e-4, 40 greedy ids
//! exact and top-5 log-probabilities within 1e-3 (fp32, as tests/parity.rs); the export
//! names the variant (`ocrctl.json`, `ocrctl doctor --model`) and its processor files are
//! complete.

mod common;
use common::golden::{check_top5, ids, Golden};
use common::*;
use ocrctl::generation::engine::Engine;
use ocrctl::model::preprocess::{self, PreprocessConfig};
use ocrctl::model::prompt::Prompter;
use ocrctl::runtime::backend::Backend;
use ocrctl::runtime::ortmodel::{LoadOptions, OrtModel};
use ocrctl_exporters::checkpoint::Checkpoint;
use ocrctl_exporters::export::{DecoderVariant, Precision};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Largest allowed |Δ| of an image feature, fp32 (as tests/parity.rs).
const FEATURE_TOL: f32 = 1e-4;
/// Largest allowed |Δ logprob| of a top-5 token, fp32 (as tests/parity.rs).
const LOGPROB_TOL: f32 = 1e-3;

fn family(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/family")
        .join(name)
}

fn golden_of(fixture: &Path) -> Golden {
    let dir = fixture.join("golden");
    let json =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    let tensors = Checkpoint::open_files(vec![dir.join("golden.safetensors")]).unwrap();
    Golden { json, tensors }
}

fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Exports fixture `name` (fp32, the merged decoder) into a temporary directory.
fn export(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join(name);
    let ck = family(name).join("checkpoint");
    ocrctl_ok(&[
        "export",
        "--checkpoint",
        ck.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--precision",
        "fp32",
    ]);
    (tmp, out)
}

/// Everything the product computes on the fixture's images against the goldens.
fn check_parity(name: &str, exported: &Path) {
    let fixture = family(name);
    let g = golden_of(&fixture);
    let image_token = g.json["image_token_id"].as_u64().unwrap() as u32;
    let opts = LoadOptions {
        decoder: Some(DecoderVariant::Merged),
        ..LoadOptions::new(Precision::Fp32)
    };
    let mut model = OrtModel::load(exported, &opts).expect("model loads");
    let prompter = Prompter::from_model_dir(exported, image_token).unwrap();
    let manifest = ocrctl_exporters::manifest::Manifest::load(exported).unwrap();
    let cfg = PreprocessConfig::for_model(exported, &manifest.model).unwrap();
    let mut worst = (0f32, 0f32);
    let mut images = Vec::new();
    for im in g.images() {
        let stem = im["stem"].as_str().unwrap().to_string();
        let img = preprocess::load_image(
            &fixture.join(im["file"].as_str().unwrap()),
            preprocess::DEFAULT_MAX_PIXELS,
        )
        .unwrap();
        let p = preprocess::preprocess(&img, &cfg);
        let want = g.pixel_values(&stem);
        let got = p.pixel_values.to_array();
        assert_eq!(got.shape(), want.shape(), "{name}/{stem}: processed size");
        let d = max_abs_diff(got.as_slice().unwrap(), want.as_slice().unwrap());
        assert!(d <= 1e-6, "{name}/{stem}: pixel values differ by {d}");
        let prompt = prompter.encode(&[p.num_image_tokens], None).unwrap();
        assert_eq!(prompt, ids(&im["prompt_ids"]), "{name}/{stem}: prompt ids");
        let feats = model.encode_image(&p.pixel_values).unwrap();
        let want = g.features(&stem);
        assert_eq!(feats.shape(), want.shape(), "{name}/{stem}");
        let d = max_abs_diff(feats.as_slice().unwrap(), want.as_slice().unwrap());
        assert!(d <= FEATURE_TOL, "{name}/{stem}: features differ by {d}");
        worst.0 = worst.0.max(d);
        images.push((stem, im.clone(), prompt, p.pixel_values));
    }
    let mut engine = Engine::new(model, 1, image_token);
    for (stem, im, prompt, pixels) in images {
        let want_ids = ids(&im["greedy_ids"]);
        let out = engine_greedy(&mut engine, prompt, pixels, want_ids.len());
        assert_eq!(out.token_ids, want_ids, "{name}/{stem}: greedy ids");
        let d = check_top5(&stem, &out.top_logprobs, &im["top5"], LOGPROB_TOL);
        worst.1 = worst.1.max(d);
        let text = prompter.decode(&out.token_ids, false).unwrap();
        assert_eq!(text, im["greedy_text"].as_str().unwrap(), "{name}/{stem}");
    }
    eprintln!(
        "{name}: max feature difference {}, max top-5 logprob difference {}",
        worst.0, worst.1
    );
}

/// `ocrctl.json`'s variant and `ocrctl doctor --model`'s line.
fn check_named(exported: &Path, generation: &str, name: &str, tokenizer_size: u64) {
    let m = read_json(&exported.join("ocrctl.json"));
    let v = &m["variant"];
    assert_eq!(v["generation"], generation, "{v}");
    assert_eq!(v["name"], name, "{v}");
    assert_eq!(v["tokenizer_size"], tokenizer_size, "{v}");
    let out = ocrctl_ok(&["doctor", "--model", exported.to_str().unwrap()]);
    let line = out
        .lines()
        .find(|l| l.starts_with("model "))
        .unwrap_or_else(|| panic!("no model line in:\n{out}"));
    assert!(line.contains(name) && line.contains("fp32"), "{line}");
}

#[test]
fn v1_layout_exports_runs_and_matches_transformers() {
    let (_tmp, out) = export("v1");
    check_named(&out, "v1", "LightOnOCR v1, vocabulary 384", 327);
    // The checkpoint's own preprocessor_config.json (the v1 image settings) is kept, with
    // what transformers.js needs: the merge size, a processor class it has (none for
    // LightOnOCR: Pixtral's); the chat template goes into tokenizer_config.json too. The
    // processor file keeps its keys, without Pixtral's row-break and image-end tokens.
    let ck = family("v1").join("checkpoint");
    let mut pre = read_json(&out.join("preprocessor_config.json"));
    let src = read_json(&ck.join("preprocessor_config.json"));
    assert_eq!(pre["spatial_merge_size"], 2);
    assert_eq!(pre["processor_class"], "PixtralProcessor");
    let o = pre.as_object_mut().unwrap();
    o.remove("spatial_merge_size");
    o.insert("processor_class".into(), src["processor_class"].clone());
    assert_eq!(pre, src);
    let tc = read_json(&out.join("tokenizer_config.json"));
    let template = std::fs::read_to_string(ck.join("chat_template.jinja")).unwrap();
    assert_eq!(tc["chat_template"].as_str(), Some(template.as_str()));
    let p = read_json(&out.join("processor_config.json"));
    assert_eq!(p["image_token"], "<|image_pad|>");
    assert_eq!(p["spatial_merge_size"], 2);
    assert_eq!(p["image_break_token"], "");
    assert_eq!(p["processor_class"], "LightOnOCRProcessor");
    check_parity("v1", &out);

    // The CLI stops at the eos ids of generation_config.json (the v1 config has none).
    let g = golden_of(&family("v1"));
    let im = &g.images()[0];
    let file = family("v1").join(im["file"].as_str().unwrap());
    let n = ids(&im["greedy_ids"]).len().to_string();
    let json = ocrctl_ok(&[
        "ocr",
        "--accept-length",
        "--model",
        out.to_str().unwrap(),
        "--max-tokens",
        &n,
        "--temperature",
        "0",
        "--ignore-eos",
        "--json",
        file.to_str().unwrap(),
    ]);
    let v: Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(ids(&v["token_ids"]), ids(&im["greedy_ids"]));
}

#[test]
fn pruned_16k_vocabulary_exports_and_matches_transformers() {
    let (_tmp, out) = export("pruned-16k");
    check_named(
        &out,
        "v1",
        "LightOnOCR v1 pruned 16k (0.9B-16k-1025), vocabulary 16 384",
        16384,
    );
    let m = read_json(&out.join("ocrctl.json"));
    assert_eq!(m["model"]["text"]["vocab_size"], 16384);
    // `image_token_index` (the pruned config's name) is the image token, id 7; no tie flag:
    // the checkpoint's own lm_head.weight (the goldens use it too).
    assert_eq!(m["model"]["image_token_id"], 7);
    assert_eq!(m["model"]["text"]["tie_word_embeddings"], false);
    // Its Pixtral break/end token (`<|box_end|>`) is cleared like v2's; its image settings
    // are read from preprocessor_config.json, whose `patch_size {height, width}` is written
    // as the bare number transformers.js multiplies.
    let p = read_json(&out.join("processor_config.json"));
    assert_eq!(p["image_break_token"], "");
    assert_eq!(p["image_end_token"], "");
    assert_eq!(p["image_token"], "<|image_pad|>");
    let pre = read_json(&out.join("preprocessor_config.json"));
    assert_eq!(pre["patch_size"], 14);
    assert_eq!(pre["spatial_merge_size"], 2);
    check_parity("pruned-16k", &out);
}

/// A `processor_config.json` that is flat (image settings at the top, no `spatial_merge_size`,
/// no `image_token`) and no `preprocessor_config.json`: the export fills both keys from
/// config.json and the tokenizer (transformers.js refuses the files otherwise) and writes the
/// preprocessor file; the model still reads the reference pixels.
#[test]
fn a_flat_processor_config_is_completed_by_the_export() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = copy_checkpoint("v1", tmp.path());
    let mut flat = read_json(&ck.join("preprocessor_config.json"));
    flat.as_object_mut().unwrap().remove("patch_size");
    std::fs::write(ck.join("processor_config.json"), flat.to_string()).unwrap();
    std::fs::remove_file(ck.join("preprocessor_config.json")).unwrap();
    let out = tmp.path().join("out");
    ocrctl_ok(&[
        "export",
        "--checkpoint",
        ck.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let p = read_json(&out.join("processor_config.json"));
    assert_eq!(p["spatial_merge_size"], 2);
    assert_eq!(p["image_token"], "<|image_pad|>");
    assert_eq!(p["patch_size"], 14);
    assert_eq!(p["size"]["longest_edge"], 1540);
    assert_eq!(p["image_break_token"], "");
    let pre = read_json(&out.join("preprocessor_config.json"));
    assert_eq!(pre["spatial_merge_size"], 2);
    assert_eq!(pre["processor_class"], "PixtralProcessor");
    let g = golden_of(&family("v1"));
    let m = ocrctl_exporters::manifest::Manifest::load(&out).unwrap();
    let cfg = PreprocessConfig::for_model(&out, &m.model).unwrap();
    for im in g.images() {
        let stem = im["stem"].as_str().unwrap();
        let img = preprocess::load_image(
            &family("v1").join(im["file"].as_str().unwrap()),
            preprocess::DEFAULT_MAX_PIXELS,
        )
        .unwrap();
        let got = preprocess::preprocess(&img, &cfg).pixel_values.to_array();
        let want = g.pixel_values(stem);
        assert_eq!(got.shape(), want.shape(), "{stem}");
        let d = max_abs_diff(got.as_slice().unwrap(), want.as_slice().unwrap());
        assert!(d <= 1e-6, "{stem}: pixel values differ by {d}");
    }
}

/// Copies fixture `name`'s checkpoint under `dir`; returns the copy.
fn copy_checkpoint(name: &str, dir: &Path) -> PathBuf {
    let ck = dir.join("ck");
    std::fs::create_dir(&ck).unwrap();
    for e in std::fs::read_dir(family(name).join("checkpoint")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), ck.join(e.file_name())).unwrap();
    }
    ck
}

/// A pruned config with a tokenizer of another vocabulary is refused, naming the file.
#[test]
fn a_tokenizer_outside_the_configs_vocabulary_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = copy_checkpoint("v1", tmp.path());
    // v1's tokenizer (ids up to 326) under a config that claims 300 entries.
    let mut cfg = read_json(&ck.join("config.json"));
    cfg["text_config"]["vocab_size"] = 300.into();
    cfg["image_token_id"] = 299.into();
    std::fs::write(ck.join("config.json"), cfg.to_string()).unwrap();
    let out = tmp.path().join("out");
    let err = ocrctl_err(&[
        "export",
        "--checkpoint",
        ck.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        err.contains("tokenizer.json") && err.contains("vocab_size 300"),
        "{err}"
    );
    assert!(!out.exists());
}

/// LightOnOCR-2's layout (the trained fixture) is named v2; a snapshot in the Hugging Face
/// cache is named by its repository.
#[test]
fn v2_and_hub_snapshots_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("v2");
    let v2 = checkpoint();
    ocrctl_ok(&[
        "export",
        "--checkpoint",
        v2.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    check_named(&out, "v2", "LightOnOCR v2, vocabulary 384", 327);

    let snap = tmp
        .path()
        .join("hub/models--lightonai--LightOnOCR-1B-1025/snapshots/0123abcd");
    std::fs::create_dir_all(&snap).unwrap();
    copy_checkpoint("v1", &snap);
    let ck = snap.join("ck");
    for e in std::fs::read_dir(&ck).unwrap() {
        let e = e.unwrap();
        std::fs::rename(e.path(), snap.join(e.file_name())).unwrap();
    }
    let refs = tmp
        .path()
        .join("hub/models--lightonai--LightOnOCR-1B-1025/refs");
    std::fs::create_dir_all(&refs).unwrap();
    std::fs::write(refs.join("main"), "0123abcd").unwrap();
    let out = tmp.path().join("from-hub");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_ocrctl"))
        .args([
            "export",
            "--checkpoint",
            "lightonai/LightOnOCR-1B-1025",
            "--out",
        ])
        .arg(&out)
        .env("HF_HUB_CACHE", tmp.path().join("hub"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    check_named(&out, "v1", "LightOnOCR v1 (1B-1025), vocabulary 384", 327);
    let m = read_json(&out.join("ocrctl.json"));
    assert_eq!(m["variant"]["repo"], "lightonai/LightOnOCR-1B-1025");
}
