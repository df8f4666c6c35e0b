//! Turning prompts into tokens: [`engine`] (continuous batching over a
//! [`crate::runtime::backend::Backend`]: admission, prefill, decode steps, events),
//! [`sampling`] (greedy, temperature, top-p/top-k, repetition penalty, the loop guard),
//! [`generate`] (the multimodal prefill, finish reasons, top-K log-probabilities),
//! [`outcome`] (a page's status, its retries and what a document with failed pages becomes),
//! [`pipeline`] (one page → one request: prompt, pixels, stop ids, the model's defaults) and
//! [`vision`] (images encoded on a thread of their own while the batch decodes).

pub mod engine;
pub mod generate;
pub mod outcome;
pub mod pipeline;
pub mod sampling;
pub mod vision;
