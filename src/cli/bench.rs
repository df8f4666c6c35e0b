//! `ocrctl bench`: phase timings of an exported model on synthetic pages.
//!
//! For each page size: vision encoder ms, prefill ms (embeddings + image merge + decoder over
//! the prompt; `of it host`: the embeddings and the merge), time to first token, the warm-up
//! run's time to first token (`first TTFT`: what the first page of a new size pays for
//! kernel plans made per shape), and decode tokens/s over a fixed number of new tokens
//! (end-of-sequence ignored: random weights never stop on their own) with every step's full
//! logits brought to the host and its token chosen there, as a request for log-probabilities
//! decodes (`logits tok/s`); the batch sweep's `decode tokens/s` is the engine's own path
//! (CUDA graphs where on, greedy ids chosen on the device). Medians over `--runs`
//! repetitions after one warm-up, plus the process's peak resident memory, and with a GPU
//! provider the process's peak GPU memory from `nvidia-smi` (polled at phase ends, outside the
//! timed spans; absent when nvidia-smi is not there) and where the decoder kept its KV cache.
//!
//! ```text
//! ocrctl export --checkpoint dummy:lightonocr-2-1b --out out/dummy --precision fp32,int4
//! ocrctl bench --model out/dummy --precision int4 --sizes 768x544,1540x1092 --new-tokens 32
//! ```

use crate::cli::common::parse_size;
use anyhow::Context;
use clap::Args;
use ocrctl::generation::engine::{Engine, Event, GenRequest};
use ocrctl::generation::generate::prompt_embeds;
use ocrctl::generation::pipeline::{synthetic_page, PagePipeline, PreparedPage};
use ocrctl::generation::sampling::{SamplingError, SamplingOverrides, SamplingParams};
use ocrctl::runtime::backend::Backend;
use ocrctl::runtime::ortmodel::{KvPath, LoadOptions, OrtModel};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::ExitCode;

mod table;
use std::time::Instant;
use table::print_table;

use ocrctl::runtime::gpumem::{GpuMonitor, GpuPeak};

/// `--kv-path`: how decoder runs move the KV cache.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
enum KvPathArg {
    /// Kept in the execution provider's memory (IoBinding).
    Bound,
    /// Copied to the host and back every step (`Session::run`), for comparison.
    Host,
}

/// Arguments of `ocrctl bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Exported model directory.
    #[arg(long)]
    model: PathBuf,
    #[command(flatten)]
    rt: crate::cli::common::RuntimeArgs,
    /// Page sizes WIDTHxHEIGHT in pixels (an A4 page at 1540 px is 1092x1540).
    #[arg(long, value_delimiter = ',', default_value = "1092x1540,544x768")]
    sizes: Vec<String>,
    /// New tokens decoded per run.
    #[arg(long, default_value_t = 32)]
    new_tokens: usize,
    /// Timed runs per size (after one warm-up run).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Batch sizes for the throughput sweep (continuous batching, pages of the first size).
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    batch_sizes: Vec<usize>,
    /// Pages per sweep point, as a multiple of its batch size. Above 1 the sweep measures
    /// steady-state continuous batching: pages join as others finish.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pages_per_slot: u32,
    /// Temperature of the throughput sweep's requests (0 = greedy). LightOnOCR's own
    /// generation_config.json samples at 0.2 with top-p 0.9, which `ocr` and `serve` apply.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Top-p of the throughput sweep's requests when they sample.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Top-k of the throughput sweep's requests when they sample (0 = off).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Repetition penalty of the throughput sweep's requests (1 = off).
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// Presence penalty of the throughput sweep's requests (0 = off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    presence_penalty: f32,
    /// Frequency penalty of the throughput sweep's requests (0 = off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    frequency_penalty: f32,
    /// Logit biases of the throughput sweep's requests, `ID=BIAS` (as `ocr --logit-bias`).
    #[arg(long, value_name = "ID=BIAS", value_delimiter = ',', allow_hyphen_values = true,
          value_parser = crate::cli::common::parse_logit_bias)]
    logit_bias: Vec<(u32, f32)>,
    /// Top log-probabilities each token of the sweep reports (0 = none; any number asks
    /// for the chosen token's log-probability too). Up to 64 come from the device's
    /// candidates; more take every step's full logits to the host (the path all
    /// log-probabilities took before 2026-12-03), for comparison.
    #[arg(long, default_value_t = 0)]
    top_logprobs: usize,
    /// Where the decoder keeps its KV cache between steps.
    #[arg(long, value_enum, default_value = "bound")]
    kv_path: KvPathArg,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write the JSON report to this file.
    #[arg(long)]
    json_out: Option<PathBuf>,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// Peak resident set size of this process in MiB (Linux `VmHWM`).
pub fn peak_rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// A sampling error as the flag that set it (`--top-p: ...`).
fn flag_error(e: SamplingError) -> anyhow::Error {
    anyhow::anyhow!("--{}: {e}", e.param().replace('_', "-"))
}

/// The sweep's requests: greedy unless --temperature, seeded so that runs repeat.
fn sweep_params(a: &BenchArgs) -> anyhow::Result<SamplingParams> {
    let params = SamplingOverrides {
        temperature: Some(a.temperature),
        top_p: Some(a.top_p),
        top_k: Some(a.top_k),
        repetition_penalty: Some(a.repetition_penalty),
        presence_penalty: Some(a.presence_penalty),
        frequency_penalty: Some(a.frequency_penalty),
        logit_bias: Some(ocrctl::generation::sampling::logit_bias(
            a.logit_bias.iter().copied(),
        )),
        seed: Some(0),
        loop_guard: None,
    }
    .apply(&SamplingParams::greedy());
    params.validate().map_err(flag_error)?;
    Ok(params)
}

/// The loaded model and what every phase of the benchmark shares.
struct Bench {
    engine: Engine<OrtModel>,
    pipeline: PagePipeline,
    gpu: GpuMonitor,
    opts: LoadOptions,
    image_token_id: u32,
    /// Seconds `OrtModel::open` took.
    load_s: f64,
}

impl Bench {
    /// Opens the export with room for the largest batch and the longest page.
    fn load(a: &BenchArgs, params: &SamplingParams) -> anyhow::Result<Bench> {
        let (mut opts, _profile, export) = a.rt.open(&a.model)?;
        opts.kv_slots = a.batch_sizes.iter().copied().max().unwrap_or(1).max(1);
        let cfg = export.config().clone();
        params
            .check_vocab(cfg.text.vocab_size)
            .map_err(flag_error)?;
        let pipeline = PagePipeline::new(export.clone())?;
        if opts.max_sequence_length == 0 {
            // A GQA decoder's cache needs the longest page's prompt plus the new tokens.
            let mut longest = 0;
            for s in &a.sizes {
                let (w, h) = parse_size("--sizes", s)?;
                longest = longest.max(pipeline.prepare(&synthetic_page(w, h))?.prompt_ids.len());
            }
            opts.max_sequence_length = longest + a.new_tokens + 1;
        }
        let t0 = Instant::now();
        let mut model = OrtModel::open(&export, &opts)?;
        let load_s = t0.elapsed().as_secs_f64();
        model.set_kv_path(match a.kv_path {
            KvPathArg::Bound => KvPath::Bound,
            KvPathArg::Host => KvPath::Host,
        });
        let mut gpu = GpuMonitor::new(
            model.decoder_provider().is_gpu(),
            opts.providers.device_id.max(0) as usize,
        );
        gpu.poll();
        Ok(Bench {
            engine: Engine::new(model, 1, cfg.image_token_id),
            pipeline,
            gpu,
            opts,
            image_token_id: cfg.image_token_id,
            load_s,
        })
    }

    /// The phase timings of every `--sizes` page, one row each.
    fn phase_rows(&mut self, a: &BenchArgs) -> anyhow::Result<Vec<Value>> {
        let mut rows = Vec::new();
        for s in &a.sizes {
            let (w, h) = parse_size("--sizes", s)?;
            let p = self.pipeline.prepare(&synthetic_page(w, h))?;
            rows.push(self.phase_row(a, &p)?);
        }
        Ok(rows)
    }

    /// One page size: a warm-up run, then `--runs` timed ones, reported as medians.
    fn phase_row(&mut self, a: &BenchArgs, p: &PreparedPage) -> anyhow::Result<Value> {
        let (mut vis, mut pf, mut pe, mut dec) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut row_gpu = GpuPeak::default();
        // The warm-up run's vision and prefill: what the first page of a new size costs
        // (kernel plans and algorithm searches made for each new shape).
        let mut first = (0.0, 0.0);
        for run in 0..=a.runs {
            let t = self.time_phases(p, a.new_tokens, &mut row_gpu)?;
            if run == 0 {
                first = (t.vision_ms, t.prefill_ms);
            } else {
                vis.push(t.vision_ms);
                pf.push(t.prefill_ms);
                pe.push(t.embed_ms);
                dec.push(a.new_tokens as f64 / t.decode_s);
            }
        }
        let (v, pr) = (median(&mut vis), median(&mut pf));
        let d = median(&mut dec);
        // The table comes at the end; a long sweep reports each phase as it finishes.
        tracing::info!(
            "bench {}x{}: vision {v:.1} ms, prefill {pr:.1} ms, decode {d:.0} tokens/s",
            p.width,
            p.height
        );
        Ok(json!({
            "size": format!("{}x{}", p.width, p.height),
            "image_tokens": p.image_tokens,
            "prompt_tokens": p.prompt_ids.len(),
            "vision_ms": v,
            "prefill_ms": pr,
            "prefill_embed_ms": median(&mut pe),
            "ttft_ms": v + pr,
            "first_vision_ms": first.0,
            "first_prefill_ms": first.1,
            "decode_tokens_per_s": d,
            "runs": a.runs,
            "gpu_process_mib": row_gpu.process_mib,
        }))
    }

    /// One run of page `p`: vision, prefill, then `new_tokens` greedy steps with every
    /// step's logits on the host; the GPU is polled after each phase, outside its span.
    fn time_phases(
        &mut self,
        p: &PreparedPage,
        new_tokens: usize,
        row_gpu: &mut GpuPeak,
    ) -> anyhow::Result<PhaseTimes> {
        let model = &mut self.engine.backend;
        let t = Instant::now();
        let feats = model.encode_image(&p.pixel_values)?;
        let vision_ms = t.elapsed().as_secs_f64() * 1e3;
        row_gpu.merge(&self.gpu.poll());
        // The prefill in its two halves: the prompt's embeddings with the image features
        // merged (host side), then the decoder over the prompt.
        let t = Instant::now();
        let e = prompt_embeds(
            |x| model.embed(x),
            &p.prompt_ids,
            self.image_token_id,
            &[feats],
        )?;
        let embed_ms = t.elapsed().as_secs_f64() * 1e3;
        let (mut logits, mut cache) = model.forward(e, None)?;
        let prefill_ms = t.elapsed().as_secs_f64() * 1e3;
        row_gpu.merge(&self.gpu.poll());
        let t = Instant::now();
        for _ in 0..new_tokens {
            let next = ocrctl::generation::generate::argmax_and_top_k(&logits, 0).0;
            let e = model.embed(&[next])?;
            (logits, cache) = model.forward(e, Some(cache))?;
        }
        let decode_s = t.elapsed().as_secs_f64();
        row_gpu.merge(&self.gpu.poll());
        drop(cache);
        Ok(PhaseTimes {
            vision_ms,
            embed_ms,
            prefill_ms,
            decode_s,
        })
    }

    /// Throughput: B identical pages through the engine at once, fixed new tokens each,
    /// for every `--batch-sizes` B (pages of the first size).
    fn batch_sweep(
        &mut self,
        a: &BenchArgs,
        params: &SamplingParams,
    ) -> anyhow::Result<Vec<Value>> {
        let mut sweep = Vec::new();
        if let Some(first) = a.sizes.first() {
            let (w, h) = parse_size("--sizes", first)?;
            let page = self.pipeline.prepare(&synthetic_page(w, h))?;
            for &b in &a.batch_sizes {
                sweep.push(self.sweep_point(a, params, &page, b)?);
            }
        }
        Ok(sweep)
    }

    /// One sweep point: `b × --pages-per-slot` pages at batch `b`.
    fn sweep_point(
        &mut self,
        a: &BenchArgs,
        params: &SamplingParams,
        page: &PreparedPage,
        b: usize,
    ) -> anyhow::Result<Value> {
        let engine = &mut self.engine;
        engine.max_batch = b.max(1);
        let n = b.max(1) * a.pages_per_slot as usize;
        let req = GenRequest {
            stop_ids: vec![],
            ignore_eos: true,
            logprobs: a.top_logprobs > 0,
            top_logprobs: a.top_logprobs,
            ..self
                .pipeline
                .request_with(page.clone(), params.clone(), a.new_tokens)
        };
        let before = engine.backend.kv_stats().clone();
        let t = Instant::now();
        let mut decode_start: Option<Instant> = None;
        let mut decode_tokens = 0usize;
        let mut seen_first = 0usize;
        let results = engine.run(std::iter::repeat_n(req, n), &mut |ev| {
            if let Event::Token { .. } = ev {
                seen_first += 1;
                if seen_first == b.max(1) {
                    decode_start = Some(Instant::now());
                } else if decode_start.is_some() {
                    decode_tokens += 1;
                }
            }
        });
        let total = t.elapsed().as_secs_f64();
        if let Some(e) = results.iter().find_map(|r| r.as_ref().err()) {
            anyhow::bail!("batch {b}: {e}");
        }
        let dec_s = decode_start.map_or(f64::NAN, |d| d.elapsed().as_secs_f64());
        let g = self.gpu.poll();
        tracing::info!(
            "bench batch {b}: {n} pages in {total:.2} s ({:.3} pages/s, decode {:.0} \
             tokens/s)",
            n as f64 / total,
            decode_tokens as f64 / dec_s
        );
        let after = engine.backend.kv_stats();
        let secs = |a: u64, b: u64| a.saturating_sub(b) as f64 * 1e-9;
        Ok(json!({
            // Where decode steps spent their time: embedding the tokens, the decoder run
            // (logits to the host included), copying the logits out (GQA decoder only);
            // the rest of `seconds` is prefills and the engine's own work (sampling).
            "step_embed_s": secs(after.step_embed_ns, before.step_embed_ns),
            "step_decoder_run_s": secs(after.step_run_ns, before.step_run_ns),
            "step_logits_s": secs(after.step_logits_ns, before.step_logits_ns),
            "batch": b,
            "pages": n,
            "size": format!("{}x{}", page.width, page.height),
            "seconds": total,
            "pages_per_s": n as f64 / total,
            "tokens_per_s": (n * a.new_tokens) as f64 / total,
            "decode_tokens_per_s": decode_tokens as f64 / dec_s,
            "gpu_process_mib": g.process_mib,
        }))
    }

    /// The JSON report: the settings, the model's paths and counters, the rows and the sweep.
    fn report(
        &self,
        a: &BenchArgs,
        params: &SamplingParams,
        rows: Vec<Value>,
        sweep: Vec<Value>,
    ) -> Value {
        let engine = &self.engine;
        json!({
            "model": a.model.display().to_string(),
            "precision": self.opts.precision.name(),
            "new_tokens": a.new_tokens,
            "temperature": a.temperature,
            "top_p": a.top_p,
            "top_k": a.top_k,
            "repetition_penalty": a.repetition_penalty,
            "presence_penalty": a.presence_penalty,
            "frequency_penalty": a.frequency_penalty,
            "logit_bias": params.logit_bias,
            "top_logprobs": a.top_logprobs,
            "threads": self.opts.threads,
            "load_s": self.load_s,
            "peak_rss_mib": peak_rss_mib(),
            "provider": engine.backend.decoder_provider().name(),
            "decoder": engine.backend.decoder_variant().part(),
            "vision_stage": engine.vision.is_some(),
            "vision_pixels": engine.backend.vision_pixels(),
            "prefill_stage": engine.vision.as_ref().is_some_and(|v| v.prefills()),
            "kv_cache": engine.backend.kv_slots().map(|(s, p)| json!({"sequences": s, "positions": p})),
            "gpu_memory": self.gpu.total.json(),
            "kv": kv_json(&engine.backend),
            "engine": {
                "decode_steps": engine.stats.steps,
                "overlapped_steps": engine.stats.overlapped_steps,
                "preemptions": engine.stats.preemptions,
            },
            "results": rows,
            "batch_sweep": sweep,
        })
    }
}

/// One timed run's phases.
struct PhaseTimes {
    vision_ms: f64,
    /// The prefill's host half: the prompt's embeddings with the image features merged.
    embed_ms: f64,
    /// The whole prefill, `embed_ms` included.
    prefill_ms: f64,
    decode_s: f64,
}

/// Runs the benchmark and prints the table (or JSON).
pub fn run(a: BenchArgs) -> anyhow::Result<ExitCode> {
    let params = sweep_params(&a)?;
    let mut bench = Bench::load(&a, &params)?;
    let rows = bench.phase_rows(&a)?;
    let sweep = bench.batch_sweep(&a, &params)?;
    let out = bench.report(&a, &params, rows, sweep);
    if let Some(p) = &a.json_out {
        std::fs::write(p, format!("{out:#}\n"))
            .with_context(|| format!("--json-out {}", p.display()))?;
    }
    if a.json {
        println!("{out}");
    } else {
        print_table(&out);
    }
    Ok(ExitCode::SUCCESS)
}

/// The decoder's KV path and counters (see [`ocrctl::runtime::ortmodel::KvStats`]).
fn kv_json(model: &OrtModel) -> serde_json::Value {
    let s = model.kv_stats();
    json!({
        "path": model.kv_path().name(),
        "location": s.kv_location,
        "bound_runs": s.bound_runs,
        "host_runs": s.host_runs,
        "repacks": s.repacks,
        "fallback": s.fallback,
        "step_embed_s": s.step_embed_ns as f64 * 1e-9,
        "step_decoder_run_s": s.step_run_ns as f64 * 1e-9,
        "step_logits_s": s.step_logits_ns as f64 * 1e-9,
        "step_logits_fallbacks": s.step_logits_fallbacks,
    })
}
