//! `ocrctl ocr`: greedy OCR of image files with an exported model (batch 1).
//!
//! Prints the text per image, or with `--json` one JSON object per line with `text`,
//! `token_ids` and per-step `top_logprobs`. A bad image is reported and the others still
//! run; the exit code is non-zero when any image failed.

use anyhow::Context;
use clap::Args;
use ocrctl::backend::Backend;
use ocrctl::generate::{generate_greedy, GreedyOptions};
use ocrctl::ortmodel::{LoadOptions, OrtModel};
use ocrctl::preprocess::{self, PreprocessConfig};
use ocrctl::prompt::Prompter;
use ocrctl_exporters::export::Precision;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `ocrctl ocr`.
#[derive(Args, Debug)]
pub struct OcrArgs {
    /// Exported model directory (from `ocrctl export`).
    #[arg(long)]
    model: PathBuf,
    /// Which exported graphs to run: fp32, fp16, int4 or int4-fp16.
    #[arg(long, default_value = "fp32")]
    precision: String,
    /// Maximum number of new tokens per image.
    #[arg(long, default_value_t = 1024)]
    max_tokens: usize,
    /// Sampling temperature; only 0 (greedy) is supported by this command so far.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Record the K most likely tokens with log-probabilities at every step (JSON output).
    #[arg(long, default_value_t = 0)]
    top_logprobs: usize,
    /// Keep generating after an end-of-sequence token (for benchmarks and parity checks).
    #[arg(long)]
    ignore_eos: bool,
    /// Print one JSON object per image instead of plain text.
    #[arg(long)]
    json: bool,
    /// ONNX Runtime intra-op threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Path of libonnxruntime.so (default: found automatically, see `ocrctl ocr --help`).
    #[arg(long, env = "OCRCTL_ORT_LIB")]
    ort_lib: Option<PathBuf>,
    /// `session.qdq_matmulnbits_accuracy_level` for int4 graphs on the CPU: 0 computes in
    /// float, 4 (ONNX Runtime's default) quantizes activations to int8.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(0..=4))]
    accuracy_level: u8,
    /// Refuse images with more pixels than this (checked from the header, before decoding).
    #[arg(long, default_value_t = preprocess::DEFAULT_MAX_PIXELS)]
    max_pixels: u64,
    /// Image files (PNG, JPEG, WebP, TIFF).
    #[arg(required = true)]
    images: Vec<PathBuf>,
}

/// Stop ids: `generation_config.json`'s `eos_token_id` if present, else the config's.
fn stop_ids(dir: &Path, fallback: &[u32]) -> Vec<u32> {
    let from_gen = std::fs::read_to_string(dir.join("generation_config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| match v.get("eos_token_id") {
            Some(serde_json::Value::Array(a)) => Some(
                a.iter()
                    .filter_map(|x| x.as_u64().map(|n| n as u32))
                    .collect(),
            ),
            Some(x) => x.as_u64().map(|n| vec![n as u32]),
            None => None,
        });
    from_gen
        .filter(|v: &Vec<u32>| !v.is_empty())
        .unwrap_or_else(|| fallback.to_vec())
}

/// Runs OCR over all images; returns failure if any image failed.
pub fn run(a: OcrArgs) -> anyhow::Result<ExitCode> {
    if a.temperature != 0.0 {
        anyhow::bail!(
            "--temperature {}: only greedy decoding (--temperature 0) is implemented so far",
            a.temperature
        );
    }
    let precision = Precision::parse(&a.precision).context("--precision")?;
    let opts = LoadOptions {
        precision,
        threads: a.threads,
        ort_lib: a.ort_lib.clone(),
        accuracy_level: a.accuracy_level,
    };
    let mut model = OrtModel::load(&a.model, &opts)?;
    let cfg = model.manifest.model.clone();
    let prompter = Prompter::from_model_dir(&a.model, cfg.image_token_id)?;
    let pre = PreprocessConfig::from_model_dir(
        &a.model,
        cfg.vision.patch_size as u32,
        cfg.spatial_merge_size as u32,
    )?;
    let gen = GreedyOptions {
        max_new_tokens: a.max_tokens,
        top_logprobs: a.top_logprobs,
        stop_ids: stop_ids(&a.model, &cfg.eos_token_ids),
        ignore_eos: a.ignore_eos,
    };
    let mut failed = 0;
    for path in &a.images {
        let result = (|| -> anyhow::Result<serde_json::Value> {
            let img = preprocess::load_image(path, a.max_pixels)?;
            let p = preprocess::preprocess(&img, &pre);
            let ids = prompter.encode(&[p.num_image_tokens], None)?;
            let feats = model.encode_image(&p.pixel_values)?;
            let g = generate_greedy(&mut model, &ids, cfg.image_token_id, Some(&feats), &gen)?;
            let text_ids: Vec<u32> = match g.token_ids.iter().position(|t| gen.stop_ids.contains(t))
            {
                Some(i) if !a.ignore_eos || i < g.token_ids.len() => g.token_ids[..i].to_vec(),
                _ => g.token_ids.clone(),
            };
            let text = prompter.decode(&text_ids, true)?;
            Ok(json!({
                "file": path.display().to_string(),
                "text": text,
                "token_ids": g.token_ids,
                "top_logprobs": g.top_logprobs,
                "finish_reason": g.finish_reason,
                "prompt_tokens": ids.len(),
                "image_tokens": p.num_image_tokens,
                "image_size": [p.height, p.width],
            }))
        })();
        match result {
            Ok(v) if a.json => println!("{v}"),
            Ok(v) => println!("{}", v["text"].as_str().unwrap_or_default()),
            Err(e) => {
                failed += 1;
                eprintln!("error: {}: {e:#}", path.display());
            }
        }
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
