//! Turning prompts into tokens: [`engine`] (continuous batching over a
//! [`crate::runtime::backend::Backend`]: admission, prefill, decode steps, events),
//! [`sampling`] (greedy, temperature, top-p/top-k, repetition penalty, the loop guard) and
//! [`generate`] (the multimodal prefill, stop ids, finish reasons, top-K log-probabilities)
//! and [`pipeline`] (one page → one request: prompt, pixels, stop ids, the model's defaults).

pub mod engine;
pub mod generate;
pub mod pipeline;
pub mod sampling;
