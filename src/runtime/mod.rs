//! Running an export: the [`backend::Backend`] trait between generation and a runtime, and
//! its ONNX Runtime implementation.
//!
//! [`ortmodel`] (sessions of an export, the KV cache on the device, the GQA slot cache),
//! [`providers`] (TensorRT → CUDA → CPU with fallback), [`devices`] (`--devices`: one engine
//! per device), [`ortlib`] (finding and loading `libonnxruntime`), [`cudalibs`] (the CUDA
//! wheels the GPU provider needs), [`libsearch`] (where wheel libraries are looked for),
//! [`gpumem`] (GPU memory from `nvidia-smi`).

pub mod backend;
pub mod ortmodel;
pub mod ortlib;
pub mod providers;
pub mod libsearch;
pub mod gpumem;
pub mod cudalibs;
pub mod devices;
