//! What flows in and out of the [`Engine`](super::Engine): a generation request, the events
//! it reports while a batch runs, how a request fails, and the caller's answer to each event.

use crate::generation::generate::{Generation, TokenLogprob};
use crate::generation::sampling::SamplingParams;
use crate::model::preprocess::Pixels;

/// One generation request.
#[derive(Debug, Clone)]
pub struct GenRequest {
    pub prompt_ids: Vec<u32>,
    /// `[1, 3, H, W]` pixel values of the request's images, in prompt order (one run of
    /// image tokens in `prompt_ids` per image), held compactly until encoded.
    pub images: Vec<Pixels>,
    pub params: SamplingParams,
    pub max_new_tokens: usize,
    pub stop_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// Report the chosen token's log-probability at every step.
    pub logprobs: bool,
    /// Top log-probabilities recorded per step (0 = none).
    pub top_logprobs: usize,
}

impl GenRequest {
    /// A greedy text-only request (no images, no stop ids): for tests and examples.
    pub fn text(prompt_ids: Vec<u32>, max_new_tokens: usize) -> GenRequest {
        GenRequest {
            prompt_ids,
            images: Vec::new(),
            params: SamplingParams::greedy(),
            max_new_tokens,
            stop_ids: Vec::new(),
            ignore_eos: false,
            logprobs: false,
            top_logprobs: 0,
        }
    }
}

/// Something that happened to request `index` (the caller's id for it).
#[derive(Debug, Clone)]
pub enum Event<'a> {
    /// A token was generated. `logprob` is the chosen token's (when the request asked for
    /// log-probabilities), `top` the most likely tokens (when it asked for `top_logprobs`).
    Token {
        index: usize,
        id: u32,
        logprob: Option<f32>,
        top: &'a [TokenLogprob],
    },
    /// The request finished (successfully or not); it has left the batch.
    Done {
        index: usize,
        result: &'a Result<Generation, EngineError>,
    },
}

/// Why a request ended without a generation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// Its sampling parameters were refused.
    #[error("{0}")]
    InvalidParams(String),
    /// Prompt + new tokens do not fit the fixed-size KV cache.
    #[error(
        "the prompt ({prompt} tokens) and max_new_tokens ({max_new}) need {need} positions; \
         the KV cache holds {cap} per sequence (max_sequence_length)"
    )]
    TooLong {
        prompt: usize,
        max_new: usize,
        need: usize,
        cap: usize,
    },
    /// The runtime failed (prefill, or a decoder step shared with others).
    #[error("{0}")]
    Runtime(String),
    /// A bug caught while choosing its token (the others go on).
    #[error("internal error while choosing a token: {0}")]
    Internal(String),
    /// The caller cancelled it ([`Flow::Cancel`]).
    #[error("cancelled")]
    Cancelled,
    /// [`Engine::run`] ended before admitting it (never happens unless the engine is broken).
    #[error("request was never scheduled")]
    NeverScheduled,
}

impl EngineError {
    /// Whether the request itself is at fault (a client error), not the engine.
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            EngineError::InvalidParams(_) | EngineError::TooLong { .. }
        )
    }
}

/// What the caller wants after seeing a [`Event::Token`] (ignored for [`Event::Done`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Keep generating.
    Continue,
    /// Finish the request now, successfully, with
    /// [`FinishReason::Stop`](crate::generation::generate::FinishReason::Stop) (e.g. a stop
    /// string matched the text so far).
    Finish,
    /// Drop the request: its client is gone. Reported as `Done` with an error.
    Cancel,
}
