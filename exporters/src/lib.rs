//! ocrctl-exporters: read LightOnOCR checkpoints and write them as ONNX graphs.
//!
//! Stages, one module each:
//! - [`config`]: `config.json` in the hub (`mistral3`) and transformers (`lighton_ocr`)
//!   flavours, normalised into [`config::ModelConfig`].
//! - [`checkpoint`]: memory-mapped safetensors (single file or sharded), bf16/fp16/fp32.
//! - [`hub`]: a hub id (`lightonai/LightOnOCR-2-1B`) found in the Hugging Face cache.
//! - [`dummy`]: random weights with real shapes (`dummy:lightonocr-2-1b`), for benchmarks.
//! - [`graph`] and [`proto`]: a typed ONNX graph builder and protobuf writer.
//! - [`layers`]: the one place where Linear, RMSNorm, RoPE and attention are emitted, per
//!   [`layers::Target`] (standard ops for TensorRT, ORT fused ops for CUDA/CPU).
//! - [`vision`], [`decoder`], [`embed`]: one module per exported graph.
//! - [`export`]: the whole export with an atomic rename and the `ocrctl.json` manifest.
//!
//! Nothing in this crate runs a model.
//!
//! ```no_run
//! use ocrctl_exporters::export::{export, ExportOptions};
//! let opts = ExportOptions::new("ckpt".into(), "out".into());
//! export(&opts, &mut |_| {}).unwrap();
//! ```

pub mod awq;
pub mod checkpoint;
pub mod config;
pub mod contract;
pub mod decoder;
pub mod decoder_gqa;
pub mod decoder_paged;
pub mod dtype;
pub mod dummy;
pub mod embed;
pub mod engines;
pub mod export;
pub mod family;
pub mod graph;
pub mod hub;
pub mod kv_cache;
pub mod layers;
pub mod manifest;
pub mod processor;
pub mod proto;
pub mod quant;
pub mod variants;
pub mod verify;
pub mod vision;

use std::path::{Path, PathBuf};

/// Everything that can go wrong while reading a checkpoint or writing an export.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: {message}")]
    Config { file: PathBuf, message: String },
    #[error("{file}: not a valid safetensors file: {message}")]
    Safetensors { file: PathBuf, message: String },
    #[error("tensor `{tensor}` not found in the checkpoint ({searched})")]
    MissingTensor { tensor: String, searched: String },
    #[error("tensor `{tensor}` in {file}: expected shape {expected:?}, found {found:?}")]
    TensorShape {
        tensor: String,
        file: PathBuf,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error(
        "tensor `{tensor}` in {file}: dtype {dtype} is not supported (expected BF16, F16 or F32)"
    )]
    TensorDtype {
        tensor: String,
        file: PathBuf,
        dtype: String,
    },
    #[error("{0}")]
    Invalid(String),
}

impl ExportError {
    /// An I/O error on `path`.
    pub fn io(path: &Path, source: std::io::Error) -> ExportError {
        ExportError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// A config error in `file`.
    pub fn config(file: &Path, message: impl Into<String>) -> ExportError {
        ExportError::Config {
            file: file.to_path_buf(),
            message: message.into(),
        }
    }
}
