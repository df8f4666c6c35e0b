//! Chat completion responses, stream chunks and the model list, as typed structs in the shape
//! OpenAI's clients (and vLLM's) read.
//!
//! Two choices keep the bytes on the wire as they were when these bodies were built as
//! `serde_json` values:
//! - fields are declared in alphabetical order, the order in which `serde_json`'s maps
//!   (without its `preserve_order` feature) write their keys;
//! - log-probabilities are `f64`, the `f32` widened as a `serde_json::Value` holds it
//!   (`-0.10000000149011612`, not `-0.1`); NaN and infinities are written `null`.
//!
//! `Option` fields without `skip_serializing_if` are written `null` when absent (OpenAI's
//! `logprobs: null`, vLLM's `stop_reason: null`); the others are left out.

use crate::server::worker::{Candidate, TokenLogprobs};
use serde::Serialize;

/// An alternative token of a `top_logprobs` list.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopLogprob {
    pub bytes: Vec<u8>,
    pub logprob: f64,
    pub token: String,
}

impl From<&Candidate> for TopLogprob {
    fn from(c: &Candidate) -> TopLogprob {
        TopLogprob {
            bytes: c.token.as_bytes().to_vec(),
            logprob: f64::from(c.logprob),
            token: c.token.clone(),
        }
    }
}

/// One token's entry of `choices[0].logprobs.content`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenLogprob {
    pub bytes: Vec<u8>,
    pub logprob: f64,
    pub token: String,
    pub top_logprobs: Vec<TopLogprob>,
}

impl From<&TokenLogprobs> for TokenLogprob {
    fn from(t: &TokenLogprobs) -> TokenLogprob {
        let TopLogprob {
            bytes,
            logprob,
            token,
        } = TopLogprob::from(&t.chosen);
        TokenLogprob {
            bytes,
            logprob,
            token,
            top_logprobs: t.top.iter().map(TopLogprob::from).collect(),
        }
    }
}

/// `choices[0].logprobs`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Logprobs {
    pub content: Vec<TokenLogprob>,
}

impl Logprobs {
    /// The entries of `tokens`.
    pub fn of(tokens: &[TokenLogprobs]) -> Logprobs {
        Logprobs {
            content: tokens.iter().map(TokenLogprob::from).collect(),
        }
    }
}

/// `usage` of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub completion_tokens: usize,
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn new(prompt: usize, completion: usize) -> Usage {
        Usage {
            completion_tokens: completion,
            prompt_tokens: prompt,
            total_tokens: prompt + completion,
        }
    }
}

/// The assistant's message of a non-streaming response.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatMessage {
    pub content: String,
    pub role: &'static str,
}

/// The one choice of a non-streaming response.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Choice {
    pub finish_reason: &'static str,
    pub index: u32,
    pub logprobs: Option<Logprobs>,
    pub message: ChatMessage,
    /// The stop string that ended it, or why it was cut short (`repetition`); vLLM's field.
    pub stop_reason: Option<String>,
}

impl Choice {
    /// The assistant's `text`, ended by `finish_reason` (and `stop_reason`).
    pub fn new(
        text: String,
        finish_reason: &'static str,
        stop_reason: Option<String>,
        logprobs: Option<Logprobs>,
    ) -> Choice {
        Choice {
            finish_reason,
            index: 0,
            logprobs,
            message: ChatMessage {
                content: text,
                role: "assistant",
            },
            stop_reason,
        }
    }
}

/// A non-streaming response (`chat.completion`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatCompletion {
    pub choices: Vec<Choice>,
    pub created: u64,
    pub id: String,
    pub model: String,
    pub object: &'static str,
    pub usage: Usage,
}

impl ChatCompletion {
    pub fn new(id: String, created: u64, model: String, choice: Choice, usage: Usage) -> Self {
        ChatCompletion {
            choices: vec![choice],
            created,
            id,
            model,
            object: "chat.completion",
            usage,
        }
    }
}

/// What a stream chunk adds: the role (first chunk), text, or nothing (last chunk).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
}

impl<'a> Delta<'a> {
    /// The first chunk's: the assistant's role and empty text.
    pub fn role() -> Delta<'a> {
        Delta {
            content: Some(""),
            role: Some("assistant"),
        }
    }

    pub fn content(text: &'a str) -> Delta<'a> {
        Delta {
            content: Some(text),
            role: None,
        }
    }
}

/// The one choice of a stream chunk.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChunkChoice<'a> {
    pub delta: Delta<'a>,
    pub finish_reason: Option<&'static str>,
    pub index: u32,
    pub logprobs: Option<Logprobs>,
}

/// A stream chunk (`chat.completion.chunk`); `usage` only on the last one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatCompletionChunk<'a> {
    pub choices: Vec<ChunkChoice<'a>>,
    pub created: u64,
    pub id: &'a str,
    pub model: &'a str,
    pub object: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// What every chunk of one stream repeats: its id, creation time and model.
#[derive(Debug, Clone)]
pub struct ChunkHead {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl ChunkHead {
    /// A chunk of this stream with `delta` and `logprobs`.
    pub fn chunk<'a>(
        &'a self,
        delta: Delta<'a>,
        logprobs: Option<Logprobs>,
    ) -> ChatCompletionChunk<'a> {
        ChatCompletionChunk {
            choices: vec![ChunkChoice {
                delta,
                finish_reason: None,
                index: 0,
                logprobs,
            }],
            created: self.created,
            id: &self.id,
            model: &self.model,
            object: "chat.completion.chunk",
            usage: None,
        }
    }

    /// The last chunk: an empty delta with `finish_reason` and `usage`.
    pub fn last(&self, finish_reason: &'static str, usage: Usage) -> ChatCompletionChunk<'_> {
        let mut c = self.chunk(Delta::default(), None);
        c.choices[0].finish_reason = Some(finish_reason);
        c.usage = Some(usage);
        c
    }
}

/// `GET /v1/models`'s body.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelList<'a> {
    pub data: Vec<ModelCard<'a>>,
    pub object: &'static str,
}

/// One model of [`ModelList`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelCard<'a> {
    pub created: u64,
    pub id: &'a str,
    /// vLLM's: the longest sequence (prompt and completion) the model takes.
    pub max_model_len: usize,
    pub object: &'static str,
    pub owned_by: &'static str,
}

impl<'a> ModelList<'a> {
    /// The list of the one model a server serves.
    pub fn one(id: &'a str, created: u64, max_model_len: usize) -> ModelList<'a> {
        ModelList {
            data: vec![ModelCard {
                created,
                id,
                max_model_len,
                object: "model",
                owned_by: "ocrctl",
            }],
            object: "list",
        }
    }
}

#[cfg(test)]
mod tests;
