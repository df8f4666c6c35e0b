//! Command-line options shared by the commands that run a model (`ocr`, `bench`).

use anyhow::Context;
use clap::Args;
use ocrctl::ortmodel::LoadOptions;
use ocrctl::providers::{Provider, ProviderConfig};
use ocrctl_exporters::export::Precision;
use std::path::PathBuf;

/// How to run an exported model.
#[derive(Args, Debug, Clone)]
pub struct RuntimeArgs {
    /// Which exported graphs to run: fp32, fp16, int4 or int4-fp16.
    #[arg(long, default_value = "fp32")]
    pub precision: String,
    /// Execution providers in order of preference: tensorrt, cuda, cpu.
    #[arg(long, value_delimiter = ',', default_value = "cpu", value_parser = parse_provider)]
    pub providers: Vec<Provider>,
    /// Fail instead of falling back when a listed provider is unavailable.
    #[arg(long)]
    pub strict_providers: bool,
    /// ONNX Runtime intra-op threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Path of libonnxruntime.so (default: found automatically, see the README).
    #[arg(long, env = "OCRCTL_ORT_LIB")]
    pub ort_lib: Option<PathBuf>,
    /// `session.qdq_matmulnbits_accuracy_level` for int4 graphs on the CPU: 0 computes in
    /// float, 4 (ONNX Runtime's default) quantizes activations to int8.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(0..=4))]
    pub accuracy_level: u8,
}

fn parse_provider(s: &str) -> Result<Provider, String> {
    match s.trim() {
        "tensorrt" | "trt" => Ok(Provider::TensorRt),
        "cuda" => Ok(Provider::Cuda),
        "cpu" => Ok(Provider::Cpu),
        other => Err(format!(
            "unknown provider `{other}` (expected tensorrt, cuda or cpu)"
        )),
    }
}

impl RuntimeArgs {
    /// The load options these flags describe.
    pub fn load_options(&self) -> anyhow::Result<LoadOptions> {
        let precision = Precision::parse(&self.precision).context("--precision")?;
        let mut lo = LoadOptions::new(precision);
        lo.threads = self.threads;
        lo.ort_lib = self.ort_lib.clone();
        lo.accuracy_level = self.accuracy_level;
        lo.providers = ProviderConfig {
            order: self.providers.clone(),
            strict: self.strict_providers,
            ..ProviderConfig::default()
        };
        Ok(lo)
    }
}
