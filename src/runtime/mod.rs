//! Running an export: the [`backend::Backend`] trait between generation and a runtime, and
//! its ONNX Runtime implementation.
//!
//! [`ortmodel`] (sessions of an export, the KV cache on the device, the GQA slot cache),
//! [`providers`] (TensorRT → CUDA → CPU with fallback), [`devices`] (`--devices`: one engine
//! per device), [`ortlib`] (finding and loading `libonnxruntime`), [`cudalibs`] (the CUDA
//! wheels the GPU provider needs), [`libsearch`] (where wheel libraries are looked for),
//! [`gpumem`] (GPU memory from `nvidia-smi`), [`trtrtx`] (the TensorRT-RTX plugin provider and
//! engines built ahead of time), [`policy`] (a hardware profile and explicit choices made
//! into an export's load options). In unit tests only, `fake` holds the one configurable fake
//! `Backend` the tests use instead of a model.

pub mod backend;
pub mod cudalibs;
pub mod devices;
#[cfg(test)]
pub mod fake;
pub mod gpumem;
pub mod libsearch;
pub mod ortlib;
pub mod ortmodel;
pub mod policy;
pub mod providers;
pub mod trtrtx;
