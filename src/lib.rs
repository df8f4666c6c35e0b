//! ocrctl: LightOnOCR exported to ONNX and run with ONNX Runtime.
//!
//! The crate by layer (the exporter is its own crate, `exporters/`):
//!
//! - [`model`]: the model's input contract — image preprocessing exactly as the reference,
//!   prompts and tokenizer.
//! - [`documents`]: inputs (files, folders, patterns, PDFs) as documents of pages.
//! - [`output`]: the model's Markdown made into what users keep (figures cropped, tables).
//! - [`runtime`]: the [`runtime::backend::Backend`] trait and its ONNX Runtime implementation,
//!   providers, devices, finding the shared libraries.
//! - [`generation`]: continuous batching, sampling, greedy generation.
//! - [`server`]: `ocrctl serve`, the OpenAI-compatible HTTP server over the engines.
//! - [`profile`]: hardware profiles, their validation, shapes and memory budgets.
//! - [`quality`]: evaluation against a reference precision, int4 calibration.
//!
//! One page's path from file to text: [`documents::inputs`] opens the file (pdfium renders a
//! PDF page) → [`model::preprocess`] decodes, resizes and normalises it → [`model::prompt`]
//! builds the prompt ids with one image token per patch → [`generation::engine`] admits the
//! request: [`runtime::ortmodel`] encodes the image (vision encoder), embeds the prompt,
//! splices the image features in and prefills the decoder → decode steps run the batch,
//! [`generation::sampling`] picks each token → [`model::prompt`] detokenises the ids to text.
//! The binary (`src/main.rs`, `src/cli/`) is a thin CLI over these modules.

pub mod documents;
pub mod generation;
pub mod model;
pub mod output;
pub mod profile;
pub mod quality;
pub mod runtime;
pub mod server;
