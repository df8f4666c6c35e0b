//! `ocrctl ocr`: OCR images and PDFs with an exported model.
//!
//! Inputs are files, folders and glob patterns ([`ocrctl::documents::inputs`]); an image is a document
//! of one page, a PDF a document of N pages rendered by pdfium ([`ocrctl::documents::pdf`]). Documents
//! are opened first (a PDF only to count its pages; [`crate::cli::ocr_open`]); pages are then rendered, preprocessed
//! and submitted lazily as the continuous-batching [`Engine`] admits them (`--batch-size` at
//! once), so memory does not grow with the input. Results are written in input order as they
//! finish ([`crate::cli::ocr_output`]): plain text, `--json` (one object per page), or `--out DIR`
//! (one markdown file per document; `--resume` skips documents whose file exists);
//! `--figures` and `--tables` rewrite each page's text first ([`crate::cli::ocr_post`]). A bad
//! file or page is reported by name and the rest still run; a page that ends at
//! `--max-tokens` or in a loop is retried, then failed ([`crate::cli::ocr_outcome`]: flags,
//! exit code 2 when anything failed, `failures.jsonl`). A progress bar on stderr (not with `--quiet` or when stderr is not a
//! terminal) counts pages; a summary line closes every run. `--devices 0,1` (or `cpu,cpu`)
//! runs one engine per device, each taking the next page when it has room.

use crate::cli::ocr_open;
use crate::cli::ocr_outcome::{Failures, Fallback};
use crate::cli::ocr_output::{page_rate, FailurePolicy, Mode, Output, PageResult, TextLayer};
use anyhow::Context;
use clap::Args;
use ocrctl::documents::inputs::{self, Document, PageLoader};
use ocrctl::generation::engine::{Engine, GenRequest};
use ocrctl::generation::outcome::{self, FailReason, PageEvent, PageOutcome, RetryPolicy};
use ocrctl::generation::pipeline::PagePipeline;
use ocrctl::generation::sampling::{LoopGuard, SamplingOverrides, SamplingParams};
use ocrctl::model::preprocess;
use ocrctl::runtime::devices::Device;
use ocrctl::runtime::ortmodel::OrtModel;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;

mod pages;
use pages::run_pages;

/// Arguments of `ocrctl ocr`.
#[derive(Args, Debug)]
pub struct OcrArgs {
    /// Exported model directory (from `ocrctl export`).
    #[arg(long)]
    model: PathBuf,
    #[command(flatten, next_help_heading = "Runtime")]
    rt: crate::cli::common::RuntimeArgs,
    /// Maximum number of new tokens per image (default: the profile's, else 1024).
    #[arg(help_heading = "Generation", long)]
    max_tokens: Option<usize>,
    /// Requests decoded together, continuous batching (default: the profile's, else 1).
    #[arg(help_heading = "Generation", long)]
    batch_size: Option<usize>,
    /// Sampling temperature; 0 is greedy (reproducible). Default: the model's
    /// generation_config.json (LightOnOCR: 0.2), else 0 — as `serve` and vLLM.
    #[arg(help_heading = "Generation", long, allow_negative_numbers = true)]
    temperature: Option<f32>,
    /// Nucleus sampling: keep the most likely tokens up to this cumulative probability
    /// (default: generation_config.json's, else 1).
    #[arg(help_heading = "Generation", long, allow_negative_numbers = true)]
    top_p: Option<f32>,
    /// Keep only the K most likely tokens (0 = off; default: generation_config.json's, else 0).
    #[arg(help_heading = "Generation", long)]
    top_k: Option<usize>,
    /// Divide positive (multiply negative) logits of already generated tokens by this; 1 = off
    /// (default: generation_config.json's, else 1).
    #[arg(help_heading = "Generation", long, allow_negative_numbers = true)]
    repetition_penalty: Option<f32>,
    /// Subtract this from the logit of every token already generated, once (OpenAI's
    /// presence penalty, -2 to 2; default 0 = off).
    #[arg(help_heading = "Generation", long, allow_negative_numbers = true)]
    presence_penalty: Option<f32>,
    /// Subtract this from the logit of a token already generated, once per time it was
    /// (OpenAI's frequency penalty, -2 to 2; default 0 = off).
    #[arg(help_heading = "Generation", long, allow_negative_numbers = true)]
    frequency_penalty: Option<f32>,
    /// Add BIAS (-100 to 100) to token ID's logit before the penalties, e.g. `151645=-100`
    /// to ban an id (OpenAI's logit_bias); repeat or separate with commas.
    #[arg(help_heading = "Generation", long, value_name = "ID=BIAS", value_delimiter = ',', allow_hyphen_values = true,
          value_parser = crate::cli::common::parse_logit_bias)]
    logit_bias: Vec<(u32, f32)>,
    /// Random seed for sampling (default: a fresh one per image).
    #[arg(help_heading = "Generation", long)]
    seed: Option<u64>,
    /// Stop an image whose output repeats a block of up to 64 tokens many times in a row.
    #[arg(help_heading = "Generation", long)]
    loop_guard: bool,
    /// Record the K most likely tokens with log-probabilities at every step (JSON output).
    #[arg(help_heading = "Generation", long, default_value_t = 0)]
    top_logprobs: usize,
    /// Keep generating after an end-of-sequence token (for benchmarks and parity checks).
    #[arg(help_heading = "Generation", long)]
    ignore_eos: bool,
    #[command(flatten, next_help_heading = "Page outcomes")]
    outcome: crate::cli::ocr_outcome::OutcomeArgs,
    #[command(flatten, next_help_heading = "Output")]
    post: crate::cli::ocr_post::PostArgs,
    /// Print one JSON object per page (with `file` and 1-based `page`) instead of plain text.
    #[arg(help_heading = "Output", long, conflicts_with = "out")]
    pub(crate) json: bool,
    /// Write `<DIR>/<file stem>.md` per document (image or PDF) instead of printing the text.
    #[arg(help_heading = "Output", long)]
    pub(crate) out: Option<PathBuf>,
    /// Read only shard K of N (0-based) of the inputs, e.g. one pod of an Indexed Job:
    /// decided by each file's name, so the N shards partition any listing of the same files.
    #[arg(
        help_heading = "Inputs",
        long,
        env = "OCRCTL_SHARD",
        value_name = "K/N"
    )]
    pub(crate) shard: Option<inputs::Shard>,
    /// Read only these pages of each PDF, e.g. `1-3,7` or `5-` (to the end); a page past
    /// a document's end fails that document. Images are read whole.
    #[arg(
        help_heading = "Inputs",
        long,
        value_name = "LIST",
        allow_hyphen_values = true
    )]
    pub(crate) pages: Option<ocrctl::documents::ranges::PageRanges>,
    /// With --out: skip documents whose markdown file already exists.
    #[arg(help_heading = "Output", long, requires = "out")]
    pub(crate) resume: bool,
    /// Refuse images with more pixels than this (checked from the header, before decoding).
    #[arg(help_heading = "Inputs", long, default_value_t = preprocess::DEFAULT_MAX_PIXELS)]
    max_pixels: u64,
    /// The pdfium library for PDF input (default: `$OCRCTL_PDFIUM_LIB`, else the pypdfium2
    /// wheel in .venv or python3's site-packages).
    #[arg(help_heading = "PDF", long)]
    pub(crate) pdfium_lib: Option<PathBuf>,
    #[command(flatten, next_help_heading = "PDF")]
    pub(crate) pdf: crate::cli::pdf_limits::PdfLimitArgs,
    /// Devices to run one engine each on, comma-separated: GPU indices (`0,1`, with the
    /// profile's GPU providers) or `cpu`; engines take the next page when they have room.
    #[arg(
        help_heading = "Runtime",
        long,
        env = "OCRCTL_DEVICES",
        value_delimiter = ','
    )]
    devices: Vec<Device>,
    /// Hide the progress bar (the closing summary line stays).
    #[arg(help_heading = "Output", long, short)]
    quiet: bool,
    /// Read folders' subfolders too (else they are skipped and counted in the summary).
    #[arg(help_heading = "Inputs", long, short = 'r')]
    pub(crate) recursive: bool,
    /// Also read the inputs listed in FILE, one path per line (`-`: standard input, e.g.
    /// `ls *.pdf | ocrctl ocr --files-from - …`).
    #[arg(help_heading = "Inputs", long, value_name = "FILE")]
    pub(crate) files_from: Option<PathBuf>,
    /// Image files (PNG, JPEG, WebP, TIFF), PDFs, folders or quoted glob patterns such as
    /// 'scans/*.pdf' ('scans/**/*.pdf' for every subfolder).
    #[arg(help_heading = "Inputs", required_unless_present = "files_from")]
    pub(crate) inputs: Vec<PathBuf>,
}

/// `msg` as is when it names `name`'s file, else prefixed with `name`.
fn named(name: &str, file: &Path, msg: String) -> String {
    if msg.contains(&file.display().to_string()) {
        msg
    } else {
        format!("{name}: {msg}")
    }
}

/// Per-request facts kept for its output: unit (page number through the run), prompt length,
/// preprocessed height and width, image tokens.
struct Meta {
    unit: usize,
    prompt_tokens: usize,
    size: [u32; 2],
    image_tokens: usize,
}

/// The load options of one engine per device of `--devices` (none given: one engine with
/// `opts` as they are), with the devices' labels.
fn engine_options(
    devices: &[Device],
    opts: &ocrctl::runtime::ortmodel::LoadOptions,
) -> anyhow::Result<Vec<(String, ocrctl::runtime::ortmodel::LoadOptions)>> {
    if devices.is_empty() {
        return Ok(vec![("the default device".into(), opts.clone())]);
    }
    ocrctl::runtime::devices::check(devices)?;
    let cpus = devices.iter().filter(|d| **d == Device::Cpu).count();
    let labels = ocrctl::runtime::devices::labels(devices);
    devices
        .iter()
        .zip(labels)
        .map(|(d, l)| {
            ocrctl::runtime::devices::options_for(opts, *d, cpus)
                .map(|o| (l, o))
                .map_err(anyhow::Error::from)
        })
        .collect()
}

/// The sampling flags applied to the model's defaults (as `serve` applies a request's
/// fields), checked; a bad value is named by its flag. Says when the defaults sample.
fn sampling(a: &OcrArgs, pipeline: &PagePipeline) -> anyhow::Result<SamplingParams> {
    let overrides = SamplingOverrides {
        temperature: a.temperature,
        top_p: a.top_p,
        top_k: a.top_k,
        repetition_penalty: a.repetition_penalty,
        presence_penalty: a.presence_penalty,
        frequency_penalty: a.frequency_penalty,
        logit_bias: Some(ocrctl::generation::sampling::logit_bias(
            a.logit_bias.iter().copied(),
        )),
        seed: a.seed,
        loop_guard: a.loop_guard.then(LoopGuard::default),
    };
    let params = pipeline.sampling(&overrides);
    let base = &pipeline.defaults;
    if a.temperature.is_none() && base.temperature > 0.0 && !a.quiet {
        eprintln!(
            "ocrctl: sampling with the model's generation_config.json (temperature {}, top-p {}); \
             --temperature 0 for greedy",
            base.temperature,
            a.top_p.unwrap_or(base.top_p)
        );
    }
    params.map_err(|e| anyhow::anyhow!("--{}", e.to_string().replace('_', "-")))
}

/// The batch size and the new tokens per page: the flags, else the profile's; the tokens
/// within the profile's limit.
fn batch_and_tokens(
    a: &OcrArgs,
    profile: Option<&ocrctl::profile::Profile>,
) -> anyhow::Result<(usize, usize)> {
    let batch_size = a
        .batch_size
        .or(profile.map(|p| p.max_batch_size as usize))
        .unwrap_or(1);
    if batch_size == 0 {
        anyhow::bail!("--batch-size must be at least 1");
    }
    if a.max_tokens == Some(0) {
        anyhow::bail!("--max-tokens must be at least 1");
    }
    let max_tokens = a
        .max_tokens
        .or(profile.map(|p| p.default_max_new_tokens as usize))
        .unwrap_or(1024);
    if let Some(p) = profile {
        if max_tokens > p.max_new_tokens_limit as usize {
            anyhow::bail!(
                "--max-tokens {max_tokens} exceeds the profile's max_new_tokens_limit ({})",
                p.max_new_tokens_limit
            );
        }
    }
    Ok((batch_size, max_tokens))
}

/// The writer of `docs`' results in the mode the flags ask for.
fn output_for<'d>(a: &OcrArgs, docs: &'d [Document], max_tokens: usize) -> Output<'d> {
    let mode = match (&a.out, a.json) {
        (Some(dir), _) => Mode::Markdown(dir.clone()),
        (None, true) => Mode::Json,
        (None, false) => Mode::Text,
    };
    let failure_policy = FailurePolicy {
        max_failed: a.outcome.max_failed(),
        max_tokens,
    };
    let text_layer = (a.outcome.fallback == Fallback::Text)
        .then(|| TextLayer::new(a.pdf.reader(a.pdfium_lib.clone())));
    Output::new(docs, mode, a.quiet, failure_policy, text_layer)
}

/// What was read before the pages ran: documents opened, pages, and the inputs skipped
/// (`--resume`) or not read (neither images nor PDFs).
struct Inputs {
    docs: usize,
    pages: usize,
    skipped: usize,
    not_read: usize,
}

/// Closes the output, lists the failed inputs under `--out` and prints what ran and how
/// fast (always, a single image too); the exit code.
fn finish(a: &OcrArgs, mut out: Output<'_>, mut failures: Failures, n: Inputs) -> ExitCode {
    let secs = out.close();
    let failed = failures.rows.len() + out.failed_docs;
    let open_failed_n = failures.rows.len();
    failures.rows.append(&mut out.failures.rows);
    if let Some(dir) = &a.out {
        match failures.write(dir, a.shard) {
            Ok(Some(f)) => eprintln!("failed inputs are listed in {}", f.display()),
            Ok(None) => {}
            Err(e) => eprintln!("error: {e}"),
        }
    }
    let mut skipped = if n.skipped > 0 {
        format!(", {} skipped (--resume)", n.skipped)
    } else {
        String::new()
    };
    if n.not_read > 0 {
        let why = if a.recursive { "" } else { " or subfolders" };
        skipped += &format!(
            ", {} folder entries skipped (not images or PDFs{why})",
            n.not_read
        );
    }
    eprintln!(
        "{} document(s), {} page(s), {failed} failed{skipped}; pages: {}; {} \
         tokens in {secs:.1}s ({}, {:.1} tokens/s)",
        n.docs + open_failed_n,
        n.pages,
        out.page_summary(),
        out.tokens,
        page_rate(out.pages_ok, secs),
        out.tokens as f64 / secs
    );
    failures.exit_code()
}

/// Runs OCR over all inputs; returns exit code 2 if any input, document or page failed.
pub fn run(a: OcrArgs) -> anyhow::Result<ExitCode> {
    // A wrong --model is named before anything else reads from it.
    let (opts, profile, export) = a.rt.open(&a.model)?;
    // The same defaults as `serve`: the model's generation_config.json, flags override.
    let pipeline = PagePipeline::new(export.clone())?;
    let params = sampling(&a, &pipeline)?;
    let (batch_size, max_tokens) = batch_and_tokens(&a, profile.as_ref())?;
    if let Some(dir) = &a.out {
        std::fs::create_dir_all(dir).with_context(|| format!("--out {}", dir.display()))?;
    }
    let post = a
        .post
        .resolve(a.out.as_deref(), a.pdfium_lib.clone(), a.max_pixels)?;
    let (docs, open_failed, skipped, not_read) = ocr_open::open_documents(&a)?;
    let total_pages: usize = docs.iter().map(Document::pages).sum();
    let out = Mutex::new(output_for(&a, &docs, max_tokens));
    if total_pages > 0 {
        let mut opts = opts;
        opts.kv_slots = batch_size;
        let engines = engine_options(&a.devices, &opts)?;
        run_pages(
            &a, &docs, &out, &params, batch_size, max_tokens, engines, pipeline, post,
        )?;
    }
    let out = out.into_inner().unwrap_or_else(|e| e.into_inner());
    let inputs = Inputs {
        docs: docs.len(),
        pages: total_pages,
        skipped,
        not_read,
    };
    Ok(finish(&a, out, open_failed, inputs))
}
