//! `ocrctl eval --truth DIR`: how well exports read pages whose text is known.
//!
//! The pages of `DIR` and their expected texts ([`ocrctl::quality::truth`]) are read as
//! `ocrctl ocr --temperature 0` reads them (the same page loader, page recipe, engine and
//! text decoding, greedy with the model's other sampling defaults), once per export
//! (`--model`, repeatable: e.g. one exported with `--kv-cache fp8`) and precision
//! (`--precision fp32,int4`). Each page's output is scored against its text
//! ([`ocrctl::quality::cer`]: CER and WER after NFC and whitespace collapsing); a table per
//! run, a summary of the runs, or `--json`. Pages without a usable text and pages that fail
//! are named on stderr and make the exit code non-zero; the others still count.

use crate::cli::common::{describe, RuntimeArgs};
use anyhow::Context;
use clap::Args;
use ocrctl::documents::inputs::PageLoader;
use ocrctl::documents::pdf::sandbox::{PdfLimits, PdfReader, Sandbox};
use ocrctl::generation::engine::Engine;
use ocrctl::generation::pipeline::PagePipeline;
use ocrctl::generation::sampling::{SamplingOverrides, SamplingParams};
use ocrctl::model::export::Export;
use ocrctl::model::preprocess;
use ocrctl::quality::cer::{self, Score};
use ocrctl::quality::truth::{self, TruthSet};
use ocrctl::runtime::ortmodel::OrtModel;
use ocrctl_exporters::export::DecoderVariant;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

/// The `--truth` options of `ocrctl eval`.
#[derive(Args, Debug)]
pub struct TruthArgs {
    /// Folder of pages (images, PDFs) with their expected text beside each (`NAME.txt` or
    /// `NAME.md`; a PDF's pages separated by `<!-- page N -->` lines, as `ocr --out` writes
    /// them): reads every page as `ocrctl ocr --temperature 0` does and reports the character
    /// and word error rates (CER, WER: edit distance / expected length) per page and overall.
    /// Both texts are normalised first: Unicode NFC, every run of whitespace as one space, no
    /// leading or trailing whitespace; case and punctuation count. `--precision` takes a
    /// comma-separated list here (one run per export and precision).
    #[arg(long, value_name = "DIR", requires = "model")]
    pub truth: Option<PathBuf>,
    /// With --truth: the export to read the pages with; repeat to compare exports (e.g. one
    /// made with `--kv-cache fp8`).
    #[arg(long, requires = "truth")]
    model: Vec<PathBuf>,
    #[command(flatten)]
    pub rt: RuntimeArgs,
    /// With --truth: maximum new tokens per page (default: the profile's, else 1024).
    #[arg(long, requires = "truth")]
    max_tokens: Option<usize>,
    /// With --truth: pages decoded together (default: the profile's, else 1).
    #[arg(long, requires = "truth")]
    batch_size: Option<usize>,
    /// With --truth: the pdfium library for PDF pages (default: as `ocrctl ocr` finds it).
    #[arg(long, requires = "truth")]
    pdfium_lib: Option<PathBuf>,
}

/// One page's result: its text and score, or why it failed.
type Outcome = Result<(String, Score), String>;

/// One export at one precision over every page.
struct Run {
    model: PathBuf,
    precision: &'static str,
    decoder: DecoderVariant,
    kv_cache: &'static str,
    /// `(document, page, outcome)` in input order.
    pages: Vec<(usize, usize, Outcome)>,
}

impl Run {
    fn total(&self) -> Score {
        let mut t = Score::default();
        for (_, _, o) in &self.pages {
            if let Ok((_, s)) = o {
                t += *s;
            }
        }
        t
    }

    fn failed(&self) -> usize {
        self.pages.iter().filter(|(_, _, o)| o.is_err()).count()
    }

    fn label(&self) -> String {
        format!(
            "{}, {} decoder, KV cache {}: {}",
            self.precision,
            self.decoder.name(),
            self.kv_cache,
            self.model.display()
        )
    }
}

/// Runs `ocrctl eval --truth`.
pub fn run(a: &TruthArgs, json: bool) -> anyhow::Result<ExitCode> {
    let dir = a.truth.as_deref().expect("called with --truth");
    let set = truth::load(dir, a.pdfium_lib.as_deref())
        .with_context(|| format!("--truth {}", dir.display()))?;
    for p in &set.problems {
        eprintln!("error: {p}");
    }
    let precisions: Vec<Option<String>> = match &a.rt.precision {
        None => vec![None],
        Some(list) => list
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| Some(p.to_string()))
            .collect(),
    };
    let mut runs = Vec::new();
    for model in &a.model {
        let with_model = || format!("--model {}", model.display());
        let export = Export::open(model).with_context(with_model)?;
        let pipeline = PagePipeline::new(Arc::new(export)).with_context(with_model)?;
        for p in &precisions {
            let rt = RuntimeArgs {
                precision: p.clone(),
                ..a.rt.clone()
            };
            runs.push(run_one(a, model, &rt, &pipeline, &set)?);
        }
    }
    if json {
        println!("{}", report_json(dir, &set, &runs));
    } else {
        print_tables(&set, &runs);
    }
    let ok = set.problems.is_empty() && runs.iter().all(|r| r.failed() == 0);
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Loads `model` as `rt` describes and reads every page of `set` with it.
fn run_one(
    a: &TruthArgs,
    model: &Path,
    rt: &RuntimeArgs,
    pipeline: &PagePipeline,
    set: &TruthSet,
) -> anyhow::Result<Run> {
    let export = pipeline.export();
    let (mut opts, profile) = rt.load_options(export)?;
    let batch = a
        .batch_size
        .or(profile.as_ref().map(|p| p.max_batch_size as usize))
        .unwrap_or(1);
    let max_tokens = a
        .max_tokens
        .or(profile.as_ref().map(|p| p.default_max_new_tokens as usize))
        .unwrap_or(1024);
    if batch == 0 || max_tokens == 0 {
        anyhow::bail!("--batch-size and --max-tokens must be at least 1");
    }
    opts.kv_slots = batch;
    let precision = opts.precision.name();
    let m = OrtModel::open(export, &opts)
        .with_context(|| format!("--model {} at {precision}", model.display()))?;
    let decoder = m.decoder_variant();
    let kv_cache = match decoder {
        DecoderVariant::Gqa => export.manifest.kv_cache.name(),
        _ => "auto",
    };
    eprintln!(
        "ocrctl: reading {} page(s) at {precision} ({} decoder, KV cache {kv_cache}) with {}",
        set.pages(),
        decoder.name(),
        model.display()
    );
    // Greedy, the model's other defaults: what `ocrctl ocr --temperature 0` runs.
    let greedy = SamplingOverrides {
        temperature: Some(0.0),
        ..Default::default()
    };
    let params = greedy.apply(&pipeline.defaults);
    let mut engine = Engine::new(m, batch, pipeline.image_token_id());
    let pages = read_pages(&mut engine, pipeline, set, &params, max_tokens, a);
    Ok(Run {
        model: model.to_path_buf(),
        precision,
        decoder,
        kv_cache,
        pages,
    })
}

/// Every page of `set` through `engine`, scored; failures named on stderr.
fn read_pages(
    engine: &mut Engine<OrtModel>,
    pipeline: &PagePipeline,
    set: &TruthSet,
    params: &SamplingParams,
    max_tokens: usize,
    a: &TruthArgs,
) -> Vec<(usize, usize, Outcome)> {
    // Rendered like `ocrctl ocr` does: in a worker process, default limits.
    let sandbox = Sandbox::new(a.pdfium_lib.clone(), PdfLimits::default());
    let reader = PdfReader::Sandboxed(std::sync::Arc::new(sandbox));
    let mut loader = PageLoader::with_reader(reader, preprocess::DEFAULT_MAX_PIXELS);
    let mut units = set
        .docs
        .iter()
        .enumerate()
        .flat_map(|(d, t)| (0..t.pages.len()).map(move |p| (d, p)));
    let name = |d: usize, p: usize| set.docs[d].doc.page_name(p);
    let (mut order, mut out) = (Vec::new(), Vec::new());
    // Pages are loaded as the engine admits them, as in `ocrctl ocr`.
    let requests = std::iter::from_fn(|| loop {
        let (d, p) = units.next()?;
        let doc = &set.docs[d].doc;
        let page = loader
            .load(doc, p)
            .map_err(anyhow::Error::from)
            .and_then(|img| Ok(pipeline.prepare(&img)?));
        match page {
            Ok(page) => {
                order.push((d, p));
                return Some(pipeline.request_with(page, params.clone(), max_tokens));
            }
            Err(e) => out.push((d, p, Err(named(&name(d, p), describe(&e))))),
        }
    });
    let results = engine.run(requests, &mut |_| {});
    for ((d, p), r) in order.into_iter().zip(results) {
        let text = r
            .map_err(|e| e.to_string())
            .and_then(|g| pipeline.text(&g.token_ids).map_err(|e| e.to_string()));
        let outcome = text
            .map(|t| {
                let s = cer::score(&t, &set.docs[d].pages[p]);
                (t, s)
            })
            .map_err(|e| named(&name(d, p), e));
        out.push((d, p, outcome));
    }
    out.sort_by_key(|(d, p, _)| (*d, *p));
    for (_, _, o) in &out {
        if let Err(e) = o {
            eprintln!("error: {e}");
        }
    }
    out
}

/// `msg` as is when it starts with `name`'s file, else prefixed with `name`.
fn named(name: &str, msg: String) -> String {
    let file = name.split(": page ").next().unwrap_or(name);
    if msg.contains(file) {
        msg
    } else {
        format!("{name}: {msg}")
    }
}

fn pct(x: f64) -> String {
    format!("{:.2}%", 100.0 * x)
}

/// A table of pages per run, then one line per run when there are several.
fn print_tables(set: &TruthSet, runs: &[Run]) {
    let names: Vec<String> = set
        .docs
        .iter()
        .flat_map(|t| (0..t.pages.len()).map(|p| t.doc.page_name(p)))
        .collect();
    let w = names
        .iter()
        .map(|n| n.chars().count())
        .max()
        .unwrap_or(0)
        .max(16);
    let row = |name: &str, s: &Score| {
        println!(
            "{name:<w$} {:>7} {:>7} {:>8} {:>7} {:>7} {:>8}",
            s.chars.len,
            s.chars.errors,
            pct(s.chars.rate()),
            s.words.len,
            s.words.errors,
            pct(s.words.rate())
        )
    };
    for r in runs {
        println!("{}", r.label());
        println!(
            "{:<w$} {:>7} {:>7} {:>8} {:>7} {:>7} {:>8}",
            "page", "chars", "errors", "CER", "words", "errors", "WER"
        );
        for (d, p, o) in &r.pages {
            match o {
                Ok((_, s)) => row(&set.docs[*d].doc.page_name(*p), s),
                Err(_) => println!("{:<w$} failed", set.docs[*d].doc.page_name(*p)),
            }
        }
        let scored = r.pages.len() - r.failed();
        row(&format!("overall ({scored} pages)"), &r.total());
        println!();
    }
    if runs.len() > 1 {
        println!(
            "{:<10} {:<8} {:<8} {:>6} {:>6} {:>8} {:>8}  model",
            "precision", "decoder", "kv cache", "pages", "failed", "CER", "WER"
        );
        for r in runs {
            let t = r.total();
            println!(
                "{:<10} {:<8} {:<8} {:>6} {:>6} {:>8} {:>8}  {}",
                r.precision,
                r.decoder.name(),
                r.kv_cache,
                r.pages.len() - r.failed(),
                r.failed(),
                pct(t.chars.rate()),
                pct(t.words.rate()),
                r.model.display()
            );
        }
    }
    println!("(text normalised: {})", cer::NORMALISATION);
}

fn score_json(s: &Score) -> Value {
    json!({
        "cer": s.chars.rate(), "wer": s.words.rate(),
        "char_errors": s.chars.errors, "chars": s.chars.len,
        "word_errors": s.words.errors, "words": s.words.len,
    })
}

/// The whole report as one JSON object.
fn report_json(dir: &Path, set: &TruthSet, runs: &[Run]) -> Value {
    let runs: Vec<Value> = runs
        .iter()
        .map(|r| {
            let rows: Vec<Value> = r
                .pages
                .iter()
                .map(|(d, p, o)| {
                    let t = &set.docs[*d];
                    let mut v = json!({
                        "file": t.doc.path.display().to_string(),
                        "page": p + 1,
                        "truth": t.truth.display().to_string(),
                    });
                    match o {
                        Ok((text, s)) => {
                            v["text"] = json!(text);
                            v["score"] = score_json(s);
                        }
                        Err(e) => v["error"] = json!(e),
                    }
                    v
                })
                .collect();
            json!({
                "model": r.model.display().to_string(),
                "precision": r.precision,
                "decoder": r.decoder.name(),
                "kv_cache": r.kv_cache,
                "pages": r.pages.len() - r.failed(),
                "failed": r.failed(),
                "overall": score_json(&r.total()),
                "rows": rows,
            })
        })
        .collect();
    json!({
        "truth": dir.display().to_string(),
        "normalisation": cer::NORMALISATION,
        "problems": set.problems.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
        "runs": runs,
    })
}
