//! `ocrctl`: export LightOnOCR to ONNX and run it with ONNX Runtime.
//!
//! ```text
//! ocrctl export --checkpoint tests/fixtures/tiny-lightonocr/checkpoint --out out/tiny
//! ocrctl ocr --model out/tiny --max-tokens 64 --temperature 0 --json page.png
//! ocrctl serve --model out/tiny --profile cpu --precision fp32 --port 8000
//! ```

mod cmd_bench;
mod cmd_common;
mod cmd_doctor;
mod cmd_eval;
mod cmd_export;
mod cmd_ocr;
mod cmd_profiles;
mod cmd_serve;
mod cmd_verify;
mod ocr_output;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Export LightOnOCR checkpoints to ONNX and run them with ONNX Runtime.
#[derive(Parser, Debug)]
#[command(name = "ocrctl", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Write a checkpoint as ONNX graphs (vision encoder, token embeddings, decoder).
    Export(cmd_export::ExportArgs),
    /// OCR images and PDFs (files, folders, glob patterns) with an exported model.
    Ocr(cmd_ocr::OcrArgs),
    /// Compare a candidate export (e.g. int4) with a reference (e.g. fp32), teacher-forced.
    Eval(cmd_eval::EvalArgs),
    /// Time the vision encoder, prefill and decoding on synthetic pages.
    Bench(cmd_bench::BenchArgs),
    /// Hardware profiles: list them, show one, check one's memory budget against an export.
    Profiles(cmd_profiles::ProfilesArgs),
    /// Serve the OpenAI-compatible API (/v1/chat/completions, /v1/ocr) and an upload page.
    Serve(cmd_serve::ServeArgs),
    /// Report the ONNX Runtime library, execution providers, GPUs and fitting profiles.
    Doctor(cmd_doctor::DoctorArgs),
    /// Check every file of an export against the sha256 digests in its ocrctl.json.
    Verify(cmd_verify::VerifyArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Export(a) => cmd_export::run(a),
        Command::Ocr(a) => cmd_ocr::run(a),
        Command::Eval(a) => cmd_eval::run(a),
        Command::Bench(a) => cmd_bench::run(a),
        Command::Profiles(a) => cmd_profiles::run(a),
        Command::Doctor(a) => cmd_doctor::run(a),
        Command::Serve(a) => cmd_serve::run(a),
        Command::Verify(a) => cmd_verify::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", cmd_common::describe(&e));
            ExitCode::FAILURE
        }
    }
}
