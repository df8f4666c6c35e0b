//! `ocrctl ocr`: OCR image files and folders with an exported model.
//!
//! Requests run through the continuous-batching [`Engine`] (`--batch-size` at once). Prints
//! the text per image, or with `--json` one JSON object per line (`text`, `token_ids`,
//! per-step `top_logprobs`, …), in input order; `--out DIR` writes one markdown file per
//! image instead, and `--resume` skips images whose file already exists. A bad image is
//! reported and the others still run; the exit code is non-zero when any image failed.

use anyhow::Context;
use clap::Args;
use ocrctl::engine::{Engine, Event, GenRequest};
use ocrctl::ortmodel::OrtModel;
use ocrctl::preprocess::{self, PreprocessConfig};
use ocrctl::prompt::Prompter;
use ocrctl::sampling::{LoopGuard, SamplingParams};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Arguments of `ocrctl ocr`.
#[derive(Args, Debug)]
pub struct OcrArgs {
    /// Exported model directory (from `ocrctl export`).
    #[arg(long)]
    model: PathBuf,
    #[command(flatten)]
    rt: crate::cmd_common::RuntimeArgs,
    /// Maximum number of new tokens per image (default: the profile's, else 1024).
    #[arg(long)]
    max_tokens: Option<usize>,
    /// Requests decoded together, continuous batching (default: the profile's, else 1).
    #[arg(long)]
    batch_size: Option<usize>,
    /// Sampling temperature; 0 is greedy (reproducible). LightOn suggests 0.2.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling: keep the most likely tokens up to this cumulative probability.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Divide positive (multiply negative) logits of already generated tokens by this; 1 = off.
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// Random seed for sampling (default: a fresh one per image).
    #[arg(long)]
    seed: Option<u64>,
    /// Stop an image whose output repeats a block of up to 64 tokens many times in a row.
    #[arg(long)]
    loop_guard: bool,
    /// Record the K most likely tokens with log-probabilities at every step (JSON output).
    #[arg(long, default_value_t = 0)]
    top_logprobs: usize,
    /// Keep generating after an end-of-sequence token (for benchmarks and parity checks).
    #[arg(long)]
    ignore_eos: bool,
    /// Print one JSON object per image instead of plain text.
    #[arg(long)]
    json: bool,
    /// Write `<DIR>/<image stem>.md` per image instead of printing the text.
    #[arg(long)]
    out: Option<PathBuf>,
    /// With --out: skip images whose markdown file already exists.
    #[arg(long, requires = "out")]
    resume: bool,
    /// Refuse images with more pixels than this (checked from the header, before decoding).
    #[arg(long, default_value_t = preprocess::DEFAULT_MAX_PIXELS)]
    max_pixels: u64,
    /// Image files or folders (PNG, JPEG, WebP, TIFF); folders are read non-recursively.
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
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

/// Expands folders into their image files (sorted); files are kept as given.
fn expand_inputs(inputs: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in inputs {
        if p.is_dir() {
            match ocrctl::calibrate::image_files(p) {
                Ok(v) => out.extend(v),
                Err(e) => eprintln!("error: {e}"),
            }
        } else {
            out.push(p.clone());
        }
    }
    out
}

fn md_path(dir: &Path, image: &Path) -> PathBuf {
    let stem = image
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "page".into());
    dir.join(format!("{stem}.md"))
}

/// Runs OCR over all inputs; returns failure if any image failed.
pub fn run(a: OcrArgs) -> anyhow::Result<ExitCode> {
    let params = SamplingParams {
        temperature: a.temperature,
        top_p: a.top_p,
        top_k: a.top_k,
        repetition_penalty: a.repetition_penalty,
        seed: a.seed,
        loop_guard: a.loop_guard.then(LoopGuard::default),
    };
    params
        .validate()
        .map_err(|e| anyhow::anyhow!("--{}", e.to_string().replace('_', "-")))?;
    let (opts, profile) = a.rt.load_options(&a.model)?;
    let batch_size = a
        .batch_size
        .or(profile.as_ref().map(|p| p.max_batch_size as usize))
        .unwrap_or(1);
    if batch_size == 0 {
        anyhow::bail!("--batch-size must be at least 1");
    }
    let max_tokens = a
        .max_tokens
        .or(profile.as_ref().map(|p| p.default_max_new_tokens as usize))
        .unwrap_or(1024);
    if let Some(p) = &profile {
        if max_tokens > p.max_new_tokens_limit as usize {
            anyhow::bail!(
                "--max-tokens {max_tokens} exceeds the profile's max_new_tokens_limit ({})",
                p.max_new_tokens_limit
            );
        }
    }
    let model = OrtModel::load(&a.model, &opts)?;
    let cfg = model.manifest.model.clone();
    let prompter = Prompter::from_model_dir(&a.model, cfg.image_token_id)?;
    let pre = PreprocessConfig::from_model_dir(
        &a.model,
        cfg.vision.patch_size as u32,
        cfg.spatial_merge_size as u32,
    )?;
    let stops = stop_ids(&a.model, &cfg.eos_token_ids);
    if let Some(dir) = &a.out {
        std::fs::create_dir_all(dir).with_context(|| format!("--out {}", dir.display()))?;
    }
    let mut files = expand_inputs(&a.inputs);
    if a.resume {
        let dir = a.out.as_ref().expect("clap: --resume requires --out");
        files.retain(|f| !md_path(dir, f).exists());
    }
    let mut failed = 0usize;
    // Preprocess lazily, as the engine admits requests; failures are reported here.
    let mut meta: Vec<(PathBuf, usize, u32, u32, usize)> = Vec::new();
    let mut prep_failed = Vec::new();
    let requests = files.iter().filter_map(|path| {
        let r = (|| -> anyhow::Result<GenRequest> {
            let img = preprocess::load_image(path, a.max_pixels)?;
            let p = preprocess::preprocess(&img, &pre);
            let ids = prompter.encode(&[p.num_image_tokens], None)?;
            meta.push((
                path.clone(),
                ids.len(),
                p.height,
                p.width,
                p.num_image_tokens,
            ));
            Ok(GenRequest {
                prompt_ids: ids,
                images: vec![p.pixel_values],
                params: params.clone(),
                max_new_tokens: max_tokens,
                stop_ids: stops.clone(),
                ignore_eos: a.ignore_eos,
                logprobs: false,
                top_logprobs: a.top_logprobs,
            })
        })();
        match r {
            Ok(req) => Some(req),
            Err(e) => {
                let msg = format!("{e:#}");
                let name = path.display().to_string();
                if msg.contains(&name) {
                    eprintln!("error: {msg}");
                } else {
                    eprintln!("error: {name}: {msg}");
                }
                prep_failed.push(path.clone());
                None
            }
        }
    });
    let start = Instant::now();
    let mut engine = Engine {
        backend: model,
        max_batch: batch_size,
        image_token_id: cfg.image_token_id,
    };
    let mut tokens = 0usize;
    let results = engine.run(requests, &mut |ev| match ev {
        Event::Token { .. } => tokens += 1,
        Event::Done { .. } => {}
    });
    failed += prep_failed.len();
    for ((path, prompt_tokens, h, w, n_img), r) in meta.iter().zip(results) {
        match r {
            Ok(g) => {
                let text_ids: &[u32] = match g.token_ids.iter().position(|t| stops.contains(t)) {
                    Some(i) if !a.ignore_eos => &g.token_ids[..i],
                    _ => &g.token_ids,
                };
                let text = prompter.decode(text_ids, true)?;
                if let Some(dir) = &a.out {
                    let p = md_path(dir, path);
                    let tmp = p.with_extension("md.partial");
                    std::fs::write(&tmp, format!("{text}\n"))
                        .with_context(|| tmp.display().to_string())?;
                    std::fs::rename(&tmp, &p).with_context(|| p.display().to_string())?;
                } else if a.json {
                    let v = json!({
                        "file": path.display().to_string(),
                        "text": text,
                        "token_ids": g.token_ids,
                        "top_logprobs": g.top_logprobs,
                        "finish_reason": g.finish_reason,
                        "prompt_tokens": prompt_tokens,
                        "image_tokens": n_img,
                        "image_size": [h, w],
                    });
                    println!("{v}");
                } else {
                    println!("{text}");
                }
            }
            Err(e) => {
                failed += 1;
                eprintln!("error: {}: {e}", path.display());
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    if a.out.is_some() || files.len() > 1 {
        eprintln!(
            "{} image(s), {} failed, {tokens} tokens in {secs:.1}s ({:.2} pages/s, {:.1} tokens/s)",
            files.len(),
            failed,
            meta.len() as f64 / secs,
            tokens as f64 / secs
        );
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
