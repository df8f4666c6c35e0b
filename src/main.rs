//! `ocrctl`: export LightOnOCR to ONNX and run it with ONNX Runtime.
//!
//! ```text
//! ocrctl export --checkpoint tests/fixtures/tiny-lightonocr/checkpoint --out out/tiny
//! ocrctl ocr --model out/tiny --max-tokens 64 --temperature 0 --json page.png
//! ocrctl serve --model out/tiny --profile cpu --precision fp32 --port 8000
//! ```

mod cli;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Export LightOnOCR checkpoints to ONNX and run them with ONNX Runtime.
#[derive(Parser, Debug)]
#[command(name = "ocrctl", version, about, long_about = None)]
struct Cli {
    /// Log lines as `plain` text or `json` objects (level from RUST_LOG, e.g.
    /// `RUST_LOG=ocrctl=debug` for one line per request).
    #[arg(
        long,
        global = true,
        env = "OCRCTL_LOG_FORMAT",
        value_enum,
        default_value = "plain"
    )]
    log_format: cli::logging::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Write a checkpoint as ONNX graphs (vision encoder, token embeddings, decoder).
    Export(cli::export::ExportArgs),
    /// OCR images and PDFs (files, folders, glob patterns) with an exported model.
    Ocr(cli::ocr::OcrArgs),
    /// Compare a candidate export (e.g. int4) with a reference (e.g. fp32), teacher-forced;
    /// or, with --truth DIR, score exports' text against expected texts (CER, WER).
    Eval(cli::eval::EvalArgs),
    /// Time the vision encoder, prefill and decoding on synthetic pages.
    Bench(cli::bench::BenchArgs),
    /// Hardware profiles: list them, show one, check one's memory budget against an export.
    Profiles(cli::profiles::ProfilesArgs),
    /// Serve the OpenAI-compatible API (/v1/chat/completions, /v1/ocr) and an upload page.
    Serve(cli::serve::ServeArgs),
    /// Report the ONNX Runtime library, execution providers, GPUs and fitting profiles.
    Doctor(cli::doctor::DoctorArgs),
    /// Check every file of an export against the sha256 digests in its ocrctl.json.
    Verify(cli::verify::VerifyArgs),
    /// Build TensorRT-RTX engines for a profile ahead of time (no GPU needed).
    BuildEngines(cli::build_engines::BuildEnginesArgs),
    /// Internal: the worker process that reads PDFs for `ocr` and `serve` under limits.
    #[command(name = "pdf-worker", hide = true)]
    PdfWorker(PdfWorkerArgs),
}

/// Arguments of the hidden `pdf-worker` subcommand (see `documents::pdf::worker`).
#[derive(clap::Args, Debug)]
struct PdfWorkerArgs {
    /// Address space of the process, bytes.
    #[arg(long)]
    memory_bytes: u64,
    /// CPU seconds a request may take.
    #[arg(long)]
    cpu_seconds: u64,
    /// The pdfium library (else searched).
    #[arg(long)]
    pdfium_lib: Option<std::path::PathBuf>,
}

fn main() -> ExitCode {
    cli::malloc::give_back_freed_memory();
    // Bad flags exit 1 like every other failure to run (clap's own code is 2, which
    // `ocrctl ocr` keeps for "some inputs failed"); help and version exit 0.
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return match e.use_stderr() {
                true => ExitCode::FAILURE,
                false => ExitCode::SUCCESS,
            };
        }
    };
    if let Command::PdfWorker(a) = &cli.command {
        use ocrctl::documents::pdf::worker;
        return worker::run(a.pdfium_lib.as_deref(), a.memory_bytes, a.cpu_seconds);
    }
    cli::logging::init(cli.log_format);
    let result = match cli.command {
        Command::Export(a) => cli::export::run(a),
        Command::Ocr(a) => cli::ocr::run(a),
        Command::Eval(a) => cli::eval::run(a),
        Command::Bench(a) => cli::bench::run(a),
        Command::Profiles(a) => cli::profiles::run(a),
        Command::Doctor(a) => cli::doctor::run(a),
        Command::Serve(a) => cli::serve::run(a),
        Command::Verify(a) => cli::verify::run(a),
        Command::BuildEngines(a) => cli::build_engines::run(a),
        Command::PdfWorker(_) => unreachable!("served above"),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", cli::common::describe(&e));
            ExitCode::FAILURE
        }
    }
}
