//! OpenAI wire types: parsing `/v1/chat/completions` requests and building responses and
//! stream chunks, in the shape the `openai` clients (and vLLM) use.
//!
//! Requests are read field by field from JSON so an error can name the parameter at fault
//! (`messages[0].content[1].image_url.url`, `top_p`, …). vLLM's extra sampling parameters
//! `top_k` and `repetition_penalty` are accepted at the top level.

use super::error::ApiError;
use crate::generation::generate::TokenLogprob;
use base64::Engine as _;
use serde_json::{json, Map, Value};

/// Most stop strings one request may give (OpenAI allows 4; vLLM more).
pub const MAX_STOP_STRINGS: usize = 16;
/// Longest stop string, in bytes. Matching costs only the new text per token whatever the
/// length (see [`super::stops`]); the bound keeps a request's memory small.
pub const MAX_STOP_BYTES: usize = 1024;
/// Largest `top_logprobs` (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;
/// Most messages in one request.
pub const MAX_MESSAGES: usize = 256;

/// Where an image of a request comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum ImageSource {
    /// Bytes from a `data:` URL; `param` names the field it came from.
    Data { bytes: Vec<u8>, param: String },
    /// An `http(s)://` URL (fetched only with `--allow-remote-images`).
    Remote { url: String, param: String },
}

/// A parsed chat completion request.
#[derive(Debug, Clone, Default)]
pub struct ChatParams {
    /// The model name the client asked for, if any.
    pub model: Option<String>,
    /// The conversation in the chat template's shape (image parts as `{"type": "image"}`).
    pub messages: Value,
    /// The images in prompt order.
    pub images: Vec<ImageSource>,
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub repetition_penalty: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub logprobs: bool,
    pub top_logprobs: usize,
    /// vLLM's `ignore_eos`: keep generating past end-of-sequence tokens (benchmarks).
    pub ignore_eos: bool,
}

fn number(obj: &Map<String, Value>, key: &str) -> Result<Option<f64>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite())
            .map(Some)
            .ok_or_else(|| ApiError::bad(key, format!("{key} must be a number, got {v}"))),
    }
}

fn count(obj: &Map<String, Value>, key: &str) -> Result<Option<u64>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            ApiError::bad(
                key,
                format!("{key} must be a non-negative integer, got {v}"),
            )
        }),
    }
}

fn boolean(obj: &Map<String, Value>, key: &str) -> Result<bool, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(ApiError::bad(
            key,
            format!("{key} must be true or false, got {v}"),
        )),
    }
}

/// Parameters ocrctl does not implement; a non-default value is refused rather than ignored.
const UNSUPPORTED: [(&str, &str); 5] = [
    ("tools", "tool calls"),
    ("functions", "function calls"),
    ("response_format", "structured output"),
    ("audio", "audio output"),
    ("logit_bias", "logit_bias"),
];

/// Parses a `data:` URL's payload; only base64 payloads are accepted.
pub fn parse_data_url(url: &str, param: &str) -> Result<Vec<u8>, ApiError> {
    let rest = &url["data:".len()..];
    let Some((meta, payload)) = rest.split_once(',') else {
        return Err(ApiError::bad(
            param,
            "data URL has no ',' before its payload",
        ));
    };
    if !meta.split(';').any(|p| p.eq_ignore_ascii_case("base64")) {
        return Err(ApiError::bad(
            param,
            "data URL must be base64-encoded (data:image/png;base64,...)",
        ));
    }
    let cleaned: String = payload
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(cleaned.as_bytes())
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(cleaned.as_bytes()))
        .map_err(|e| ApiError::bad(param, format!("invalid base64 in data URL: {e}")))
}

/// Classifies an image URL: `data:` (decoded), `http(s)://` (kept), anything else refused.
pub fn image_source(url: &str, param: &str) -> Result<ImageSource, ApiError> {
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    if lower.starts_with("data:") {
        Ok(ImageSource::Data {
            bytes: parse_data_url(url, param)?,
            param: param.to_string(),
        })
    } else if lower.starts_with("http://") || lower.starts_with("https://") {
        Ok(ImageSource::Remote {
            url: url.to_string(),
            param: param.to_string(),
        })
    } else if lower.starts_with("file:") {
        Err(ApiError::bad(
            param,
            "file:// URLs are never read by the server",
        ))
    } else {
        Err(ApiError::bad(
            param,
            "image URL must be a data: URL (data:image/png;base64,...) or http(s)://",
        ))
    }
}

/// Converts one message's content to the template's shape, collecting its images.
fn content(v: &Value, at: &str, images: &mut Vec<ImageSource>) -> Result<Value, ApiError> {
    match v {
        Value::String(s) => Ok(Value::String(s.clone())),
        Value::Null => Ok(Value::String(String::new())),
        Value::Array(parts) => {
            let mut out = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let p = format!("{at}[{j}]");
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
                match kind {
                    "text" => {
                        let text = part.get("text").and_then(Value::as_str).ok_or_else(|| {
                            ApiError::bad(format!("{p}.text"), "text part needs a string `text`")
                        })?;
                        out.push(json!({"type": "text", "text": text}));
                    }
                    "image_url" => {
                        let url = match part.get("image_url") {
                            Some(Value::String(s)) => s.as_str(),
                            Some(Value::Object(o)) => {
                                o.get("url").and_then(Value::as_str).ok_or_else(|| {
                                    ApiError::bad(
                                        format!("{p}.image_url.url"),
                                        "image_url needs a string `url`",
                                    )
                                })?
                            }
                            _ => {
                                return Err(ApiError::bad(
                                    format!("{p}.image_url"),
                                    "image_url part needs `image_url: {\"url\": ...}`",
                                ))
                            }
                        };
                        images.push(image_source(url, &format!("{p}.image_url.url"))?);
                        out.push(json!({"type": "image"}));
                    }
                    other => {
                        return Err(ApiError::bad(
                            format!("{p}.type"),
                            format!("unsupported content part type {other:?} (text or image_url)"),
                        ))
                    }
                }
            }
            Ok(Value::Array(out))
        }
        other => Err(ApiError::bad(
            at,
            format!("content must be a string or a list of parts, got {other}"),
        )),
    }
}

/// Bytes of text in parsed `messages` (string contents and text parts), to bound the work
/// before tokenising.
pub fn text_bytes(messages: &Value) -> usize {
    let text_of = |c: &Value| match c {
        Value::String(s) => s.len(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .map(str::len)
            .sum(),
        _ => 0,
    };
    messages
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m.get("content"))
        .map(text_of)
        .sum()
}

/// Parses a `/v1/chat/completions` body.
pub fn parse_chat(body: &[u8]) -> Result<ChatParams, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("request body is not valid JSON: {e}")))?;
    let Value::Object(obj) = v else {
        return Err(ApiError::invalid("request body must be a JSON object"));
    };
    for (key, what) in UNSUPPORTED {
        if obj.get(key).is_some_and(|v| !v.is_null()) {
            return Err(ApiError::bad(
                key,
                format!("{what} are not supported by this server"),
            ));
        }
    }
    for key in ["presence_penalty", "frequency_penalty"] {
        if number(&obj, key)?.is_some_and(|x| x != 0.0) {
            return Err(ApiError::bad(
                key,
                format!("{key} is not supported; use repetition_penalty"),
            ));
        }
    }
    let n = count(&obj, "n")?.unwrap_or(1);
    if n != 1 {
        return Err(ApiError::bad("n", format!("n must be 1 (got {n})")));
    }
    let model = match obj.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => {
            return Err(ApiError::bad(
                "model",
                format!("model must be a string, got {v}"),
            ))
        }
    };
    let msgs = match obj.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(ApiError::bad("messages", "messages is empty")),
        Some(_) => return Err(ApiError::bad("messages", "messages must be a list")),
        None => return Err(ApiError::bad("messages", "missing required field messages")),
    };
    if msgs.len() > MAX_MESSAGES {
        return Err(ApiError::bad(
            "messages",
            format!("at most {MAX_MESSAGES} messages per request"),
        ));
    }
    let mut images = Vec::new();
    let mut messages = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).ok_or_else(|| {
            ApiError::bad(
                format!("messages[{i}].role"),
                "each message needs a string role",
            )
        })?;
        if !matches!(role, "system" | "user" | "assistant" | "developer") {
            return Err(ApiError::bad(
                format!("messages[{i}].role"),
                format!("unsupported role {role:?}"),
            ));
        }
        let role = if role == "developer" { "system" } else { role };
        let c = content(
            m.get("content").unwrap_or(&Value::Null),
            &format!("messages[{i}].content"),
            &mut images,
        )?;
        messages.push(json!({"role": role, "content": c}));
    }
    let max_tokens = match count(&obj, "max_completion_tokens")? {
        Some(x) => Some(x),
        None => count(&obj, "max_tokens")?,
    };
    let stop = match obj.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| {
                s.as_str().map(str::to_string).ok_or_else(|| {
                    ApiError::bad("stop", "stop must be a string or a list of strings")
                })
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::bad(
                "stop",
                "stop must be a string or a list of strings",
            ))
        }
    };
    if stop.len() > MAX_STOP_STRINGS || stop.iter().any(String::is_empty) {
        return Err(ApiError::bad(
            "stop",
            format!("at most {MAX_STOP_STRINGS} non-empty stop strings"),
        ));
    }
    if let Some(long) = stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::bad(
            "stop",
            format!(
                "a stop string has {} bytes; at most {MAX_STOP_BYTES} are allowed",
                long.len()
            ),
        ));
    }
    let top_logprobs = count(&obj, "top_logprobs")?.unwrap_or(0) as usize;
    if top_logprobs > MAX_TOP_LOGPROBS {
        return Err(ApiError::bad(
            "top_logprobs",
            format!("top_logprobs must be at most {MAX_TOP_LOGPROBS}"),
        ));
    }
    let logprobs = boolean(&obj, "logprobs")?;
    if top_logprobs > 0 && !logprobs {
        return Err(ApiError::bad(
            "top_logprobs",
            "top_logprobs requires logprobs: true",
        ));
    }
    let top_k = match obj.get("top_k") {
        None | Some(Value::Null) => None,
        // vLLM: -1 (or 0) disables top-k.
        Some(v) if v.as_i64().is_some_and(|k| k == -1 || k == 0) => Some(0),
        Some(v) => Some(v.as_u64().ok_or_else(|| {
            ApiError::bad(
                "top_k",
                format!("top_k must be -1, 0 or a positive integer, got {v}"),
            )
        })? as usize),
    };
    let seed = match obj.get("seed") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .or_else(|| v.as_i64().map(|s| s as u64))
                .ok_or_else(|| {
                    ApiError::bad("seed", format!("seed must be an integer, got {v}"))
                })?,
        ),
    };
    Ok(ChatParams {
        model,
        messages: Value::Array(messages),
        images,
        max_tokens: max_tokens.map(|x| x as usize),
        temperature: number(&obj, "temperature")?.map(|x| x as f32),
        top_p: number(&obj, "top_p")?.map(|x| x as f32),
        top_k,
        repetition_penalty: number(&obj, "repetition_penalty")?.map(|x| x as f32),
        seed,
        stop,
        stream: boolean(&obj, "stream")?,
        logprobs,
        top_logprobs,
        ignore_eos: boolean(&obj, "ignore_eos")?,
    })
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> ApiError {
        parse_chat(body.as_bytes()).unwrap_err()
    }

    fn param(e: &ApiError) -> String {
        e.body()["error"]["param"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    #[test]
    fn parses_images_text_and_sampling() {
        let png = base64::engine::general_purpose::STANDARD.encode(b"\x89PNG fake");
        let body = json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "be exact"},
                {"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{png}")}},
                    {"type": "text", "text": "read it"}
                ]}
            ],
            "max_completion_tokens": 12, "max_tokens": 99,
            "temperature": 0.2, "top_p": 0.9, "top_k": -1, "repetition_penalty": 1.1,
            "stop": "END", "seed": 7, "stream": true, "logprobs": true, "top_logprobs": 3,
            "user": "ignored"
        });
        let p = parse_chat(body.to_string().as_bytes()).unwrap();
        assert_eq!(p.max_tokens, Some(12), "max_completion_tokens wins");
        assert_eq!(p.top_k, Some(0));
        assert_eq!(p.stop, vec!["END"]);
        assert_eq!(
            (p.seed, p.stream, p.logprobs, p.top_logprobs),
            (Some(7), true, true, 3)
        );
        assert_eq!(p.images.len(), 1);
        match &p.images[0] {
            ImageSource::Data { bytes, param } => {
                assert_eq!(bytes, b"\x89PNG fake");
                assert_eq!(param, "messages[1].content[0].image_url.url");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(p.messages[1]["content"][0], json!({"type": "image"}));
        assert_eq!(p.messages[1]["content"][1]["text"], "read it");
    }

    #[test]
    fn errors_name_the_parameter() {
        assert!(err("{nope").to_string().contains("not valid JSON"));
        assert_eq!(param(&err(r#"{"model":"m"}"#)), "messages");
        assert_eq!(
            param(&err(
                r#"{"messages":[{"role":"user","content":"x"}],"n":2}"#
            )),
            "n"
        );
        let e = err(
            r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,@@@"}}]}]}"#,
        );
        assert_eq!(param(&e), "messages[0].content[0].image_url.url");
        assert!(e.to_string().contains("base64"), "{e}");
        let e = err(
            r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"file:///etc/passwd"}}]}]}"#,
        );
        assert!(e.to_string().contains("file://"), "{e}");
        assert_eq!(
            param(&err(
                r#"{"messages":[{"role":"user","content":"x"}],"top_p":"high"}"#
            )),
            "top_p"
        );
        assert_eq!(
            param(&err(
                r#"{"messages":[{"role":"user","content":"x"}],"top_logprobs":2}"#
            )),
            "top_logprobs"
        );
        assert_eq!(
            param(&err(r#"{"messages":[{"role":"tool","content":"x"}]}"#)),
            "messages[0].role"
        );
        assert_eq!(
            param(&err(
                r#"{"messages":[{"role":"user","content":"x"}],"tools":[]}"#
            )),
            "tools"
        );
    }

    #[test]
    fn remote_urls_are_kept_for_the_caller_to_refuse() {
        let p = parse_chat(
            br#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}]}"#,
        )
        .unwrap();
        assert!(
            matches!(&p.images[0], ImageSource::Remote { url, .. } if url == "https://example.com/a.png")
        );
    }
}
