//! Turning prompts into tokens: [`engine`] (continuous batching over a
//! [`crate::runtime::backend::Backend`]: admission, prefill, decode steps, events),
//! [`sampling`] (greedy, temperature, top-p/top-k, repetition penalty, the loop guard) and
//! [`generate`] (greedy generation of one request, stop ids, finish reasons).

pub mod engine;
pub mod generate;
pub mod sampling;
