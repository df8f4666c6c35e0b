//! ocrctl runtime: image preprocessing, prompts, ONNX Runtime sessions and generation.
//!
//! Stages, one module each: [`preprocess`] (resize and normalise exactly as the reference),
//! [`prompt`] (chat template, tokenizer, image-token expansion), [`backend`] (the trait
//! between generation and a runtime), [`ortmodel`] (ONNX Runtime sessions of an export),
//! [`generate`] (greedy decoding), [`ortlib`] (finding `libonnxruntime`), [`pdf`] (rendering
//! PDF pages with pdfium), [`libsearch`] (where both libraries are looked for).
//! The binary (`src/main.rs`) is a thin CLI over these modules.

pub mod backend;
pub mod calibrate;
pub mod cudalibs;
pub mod devices;
pub mod engine;
pub mod eval;
pub mod generate;
pub mod gpumem;
pub mod inputs;
pub mod libsearch;
pub mod ortlib;
pub mod ortmodel;
pub mod pdf;
pub mod preprocess;
pub mod profile;
pub mod prompt;
pub mod providers;
pub mod sampling;
pub mod server;
