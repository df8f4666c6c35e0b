//! Prompt construction for LightOnOCR: chat template, tokenizer and image-token expansion.
//!
//! The checkpoint's Jinja chat template is rendered with minijinja configured like
//! transformers' `apply_chat_template` (`trim_blocks`, `lstrip_blocks`, Python string methods
//! such as `.startswith()` / `.strip()` through `minijinja-contrib`'s pycompat, and a
//! `raise_exception` function). For an image-only request the LightOnOCR template renders
//!
//! ```text
//! <|im_start|>system<|im_end|>\n<|im_start|>user\n<|image_pad|><|im_end|>\n<|im_start|>assistant\n
//! ```
//!
//! [`Prompter::encode`] tokenizes that text (special tokens written in it map to their ids) and
//! expands each image placeholder into as many image-token ids as the image has features,
//! contiguously, with no row-break or end tokens. [`StreamDecoder`] turns generated ids back into
//! text incrementally without ever emitting half of a UTF-8 character.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use minijinja::{Environment, ErrorKind, Value as JinjaValue};
use serde_json::{json, Value};
use tokenizers::Tokenizer;

/// File name of the tokenizer inside a checkpoint directory.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// File name of the tokenizer configuration (may hold `chat_template` and special tokens).
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// File name of a standalone chat template (preferred when present).
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";
/// File name of a processor chat template as older transformers saved it.
pub const CHAT_TEMPLATE_JSON_FILE: &str = "chat_template.json";

pub(crate) const TEMPLATE_NAME: &str = "chat_template";
/// Special-token variables that transformers passes to chat templates.
pub(crate) const SPECIAL_TOKEN_VARS: [&str; 4] =
    ["bos_token", "eos_token", "pad_token", "unk_token"];

/// Errors from loading or using the tokenizer and chat template.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file at fault.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A JSON file could not be parsed.
    #[error("{path}: invalid JSON: {source}")]
    Json {
        /// The file at fault.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: serde_json::Error,
    },
    /// `tokenizer.json` could not be loaded by the tokenizers library.
    #[error("{path}: cannot load tokenizer: {message}")]
    Tokenizer {
        /// The file at fault.
        path: PathBuf,
        /// The library's message.
        message: String,
    },
    /// A field of a configuration file is missing or malformed.
    #[error("{path}: field `{field}`: {problem}")]
    Field {
        /// The file at fault.
        path: PathBuf,
        /// The field at fault.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// No chat template was found in the checkpoint directory.
    #[error(
        "{dir}: no chat template (looked for {CHAT_TEMPLATE_FILE}, {CHAT_TEMPLATE_JSON_FILE} \
         and `chat_template` in {TOKENIZER_CONFIG_FILE})"
    )]
    NoChatTemplate {
        /// The checkpoint directory.
        dir: PathBuf,
    },
    /// The chat template does not compile.
    #[error("{source_name}: chat template does not compile: {message}")]
    TemplateSyntax {
        /// Where the template came from (file and field).
        source_name: String,
        /// minijinja's message, with line information.
        message: String,
    },
    /// Rendering the chat template failed (including the template's own `raise_exception`).
    #[error("{source_name}: rendering the chat template failed: {message}")]
    Render {
        /// Where the template came from (file and field).
        source_name: String,
        /// minijinja's message.
        message: String,
    },
    /// The image token id passed by the caller is not in the tokenizer's vocabulary.
    #[error("{path}: image_token_id {id} is not in the vocabulary")]
    UnknownImageToken {
        /// The tokenizer file.
        path: PathBuf,
        /// The id that was asked for.
        id: u32,
    },
    /// Tokenizing the rendered prompt failed.
    #[error("tokenizing the prompt failed: {0}")]
    Encode(String),
    /// Decoding token ids failed.
    #[error("decoding token ids failed: {0}")]
    Decode(String),
    /// The rendered prompt holds a different number of image tokens than images were given.
    #[error(
        "the rendered prompt contains {found} image token(s) `{token}` but \
         image_token_counts.len() is {expected} (does the text contain `{token}`?)"
    )]
    ImageTokenMismatch {
        /// `image_token_counts.len()`.
        expected: usize,
        /// Image tokens found in the tokenized prompt.
        found: usize,
        /// The image token string.
        token: String,
    },
    /// An image was given zero feature tokens.
    #[error("image_token_counts[{index}] is 0; every image produces at least one token")]
    ZeroImageTokens {
        /// Index of the offending entry.
        index: usize,
    },
}

/// Renders chat prompts and converts between text and token ids for one checkpoint.
#[derive(Clone)]
pub struct Prompter {
    tokenizer: Arc<Tokenizer>,
    env: Environment<'static>,
    chat_template: String,
    template_source: String,
    image_token: String,
    image_token_id: u32,
    special_tokens: BTreeMap<String, String>,
    /// See [`Prompter::max_token_bytes`]; computed on first use.
    max_token_bytes: Arc<std::sync::OnceLock<usize>>,
}

impl fmt::Debug for Prompter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prompter")
            .field("template_source", &self.template_source)
            .field("image_token", &self.image_token)
            .field("image_token_id", &self.image_token_id)
            .field("special_tokens", &self.special_tokens)
            .field("vocab_size", &self.vocab_size())
            .finish_non_exhaustive()
    }
}

impl Prompter {
    /// Loads `tokenizer.json` and the chat template from a checkpoint directory.
    ///
    /// The template comes from the first of: `chat_template.jinja`; `chat_template.json`'s
    /// `chat_template`; `tokenizer_config.json`'s `chat_template` (a string, or a list of
    /// `{name, template}` of which the one named `default` is used). `bos_token`, `eos_token`,
    /// `pad_token` and `unk_token` from `tokenizer_config.json` (strings or `{content: ...}`) are
    /// passed to the template like transformers does. `image_token_id` comes from the model
    /// configuration; its string form is looked up in the tokenizer.
    pub fn from_model_dir(dir: &Path, image_token_id: u32) -> Result<Self, PromptError> {
        let tok_path = dir.join(TOKENIZER_FILE);
        let bytes = std::fs::read(&tok_path).map_err(|source| PromptError::Io {
            path: tok_path.clone(),
            source,
        })?;
        let tokenizer = Tokenizer::from_bytes(&bytes).map_err(|e| PromptError::Tokenizer {
            path: tok_path.clone(),
            message: e.to_string(),
        })?;

        let config_path = dir.join(TOKENIZER_CONFIG_FILE);
        let config = read_json_if_exists(&config_path)?;
        let mut special_tokens = BTreeMap::new();
        if let Some(config) = &config {
            for var in SPECIAL_TOKEN_VARS {
                if let Some(token) = special_token(config, var, &config_path)? {
                    special_tokens.insert(var.to_string(), token);
                }
            }
        }

        let (chat_template, template_source) = find_chat_template(dir, config.as_ref())?;
        Self::new(
            tokenizer,
            chat_template,
            template_source,
            image_token_id,
            special_tokens,
        )
        .map_err(|e| match e {
            PromptError::UnknownImageToken { id, .. } => {
                PromptError::UnknownImageToken { path: tok_path, id }
            }
            other => other,
        })
    }

    /// Builds a prompter from parts already in memory.
    ///
    /// `template_source` names the template in error messages; `special_tokens` maps template
    /// variables such as `eos_token` to their strings.
    pub fn new(
        tokenizer: Tokenizer,
        chat_template: String,
        template_source: String,
        image_token_id: u32,
        special_tokens: BTreeMap<String, String>,
    ) -> Result<Self, PromptError> {
        let image_token = tokenizer.id_to_token(image_token_id).ok_or_else(|| {
            PromptError::UnknownImageToken {
                path: PathBuf::from(TOKENIZER_FILE),
                id: image_token_id,
            }
        })?;
        let mut env = Environment::new();
        // transformers renders chat templates with trim_blocks and lstrip_blocks on.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(TEMPLATE_NAME, chat_template.clone())
            .map_err(|e| PromptError::TemplateSyntax {
                source_name: template_source.clone(),
                message: describe_jinja_error(&e),
            })?;
        Ok(Self {
            tokenizer: Arc::new(tokenizer),
            env,
            chat_template,
            template_source,
            image_token,
            image_token_id,
            special_tokens,
            max_token_bytes: Arc::default(),
        })
    }

    /// An upper bound on the bytes of text one token can stand for: four times the longest
    /// vocabulary entry in characters (byte-level vocabularies spell a byte as one character;
    /// UTF-8 needs at most four bytes a character), at least 16. So a text of more than
    /// `n · max_token_bytes()` bytes surely needs more than `n` tokens, and can be refused
    /// before it is tokenised.
    pub fn max_token_bytes(&self) -> usize {
        *self.max_token_bytes.get_or_init(|| {
            let longest = self
                .tokenizer
                .get_vocab(true)
                .keys()
                .map(|t| t.chars().count())
                .max()
                .unwrap_or(0);
            (4 * longest).max(16)
        })
    }

    /// Renders the chat template for one user turn holding `num_images` image parts followed by
    /// an optional text part, with `add_generation_prompt = true`.
    pub fn render(&self, num_images: usize, text: Option<&str>) -> Result<String, PromptError> {
        self.render_messages(&Self::user_turn(num_images, text))
    }

    /// The messages of one user turn: `num_images` image parts, then the text if any.
    fn user_turn(num_images: usize, text: Option<&str>) -> Value {
        let mut content: Vec<Value> = (0..num_images).map(|_| json!({"type": "image"})).collect();
        if let Some(text) = text {
            content.push(json!({"type": "text", "text": text}));
        }
        json!([{"role": "user", "content": content}])
    }

    /// Renders the chat template over `messages` (the template's own shape: a list of
    /// `{"role", "content"}` where content is a string or a list of `{"type": "image"}` /
    /// `{"type": "text", "text"}` parts) with `add_generation_prompt = true`.
    pub fn render_messages(&self, messages: &Value) -> Result<String, PromptError> {
        let mut ctx: BTreeMap<&str, JinjaValue> = BTreeMap::new();
        ctx.insert("messages", JinjaValue::from_serialize(messages));
        ctx.insert("add_generation_prompt", JinjaValue::from(true));
        for (name, token) in &self.special_tokens {
            ctx.insert(name.as_str(), JinjaValue::from(token.as_str()));
        }
        let render_err = |e: minijinja::Error| PromptError::Render {
            source_name: self.template_source.clone(),
            message: describe_jinja_error(&e),
        };
        self.env
            .get_template(TEMPLATE_NAME)
            .and_then(|t| t.render(&ctx))
            .map_err(render_err)
    }

    /// Renders and tokenizes a prompt, then expands the `k`-th image token into
    /// `image_token_counts[k]` consecutive image-token ids.
    ///
    /// Tokenization adds no BOS/EOS (`add_special_tokens = false`, as the template writes every
    /// special token itself); special tokens written in `text` map to their ids. Fails when the
    /// rendered prompt holds a different number of image tokens than `image_token_counts`
    /// entries.
    pub fn encode(
        &self,
        image_token_counts: &[usize],
        text: Option<&str>,
    ) -> Result<Vec<u32>, PromptError> {
        self.encode_messages(
            &Self::user_turn(image_token_counts.len(), text),
            image_token_counts,
        )
    }

    /// [`Prompter::encode`] for a whole conversation in the template's shape (see
    /// [`Prompter::render_messages`]); the `k`-th image part gets `image_token_counts[k]`
    /// image tokens.
    pub fn encode_messages(
        &self,
        messages: &Value,
        image_token_counts: &[usize],
    ) -> Result<Vec<u32>, PromptError> {
        if let Some(index) = image_token_counts.iter().position(|&n| n == 0) {
            return Err(PromptError::ZeroImageTokens { index });
        }
        let prompt = self.render_messages(messages)?;
        let encoding = self
            .tokenizer
            .encode(prompt.as_str(), false)
            .map_err(|e| PromptError::Encode(e.to_string()))?;
        let ids = encoding.get_ids();
        let found = ids.iter().filter(|&&id| id == self.image_token_id).count();
        if found != image_token_counts.len() {
            return Err(PromptError::ImageTokenMismatch {
                expected: image_token_counts.len(),
                found,
                token: self.image_token.clone(),
            });
        }
        let total = ids.len() - found + image_token_counts.iter().sum::<usize>();
        let mut out = Vec::with_capacity(total);
        let mut counts = image_token_counts.iter();
        for &id in ids {
            if id == self.image_token_id {
                let n = counts.next().copied().unwrap_or(0);
                out.extend(std::iter::repeat_n(id, n));
            } else {
                out.push(id);
            }
        }
        Ok(out)
    }

    /// Decodes token ids to text, optionally dropping special tokens.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, PromptError> {
        self.tokenizer
            .decode(ids, skip_special)
            .map_err(|e| PromptError::Decode(e.to_string()))
    }

    /// A fresh incremental decoder sharing this prompter's tokenizer.
    pub fn stream_decoder(&self, skip_special: bool) -> StreamDecoder {
        StreamDecoder::new(Arc::clone(&self.tokenizer), skip_special)
    }

    /// The id of `token` (a vocabulary entry or an added/special token), if any.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// Number of entries in the tokenizer, added tokens included (151 669 for LightOnOCR; the
    /// model's embedding table is padded to 151 936).
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// The image placeholder token string (`<|image_pad|>`).
    pub fn image_token(&self) -> &str {
        &self.image_token
    }

    /// The image placeholder token id.
    pub fn image_token_id(&self) -> u32 {
        self.image_token_id
    }

    /// The chat template source text.
    pub fn chat_template(&self) -> &str {
        &self.chat_template
    }

    /// The underlying tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
}

mod stream;
mod template;
pub use stream::*;
use template::*;

#[cfg(test)]
mod tests;
