//! Chat completion responses and stream chunks, as JSON in the shape OpenAI's clients (and
//! vLLM's) read.

use crate::generation::generate::TokenLogprob;
use serde_json::{json, Value};

/// One token's entry of `choices[0].logprobs.content`.
pub fn logprob_entry(
    token: &str,
    logprob: f32,
    top: &[TokenLogprob],
    name: &dyn Fn(u32) -> String,
) -> Value {
    let top: Vec<Value> = top
        .iter()
        .map(|t| {
            let s = name(t.id);
            json!({"token": s, "logprob": t.logprob, "bytes": s.as_bytes()})
        })
        .collect();
    json!({"token": token, "logprob": logprob, "bytes": token.as_bytes(), "top_logprobs": top})
}

/// `usage` of a response.
pub fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

/// A non-streaming response.
#[allow(clippy::too_many_arguments)]
pub fn completion(
    id: &str,
    created: u64,
    model: &str,
    text: &str,
    finish: &str,
    stop_reason: Option<&str>,
    logprobs: Option<Vec<Value>>,
    usage: Value,
) -> Value {
    json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": logprobs.map(|c| json!({"content": c})),
            "finish_reason": finish,
            "stop_reason": stop_reason,
        }],
        "usage": usage,
    })
}

/// A stream chunk with `delta` (and `finish_reason`, `usage` on the last one).
pub fn chunk(
    id: &str,
    created: u64,
    model: &str,
    delta: Value,
    logprobs: Option<Vec<Value>>,
    finish: Option<&str>,
    usage: Option<Value>,
) -> Value {
    let mut v = json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "delta": delta,
            "logprobs": logprobs.map(|c| json!({"content": c})),
            "finish_reason": finish,
        }],
    });
    if let Some(u) = usage {
        v["usage"] = u;
    }
    v
}
