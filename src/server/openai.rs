//! OpenAI wire types: parsing `/v1/chat/completions` requests ([`request`]) and the typed
//! responses and stream chunks ([`response`]), in the shape the `openai` clients (and vLLM)
//! use.
//!
//! Requests are deserialised into typed structs ([`ChatCompletionRequest`]) so that an
//! error names the parameter at fault (`messages[0].content[1].image_url.url`, `top_p`, …);
//! the checks serde cannot express (limits, roles, data URLs) follow, into [`ChatParams`].
//! OpenAI's `presence_penalty` and `frequency_penalty` (-2 to 2) and `logit_bias` (ids to
//! -100..100, at most [`MAX_LOGIT_BIAS`], added before the penalties) are applied, as vLLM
//! applies them; vLLM's extra sampling parameters `top_k`, `repetition_penalty` and
//! `ignore_eos` are accepted at the top level; unknown fields are ignored.

pub mod request;
pub mod response;

pub use request::{
    image_source, parse_chat, text_bytes, ChatCompletionRequest, ChatParams, Content, ImageSource,
    ImageUrl, Message, Part, Seed, Stop, MAX_LOGIT_BIAS, MAX_MESSAGES, MAX_STOP_BYTES,
    MAX_STOP_STRINGS, MAX_TOP_LOGPROBS,
};
pub use response::{
    ChatCompletion, ChatCompletionChunk, ChatMessage, Choice, ChunkChoice, ChunkHead, Delta,
    Logprobs, ModelCard, ModelList, TokenLogprob, TopLogprob, Usage,
};
