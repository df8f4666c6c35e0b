//! Hardware profiles: what one machine may run, read from YAML, and the memory it needs.
//!
//! A profile (`profiles/16gb.yaml`, `24gb.yaml`, `80gb.yaml`, `cpu.yaml`) bounds everything
//! that costs memory: batch size, image side, sequence length (prompt + output), the KV-cache
//! budget, the TensorRT workspace and the CUDA arena. Three things live here:
//!
//! - [`Profile`]: the schema (serde, unknown fields rejected) and [`Profile::validate`], whose
//!   errors name the file, the field and the reason ([`ProfileError`]).
//! - [`trt_shapes`]: the TensorRT EP's `trt_profile_{min,opt,max}_shapes` strings, derived
//!   from the profile and the model's dimensions ([`ModelDims`]), never written by hand.
//! - [`budget`]: a memory calculator (weights, KV cache, activations, workspace, runtime
//!   overhead) whose [`Budget`] says whether the profile fits a device, prints as a table, and
//!   names what to lower when it does not ([`Budget::advice`]).
//!
//! # Finding a profile
//!
//! [`Profile::load`] takes a name or a path. An argument containing `/` (or `\`) or ending
//! in `.yaml`/`.yml` is a path, read as is. Anything else is a name, resolved in this order:
//!
//! 1. `$OCRCTL_PROFILES_DIR/<name>.yaml` (an explicit override, even of a built-in name);
//! 2. the built-in profiles embedded in the binary (`16gb`, `24gb`, `80gb`, `cpu`), so they
//!    work from any directory and always match the binary;
//! 3. `<name>.yaml` in a `profiles/` folder of any ancestor of the executable (a checkout's
//!    `target/debug/ocrctl` finds the checkout's `profiles/`), then `./profiles/`.
//!
//! To load a file of the current directory that shares a built-in's name, write a path
//! (`./16gb.yaml`).
//!
//! # Units
//!
//! Every `*_gb` field is GiB (2^30 bytes, what `nvidia-smi` reports in MiB divided by 1024);
//! `max_body_mb` is MiB.

use ocrctl_exporters::config::ModelConfig;
use ocrctl_exporters::export::{Manifest, Precision, MANIFEST};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};

/// The built-in profiles, embedded at build time: `(name, YAML text)`.
pub const BUILTIN: &[(&str, &str)] = &[
    ("16gb", include_str!("../../profiles/16gb.yaml")),
    ("24gb", include_str!("../../profiles/24gb.yaml")),
    ("80gb", include_str!("../../profiles/80gb.yaml")),
    ("cpu", include_str!("../../profiles/cpu.yaml")),
];

/// Environment variable naming a folder searched first for `<name>.yaml`.
pub const PROFILES_DIR_ENV: &str = "OCRCTL_PROFILES_DIR";

/// Largest image side the model accepts (the preprocessor caps the longest side at 1540 px).
pub const MAX_IMAGE_SIDE: u32 = ocrctl_exporters::contract::image::LONGEST_EDGE;

/// Image sides are multiples of this (patch 14 × spatial merge 2).
pub const IMAGE_SIDE_UNIT: u32 = 28;

/// Chat-template tokens around the image placeholder: LightOnOCR-2-1B's template renders
/// 12 (`<|im_start|>system<|im_end|>\n<|im_start|>user\n` … `<|im_end|>\n<|im_start|>assistant\n`),
/// rounded up for templates that add a few.
pub const PROMPT_TOKENS: u64 = 16;

/// Device memory the CUDA runtime takes before any tensor: the context, ONNX Runtime's CUDA
/// EP cuBLAS/cuBLASLt and cuDNN handles and their workspaces (measured contexts are
/// 300-500 MiB on recent GPUs; this rounds up).
pub const CUDA_RUNTIME_BYTES: u64 = 512 * MIB;

/// Extra device memory when TensorRT is loaded: its own cuBLAS and cuDNN initialisation
/// (TensorRT logs about +222 MiB for cuBLAS/cuBLASLt and +172 MiB for cuDNN).
pub const TENSORRT_RUNTIME_BYTES: u64 = 384 * MIB;

/// Host memory of the process besides weights and tensors on a CPU-only profile: ONNX
/// Runtime, the tokenizer, image decoding buffers.
pub const CPU_RUNTIME_BYTES: u64 = 256 * MIB;

/// Share of the device memory left unplanned: allocator rounding and fragmentation, the
/// display or other processes. A profile fits when its total stays below the rest.
pub const MIN_HEADROOM_FRACTION: f64 = 0.05;

/// Activation tensors of width `hidden` alive at the peak of an encoder/decoder layer
/// (residual, normed input, q, k, v, attention output).
pub(crate) const HIDDEN_COPIES: u64 = 6;

/// Activation tensors of the MLP's intermediate width alive at once (gate, up, product).
pub(crate) const MLP_COPIES: u64 = 3;

/// Bytes per element of unfused attention scores: the exported graphs compute scores and
/// softmax in float32 and both are alive at once.
pub(crate) const SCORE_BYTES: u64 = 8;

pub(crate) const MIB: u64 = 1 << 20;
pub(crate) const GIB: u64 = 1 << 30;

pub mod auto;
mod budget;
mod locate;
mod report;
mod schema;
mod shapes;
#[cfg(test)]
mod tests;

pub use budget::*;
pub use locate::*;
pub(crate) use report::*;
pub use schema::*;
pub use shapes::*;
