//! `/v1/chat/completions` request bodies: serde wire types ([`ChatCompletionRequest`] and
//! its parts), then the checks serde cannot express, into [`ChatParams`].
//!
//! Deserialisation goes through `serde_path_to_error`, so a type error names the parameter
//! at fault the way OpenAI's `param` does (`messages[0].content[1].image_url.url`, `top_p`).
//! Every wire field is optional: what is required or bounded (`messages`, `n`, `top_k`,
//! limits, roles, data URLs) is checked afterwards, each check naming its parameter; the
//! ranges of the sampling values are [`SamplingParams::validate`]'s, which the route calls
//! once the request's values are merged with the model's defaults.
//! Content parts are a flat struct rather than an internally tagged enum on `type`: serde
//! buffers tagged (and untagged) enums, which would lose the path of an error inside a part.
//! Image URLs are classified (and `data:` URLs decoded) in `image_url`.

#[cfg(doc)]
use crate::generation::sampling::SamplingParams;
use crate::server::error::ApiError;
use serde::de::value::SeqAccessDeserializer;
use serde::de::{self, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{json, Value};
use std::fmt;

mod image_url;
pub use image_url::{image_source, ImageSource, ImageUrl, Url};

/// Most stop strings one request may give (OpenAI allows 4; vLLM more).
pub const MAX_STOP_STRINGS: usize = 16;
/// Longest stop string, in bytes. Matching costs only the new text per token whatever the
/// length (see [`crate::server::stops`]); the bound keeps a request's memory small.
pub const MAX_STOP_BYTES: usize = 1024;
/// Largest `top_logprobs` (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;
/// Most messages in one request (counted while parsing).
pub const MAX_MESSAGES: usize = 256;
/// Most content parts in one message (counted while parsing): 2.4 M empty text parts in a
/// 62 MB body passed the text-size check (0 bytes) and took 5.3 GB in the chat template and
/// the tokenizer.
pub const MAX_PARTS: usize = 256;
/// Most ids one request's `logit_bias` may list (this server's bound on a request's
/// per-step sampling work; OpenAI does not publish one).
pub const MAX_LOGIT_BIAS: usize = 1024;

/// The body of `POST /v1/chat/completions` as sent. Fields not listed here (`user`,
/// `stream_options`, `metadata`, …) are accepted and ignored; `null` is the same as absent.
#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "a JSON object")]
pub struct ChatCompletionRequest {
    /// The model name; when given it must be the served model's.
    pub model: Option<String>,
    /// The conversation (required, 1 to [`MAX_MESSAGES`] messages).
    #[serde(default, deserialize_with = "messages")]
    pub messages: Option<Vec<Message>>,
    /// Tokens to generate at most (the legacy name of `max_completion_tokens`).
    pub max_tokens: Option<u64>,
    /// Tokens to generate at most; wins over `max_tokens`.
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// vLLM's `top_k`: -1 or 0 disable it.
    pub top_k: Option<i64>,
    /// vLLM's `repetition_penalty`.
    pub repetition_penalty: Option<f32>,
    pub seed: Option<Seed>,
    pub stop: Option<Stop>,
    pub stream: Option<bool>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u64>,
    /// vLLM's `ignore_eos`: keep generating past end-of-sequence tokens (benchmarks).
    pub ignore_eos: Option<bool>,
    /// Choices per request; only 1 is served.
    pub n: Option<u64>,
    /// OpenAI's presence penalty, -2 to 2 (applied to the generated tokens, as vLLM does).
    pub presence_penalty: Option<f32>,
    /// OpenAI's frequency penalty, -2 to 2 (applied to the generated tokens, as vLLM does).
    pub frequency_penalty: Option<f32>,
    /// Refused when given (tool calls are not implemented).
    pub tools: Option<IgnoredAny>,
    /// Refused when given (the legacy name of `tools`).
    pub functions: Option<IgnoredAny>,
    /// Refused when given (structured output is not implemented).
    pub response_format: Option<IgnoredAny>,
    /// Refused when given (audio output is not implemented).
    pub audio: Option<IgnoredAny>,
    /// OpenAI's `logit_bias`: token ids (as strings) to a bias in [-100, 100], added to the
    /// id's logit before the penalties, as vLLM does.
    pub logit_bias: Option<std::collections::BTreeMap<String, f32>>,
}

/// One message of `messages`.
#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "a message object")]
pub struct Message {
    /// `system`, `user`, `assistant` or `developer` (read as `system`); checked after parsing.
    pub role: Option<String>,
    /// Absent or `null` reads as empty text.
    #[serde(default)]
    pub content: Content,
}

/// A message's content: a string or a list of parts.
#[derive(Debug, Clone, PartialEq)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

impl Default for Content {
    fn default() -> Self {
        Content::Text(String::new())
    }
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Content;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a list of parts")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Content, E> {
                Ok(Content::Text(s.to_string()))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Content, E> {
                Ok(Content::Text(s))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Content, E> {
                Ok(Content::default())
            }
            fn visit_none<E: de::Error>(self) -> Result<Content, E> {
                Ok(Content::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Content, A::Error> {
                bounded(seq, MAX_PARTS, "content parts per message").map(Content::Parts)
            }
        }
        d.deserialize_any(V)
    }
}

/// The elements of `seq`, refused as soon as there are more than `max` (so a long list is
/// never held whole); `what` names them in the error.
fn bounded<'de, T: Deserialize<'de>, A: SeqAccess<'de>>(
    mut seq: A,
    max: usize,
    what: &str,
) -> Result<Vec<T>, A::Error> {
    let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(max));
    while let Some(x) = seq.next_element()? {
        if v.len() == max {
            return Err(de::Error::custom(format_args!("at most {max} {what}")));
        }
        v.push(x);
    }
    Ok(v)
}

/// `messages`, at most [`MAX_MESSAGES`] of them (`null` is the same as absent).
fn messages<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<Message>>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Option<Vec<Message>>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a sequence")
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_seq(self)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            bounded(seq, MAX_MESSAGES, "messages per request").map(Some)
        }
    }
    d.deserialize_option(V)
}

/// One part of a list content: `{"type": "text", "text": …}` or
/// `{"type": "image_url", "image_url": {"url": …}}`. `type` and the field it names are
/// checked after parsing.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(expecting = "a content part object")]
pub struct Part {
    /// `text` or `image_url`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub text: Option<String>,
    pub image_url: Option<ImageUrl>,
}

/// `stop`: one string or a list of strings.
#[derive(Debug, Clone, PartialEq)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl<'de> Deserialize<'de> for Stop {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Stop;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a list of strings")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Stop, E> {
                Ok(Stop::One(s.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Stop, A::Error> {
                Vec::deserialize(SeqAccessDeserializer::new(seq)).map(Stop::Many)
            }
        }
        d.deserialize_any(V)
    }
}

/// `seed`: any JSON integer; a negative one is taken as its two's-complement `u64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seed(pub u64);

impl<'de> Deserialize<'de> for Seed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Seed;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an integer")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Seed, E> {
                Ok(Seed(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Seed, E> {
                Ok(Seed(v as u64))
            }
        }
        d.deserialize_any(V)
    }
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
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// `logit_bias` as [`SamplingParams::logit_bias`] holds it (ids parsed, sorted); the
    /// bias range and the ids' vocabulary are checked once merged with the defaults.
    pub logit_bias: Option<Vec<(u32, f32)>>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub logprobs: bool,
    pub top_logprobs: usize,
    /// vLLM's `ignore_eos`: keep generating past end-of-sequence tokens (benchmarks).
    pub ignore_eos: bool,
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
    ChatCompletionRequest::from_json(body)?.into_params()
}

/// A body that is not JSON at all (syntax error, truncated, trailing bytes).
fn not_json(e: serde_json::Error) -> ApiError {
    ApiError::invalid(format!("request body is not valid JSON: {e}"))
}

/// A JSON body of the wrong shape: the error names the path at fault, in the words of the
/// other checks (`top_p must be a number, got string "high"`).
fn wrong_shape(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    if inner.classify() != serde_json::error::Category::Data {
        return not_json(inner);
    }
    let full = inner.to_string();
    let at = format!(" at line {} column {}", inner.line(), inner.column());
    let msg = full.strip_suffix(&at).unwrap_or(&full);
    if let Some(field) = msg
        .strip_prefix("duplicate field `")
        .and_then(|r| r.strip_suffix('`'))
    {
        let param = match path.as_str() {
            "." => field.to_string(),
            p => format!("{p}.{field}"),
        };
        return ApiError::bad(param.clone(), format!("{param} is given twice"));
    }
    if path == "." {
        return ApiError::invalid(msg);
    }
    let said = ["invalid type: ", "invalid value: "].iter().find_map(|p| {
        let (got, want) = msg.strip_prefix(p)?.rsplit_once(", expected ")?;
        let want = match want {
            "f32" | "f64" => "a number",
            "u64" => "a non-negative integer",
            "i64" => "an integer",
            "a boolean" => "true or false",
            "a sequence" => "a list",
            w => w,
        };
        Some(format!("{path} must be {want}, got {got}"))
    });
    let message = said.unwrap_or_else(|| format!("{path}: {msg}"));
    ApiError::bad(path, message)
}

impl ChatCompletionRequest {
    /// Deserialises a body; a type error names the parameter at fault.
    pub fn from_json(body: &[u8]) -> Result<Self, ApiError> {
        // serde would also read a struct from a JSON list (its fields in order).
        if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(match serde_json::from_slice::<IgnoredAny>(body) {
                Ok(_) => ApiError::invalid("request body must be a JSON object"),
                Err(e) => not_json(e),
            });
        }
        let mut de = serde_json::Deserializer::from_slice(body);
        let req = serde_path_to_error::deserialize(&mut de).map_err(wrong_shape)?;
        de.end().map_err(not_json)?;
        Ok(req)
    }

    /// Refuses what this server does not do, naming the parameter.
    fn check_unsupported(&self) -> Result<(), ApiError> {
        let unsupported = [
            ("tools", &self.tools, "tool calls"),
            ("functions", &self.functions, "function calls"),
            (
                "response_format",
                &self.response_format,
                "structured output",
            ),
            ("audio", &self.audio, "audio output"),
        ];
        if let Some((key, _, what)) = unsupported.iter().find(|(_, v, _)| v.is_some()) {
            return Err(ApiError::bad(
                *key,
                format!("{what} are not supported by this server"),
            ));
        }
        let n = self.n.unwrap_or(1);
        if n != 1 {
            return Err(ApiError::bad("n", format!("n must be 1 (got {n})")));
        }
        Ok(())
    }

    /// The checks serde cannot express, each naming its parameter; images are decoded and
    /// messages put in the chat template's shape.
    pub fn into_params(self) -> Result<ChatParams, ApiError> {
        self.check_unsupported()?;
        let msgs = match self.messages {
            Some(m) if m.is_empty() => return Err(ApiError::bad("messages", "messages is empty")),
            Some(m) => m,
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
        for (i, m) in msgs.into_iter().enumerate() {
            messages.push(m.into_template(i, &mut images)?);
        }
        let stop = stop_strings(self.stop)?;
        let (logprobs, top_logprobs) = logprob_options(self.logprobs, self.top_logprobs)?;
        let top_k = top_k_of(self.top_k)?;
        let logit_bias = self.logit_bias.map(parse_logit_bias).transpose()?;
        Ok(ChatParams {
            model: self.model,
            messages: Value::Array(messages),
            images,
            max_tokens: self
                .max_completion_tokens
                .or(self.max_tokens)
                .map(|x| x as usize),
            temperature: self.temperature,
            top_p: self.top_p,
            top_k,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            logit_bias,
            seed: self.seed.map(|s| s.0),
            stop,
            stream: self.stream.unwrap_or(false),
            logprobs,
            top_logprobs,
            ignore_eos: self.ignore_eos.unwrap_or(false),
        })
    }
}

/// `stop` as a list, at most [`MAX_STOP_STRINGS`] non-empty strings of at most
/// [`MAX_STOP_BYTES`] bytes.
fn stop_strings(stop: Option<Stop>) -> Result<Vec<String>, ApiError> {
    let stop = match stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
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
    Ok(stop)
}

/// `logprobs` and `top_logprobs` checked together.
fn logprob_options(logprobs: Option<bool>, top: Option<u64>) -> Result<(bool, usize), ApiError> {
    let top_logprobs = top.unwrap_or(0);
    if top_logprobs > MAX_TOP_LOGPROBS as u64 {
        return Err(ApiError::bad(
            "top_logprobs",
            format!("top_logprobs must be at most {MAX_TOP_LOGPROBS}"),
        ));
    }
    let logprobs = logprobs.unwrap_or(false);
    if top_logprobs > 0 && !logprobs {
        return Err(ApiError::bad(
            "top_logprobs",
            "top_logprobs requires logprobs: true",
        ));
    }
    Ok((logprobs, top_logprobs as usize))
}

/// `top_k` as vLLM reads it: -1 or 0 turns it off.
fn top_k_of(top_k: Option<i64>) -> Result<Option<usize>, ApiError> {
    let top_k = match top_k {
        None => None,
        // vLLM: -1 (or 0) disables top-k.
        Some(-1 | 0) => Some(0),
        Some(k) if k > 0 => Some(k as usize),
        Some(k) => {
            return Err(ApiError::bad(
                "top_k",
                format!("top_k must be -1, 0 or a positive integer, got {k}"),
            ))
        }
    };
    Ok(top_k)
}

/// `logit_bias`'s keys as token ids, at most [`MAX_LOGIT_BIAS`] of them.
pub fn parse_logit_bias(
    map: std::collections::BTreeMap<String, f32>,
) -> Result<Vec<(u32, f32)>, ApiError> {
    if map.len() > MAX_LOGIT_BIAS {
        return Err(ApiError::bad(
            "logit_bias",
            format!(
                "logit_bias lists {} ids; at most {MAX_LOGIT_BIAS} are allowed",
                map.len()
            ),
        ));
    }
    let pairs = map
        .into_iter()
        .map(|(k, b)| match k.trim().parse::<u32>() {
            Ok(id) => Ok((id, b)),
            Err(_) => Err(ApiError::bad(
                format!("logit_bias.{k}"),
                format!("logit_bias keys must be token ids (non-negative integers), got {k:?}"),
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(crate::generation::sampling::logit_bias(pairs))
}

impl Message {
    /// Message `i` in the chat template's shape; its images are appended to `images`.
    fn into_template(self, i: usize, images: &mut Vec<ImageSource>) -> Result<Value, ApiError> {
        let role = self.role.ok_or_else(|| {
            ApiError::bad(
                format!("messages[{i}].role"),
                "each message needs a string role",
            )
        })?;
        let role = match role.as_str() {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            other => {
                return Err(ApiError::bad(
                    format!("messages[{i}].role"),
                    format!("unsupported role {other:?}"),
                ))
            }
        };
        let content = match self.content {
            Content::Text(s) => Value::String(s),
            Content::Parts(parts) => {
                let mut out = Vec::with_capacity(parts.len());
                for (j, part) in parts.into_iter().enumerate() {
                    let at = format!("messages[{i}].content[{j}]");
                    out.push(part.into_template(&at, images)?);
                }
                Value::Array(out)
            }
        };
        Ok(json!({"role": role, "content": content}))
    }
}

impl Part {
    /// This part (at `at`) in the chat template's shape: text, or `{"type": "image"}` with
    /// its image appended to `images`.
    fn into_template(self, at: &str, images: &mut Vec<ImageSource>) -> Result<Value, ApiError> {
        match self.kind.as_deref().unwrap_or("") {
            "text" => {
                let text = self.text.ok_or_else(|| {
                    ApiError::bad(format!("{at}.text"), "text part needs a string `text`")
                })?;
                Ok(json!({"type": "text", "text": text}))
            }
            "image_url" => {
                let Some(image_url) = self.image_url else {
                    return Err(ApiError::bad(
                        format!("{at}.image_url"),
                        "image_url part needs `image_url: {\"url\": ...}`",
                    ));
                };
                let param = format!("{at}.image_url.url");
                let Some(url) = image_url.url else {
                    return Err(ApiError::bad(param, "image_url needs a string `url`"));
                };
                images.push(image_source(url, param)?);
                Ok(json!({"type": "image"}))
            }
            other => Err(ApiError::bad(
                format!("{at}.type"),
                format!("unsupported content part type {other:?} (text or image_url)"),
            )),
        }
    }
}

#[cfg(test)]
mod tests;
