//! `ocrctl eval`: how far a candidate export (e.g. int4) agrees with a reference (fp32),
//! teacher-forced; or, with `--truth DIR`, how well exports read pages whose text is known
//! ([`crate::cli::eval_truth`]: character and word error rates).
//!
//! ```text
//! ocrctl eval --reference out/m --candidate out/m --candidate-precision int4 page1.png page2.png
//! ocrctl eval --truth pages/ --model out/m --precision fp32,int4
//! ```

use anyhow::Context;
use clap::Args;
use ocrctl::model::export::Export;
use ocrctl::model::preprocess;
use ocrctl::quality::eval::{compare, ImageEval};
use ocrctl::runtime::ortmodel::{LoadOptions, OrtModel};
use ocrctl_exporters::export::Precision;
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// Arguments of `ocrctl eval`.
#[derive(Args, Debug)]
pub struct EvalArgs {
    /// Reference export directory.
    #[arg(long, required_unless_present = "truth", conflicts_with = "truth")]
    reference: Option<PathBuf>,
    /// Precision of the reference graphs.
    #[arg(long, default_value = "fp32")]
    reference_precision: String,
    /// Candidate export directory (may be the same directory as the reference).
    #[arg(long, required_unless_present = "truth", conflicts_with = "truth")]
    candidate: Option<PathBuf>,
    /// Precision of the candidate graphs.
    #[arg(long, default_value = "int4")]
    candidate_precision: String,
    /// Teacher-forced decoding steps per image.
    #[arg(long, default_value_t = 64)]
    steps: usize,
    #[command(flatten)]
    truth: crate::cli::eval_truth::TruthArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Images to compare on.
    #[arg(required_unless_present = "truth", conflicts_with = "truth")]
    images: Vec<PathBuf>,
}

fn load(
    dir: &std::path::Path,
    precision: &str,
    a: &EvalArgs,
    flag: &str,
) -> anyhow::Result<(OrtModel, Arc<Export>)> {
    let precision = Precision::parse(precision).with_context(|| flag.to_string())?;
    let opts = LoadOptions {
        precision,
        threads: a.truth.rt.threads.unwrap_or(0),
        ort_lib: a.truth.rt.ort_lib.clone(),
        accuracy_level: a.truth.rt.accuracy_level,
        providers: Default::default(),
        ..LoadOptions::new(precision)
    };
    let export = Arc::new(Export::open(dir)?);
    Ok((OrtModel::open(&export, &opts)?, export))
}

/// Runs the comparison (or, with `--truth`, the error rates) and prints per-image rows and
/// the mean.
pub fn run(a: EvalArgs) -> anyhow::Result<ExitCode> {
    if a.truth.truth.is_some() {
        return crate::cli::eval_truth::run(&a.truth, a.json);
    }
    let (Some(reference_dir), Some(candidate_dir)) = (&a.reference, &a.candidate) else {
        anyhow::bail!("--reference and --candidate are required without --truth");
    };
    let (mut reference, reference_export) = load(
        reference_dir,
        &a.reference_precision,
        &a,
        "--reference-precision",
    )?;
    let (mut candidate, _) = load(
        candidate_dir,
        &a.candidate_precision,
        &a,
        "--candidate-precision",
    )?;
    let cfg = reference.manifest.model.clone();
    if candidate.manifest.model != cfg {
        anyhow::bail!(
            "--candidate: its model config differs from the reference's (different checkpoints?)"
        );
    }
    let pipeline = ocrctl::generation::pipeline::PagePipeline::new(reference_export)?;
    let mut rows: Vec<(String, ImageEval)> = Vec::new();
    for path in &a.images {
        let img = preprocess::load_image(path, preprocess::DEFAULT_MAX_PIXELS)?;
        let p = pipeline.prepare(&img)?;
        let r = compare(
            &mut reference,
            &mut candidate,
            &p.pixel_values,
            &p.prompt_ids,
            cfg.image_token_id,
            a.steps,
        )
        .with_context(|| path.display().to_string())?;
        rows.push((path.display().to_string(), r));
    }
    let summary = summary(&rows, a.steps);
    if a.json {
        let per: Vec<_> = rows
            .iter()
            .map(|(f, r)| json!({"file": f, "result": r}))
            .collect();
        println!(
            "{}",
            json!({"reference": a.reference_precision, "candidate": a.candidate_precision, "summary": summary, "images": per})
        );
    } else {
        print_table(&rows, &summary);
    }
    Ok(ExitCode::SUCCESS)
}

/// The means over the images (and the lowest feature cosine).
fn summary(rows: &[(String, ImageEval)], steps: usize) -> serde_json::Value {
    let n = rows.len() as f64;
    let mean = |f: &dyn Fn(&ImageEval) -> f64| rows.iter().map(|(_, r)| f(r)).sum::<f64>() / n;
    json!({
        "images": rows.len(),
        "steps": steps,
        "first_token_agreement": mean(&|r| r.first_token_agrees as u8 as f64),
        "top1_agreement": mean(&|r| r.top1_agreement),
        "mean_kl": mean(&|r| r.mean_kl),
        "mean_greedy_agreement": mean(&|r| r.greedy_agreement as f64),
        "mean_feature_cosine": mean(&|r| r.feature_cosine),
        "min_feature_cosine": rows.iter().map(|(_, r)| r.feature_cosine).fold(f64::INFINITY, f64::min),
    })
}

/// One line per image, then the mean and the lowest cosine.
fn print_table(rows: &[(String, ImageEval)], summary: &serde_json::Value) {
    // The image column is as wide as the longest path, so long names stay aligned.
    let w = rows
        .iter()
        .map(|(f, _)| f.chars().count())
        .max()
        .unwrap_or(0)
        .max(8);
    println!(
        "{:<w$} {:>6} {:>8} {:>10} {:>7} {:>9}",
        "image", "first", "top1", "mean KL", "greedy", "cosine"
    );
    for (f, r) in rows {
        println!(
            "{:<w$} {:>6} {:>7.1}% {:>10.5} {:>7} {:>9.6}",
            f,
            r.first_token_agrees,
            100.0 * r.top1_agreement,
            r.mean_kl,
            r.greedy_agreement,
            r.feature_cosine
        );
    }
    let f = |k: &str| summary[k].as_f64().unwrap_or(0.0);
    println!(
        "{:<w$} {:>5.0}% {:>7.1}% {:>10.5} {:>7.1} {:>9.6}",
        "mean",
        100.0 * f("first_token_agreement"),
        100.0 * f("top1_agreement"),
        f("mean_kl"),
        f("mean_greedy_agreement"),
        f("mean_feature_cosine")
    );
    println!("{:<w$} {:>44.6}", "min", f("min_feature_cosine"));
}
