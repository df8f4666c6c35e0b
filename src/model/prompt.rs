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
mod tests {
    use super::*;

    /// The chat template of LightOnOCR-2-1B, as stored in the onnx-community export's
    /// tokenizer_config.json (copy in talmago/fast-lightonocr,
    /// tests/fixtures/lightonocr_config/tokenizer_config.json).
    const LIGHTONOCR_TEMPLATE: &str = "{% set image_count = namespace(value=0) %}\n{% for message in messages %}\n{% if loop.first and message['role'] != 'system' %}\n<|im_start|>system<|im_end|>\n{% endif %}\n<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}\n{{ message['content'] }}<|im_end|>\n{% else %}\n{% for content in message['content'] %}\n{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}\n{% set image_count.value = image_count.value + 1 %}\n{% if add_vision_id %}\nPicture {{ image_count.value }}:\n{% endif -%}\n<|image_pad|>\n{%- elif 'text' in content %}\n{{ content['text'] }}\n{% endif %}\n{% endfor %}\n<|im_end|>\n{% endif %}\n{% endfor %}\n{% if add_generation_prompt %}\n<|im_start|>assistant\n{% endif %}";

    const IM_START: u32 = 260;
    const IM_END: u32 = 261;
    const IMAGE_PAD: u32 = 262;
    const ENDOFTEXT: u32 = 263;

    /// GPT-2's byte-to-character table used by byte-level BPE.
    fn byte_char(b: u8) -> char {
        let printable =
            |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        if printable(b) {
            char::from(b)
        } else {
            let n = (0..b).filter(|&x| !printable(x)).count() as u32;
            char::from_u32(256 + n).unwrap()
        }
    }

    fn bytes_token(bytes: &[u8]) -> String {
        bytes.iter().map(|&b| byte_char(b)).collect()
    }

    /// A tiny byte-level BPE tokenizer: ids 0..=255 are the single bytes; merges build "he",
    /// "é" (C3 A9), the first two bytes of "漢" (E6 BC, an incomplete character) and the middle
    /// two bytes of "😀" (9F 98); plus Qwen-style special tokens.
    fn tokenizer_json() -> String {
        let mut vocab = serde_json::Map::new();
        for b in 0..=255u8 {
            vocab.insert(bytes_token(&[b]), json!(b));
        }
        let merges = [
            (&b"h"[..], &b"e"[..], 256),
            (&[0xC3][..], &[0xA9][..], 257),
            (&[0xE6][..], &[0xBC][..], 258),
            (&[0x9F][..], &[0x98][..], 259),
        ];
        let mut merge_list = Vec::new();
        for (a, b, id) in merges {
            let joined = [a, b].concat();
            vocab.insert(bytes_token(&joined), json!(id));
            merge_list.push(format!("{} {}", bytes_token(a), bytes_token(b)));
        }
        let added = |id: u32, content: &str| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        };
        json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": [
                added(IM_START, "<|im_start|>"),
                added(IM_END, "<|im_end|>"),
                added(IMAGE_PAD, "<|image_pad|>"),
                added(ENDOFTEXT, "<|endoftext|>"),
            ],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false,
                              "trim_offsets": false, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": false,
                        "trim_offsets": false, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                      "vocab": vocab, "merges": merge_list}
        })
        .to_string()
    }

    fn model_dir(config: Value) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(TOKENIZER_FILE), tokenizer_json()).unwrap();
        std::fs::write(
            dir.path().join(TOKENIZER_CONFIG_FILE),
            serde_json::to_string_pretty(&config).unwrap(),
        )
        .unwrap();
        dir
    }

    fn lightonocr_dir() -> tempfile::TempDir {
        model_dir(json!({
            "bos_token": null,
            "eos_token": "<|im_end|>",
            "pad_token": {"content": "<|endoftext|>", "special": true},
            "image_token": "<|image_pad|>",
            "chat_template": LIGHTONOCR_TEMPLATE,
        }))
    }

    fn prompter() -> (tempfile::TempDir, Prompter) {
        let dir = lightonocr_dir();
        let p = Prompter::from_model_dir(dir.path(), IMAGE_PAD).unwrap();
        (dir, p)
    }

    #[test]
    fn renders_lightonocr_image_only_prompt() {
        let (_dir, p) = prompter();
        assert_eq!(p.image_token(), "<|image_pad|>");
        assert_eq!(
            p.render(1, None).unwrap(),
            "<|im_start|>system<|im_end|>\n<|im_start|>user\n<|image_pad|><|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn renders_like_jinja2() {
        // Expected strings rendered by Python Jinja2 3.1 with trim_blocks and lstrip_blocks,
        // as transformers' apply_chat_template does.
        let (_dir, p) = prompter();
        let cases = [
            (2, Some("Convert to markdown."), "<|im_start|>system<|im_end|>\n<|im_start|>user\n<|image_pad|><|image_pad|>Convert to markdown.\n<|im_end|>\n<|im_start|>assistant\n"),
            (0, Some("hi"), "<|im_start|>system<|im_end|>\n<|im_start|>user\nhi\n<|im_end|>\n<|im_start|>assistant\n"),
            (0, None, "<|im_start|>system<|im_end|>\n<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n"),
            (1, Some("  a\nb  "), "<|im_start|>system<|im_end|>\n<|im_start|>user\n<|image_pad|>  a\nb  \n<|im_end|>\n<|im_start|>assistant\n"),
        ];
        for (n, text, want) in cases {
            assert_eq!(
                p.render(n, text).unwrap(),
                want,
                "{n} images, text {text:?}"
            );
        }
    }

    #[test]
    fn encode_expands_image_tokens() {
        let (_dir, p) = prompter();
        let ids = p.encode(&[5], None).unwrap();
        let nl = u32::from(b'\n');
        let mut want = vec![IM_START];
        want.extend(b"system".iter().map(|&b| u32::from(b)));
        want.extend([IM_END, nl, IM_START]);
        want.extend(b"user".iter().map(|&b| u32::from(b)));
        want.push(nl);
        want.extend([IMAGE_PAD; 5]);
        want.extend([IM_END, nl, IM_START]);
        want.extend(b"assistant".iter().map(|&b| u32::from(b)));
        want.push(nl);
        assert_eq!(ids, want);

        // Two images, contiguous runs of their own lengths, then the text.
        let ids = p.encode(&[3, 2], Some("hello")).unwrap();
        let first = ids.iter().position(|&i| i == IMAGE_PAD).unwrap();
        assert_eq!(&ids[first..first + 5], &[IMAGE_PAD; 5]);
        assert_eq!(ids.iter().filter(|&&i| i == IMAGE_PAD).count(), 5);
        // "hello" = merged "he" + l, l, o.
        assert_eq!(&ids[first + 5..first + 9], &[256, 108, 108, 111]);
        assert_eq!(
            p.decode(&ids, false).unwrap(),
            p.render(2, Some("hello"))
                .unwrap()
                .replace("<|image_pad|><|image_pad|>", &"<|image_pad|>".repeat(5))
        );
    }

    #[test]
    fn special_tokens_in_text_map_to_ids() {
        let (_dir, p) = prompter();
        let ids = p.encode(&[1], Some("a<|im_end|>b")).unwrap();
        let a = ids.iter().position(|&i| i == u32::from(b'a')).unwrap();
        assert_eq!(&ids[a..a + 3], &[u32::from(b'a'), IM_END, u32::from(b'b')]);
    }

    #[test]
    fn image_token_count_mismatch_is_an_error() {
        let (_dir, p) = prompter();
        let err = p.encode(&[4], Some("see <|image_pad|>")).unwrap_err();
        assert!(
            matches!(
                err,
                PromptError::ImageTokenMismatch {
                    expected: 1,
                    found: 2,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("<|image_pad|>"));
        let err = p.encode(&[3, 0], None).unwrap_err();
        assert!(
            matches!(err, PromptError::ZeroImageTokens { index: 1 }),
            "{err}"
        );
    }

    #[test]
    fn token_lookup_and_vocab_size() {
        let (_dir, p) = prompter();
        assert_eq!(p.token_id("<|im_end|>"), Some(IM_END));
        assert_eq!(p.token_id("<|endoftext|>"), Some(ENDOFTEXT));
        assert_eq!(p.token_id("he"), Some(256));
        assert_eq!(p.token_id("<|nope|>"), None);
        assert_eq!(p.vocab_size(), 256 + 4 + 4);
        assert_eq!(p.image_token_id(), IMAGE_PAD);
    }

    #[test]
    fn decode_skips_special_tokens_on_request() {
        let (_dir, p) = prompter();
        let ids = [256, 108, 108, 111, IM_END];
        assert_eq!(p.decode(&ids, false).unwrap(), "hello<|im_end|>");
        assert_eq!(p.decode(&ids, true).unwrap(), "hello");
    }

    #[test]
    fn stream_decoder_holds_back_partial_characters() {
        let (_dir, p) = prompter();
        let text = "heé漢😀!";
        let ids = p
            .tokenizer()
            .encode(text, false)
            .unwrap()
            .get_ids()
            .to_vec();
        // "he" and "é" are merged tokens; 漢 = [E6 BC] + [A2]; 😀 = [F0] + [9F 98] + [80].
        assert_eq!(
            ids,
            vec![256, 257, 258, 0xA2, 0xF0, 259, 0x80, u32::from(b'!')]
        );
        let mut dec = p.stream_decoder(true);
        let pieces: Vec<Option<String>> = ids.iter().map(|&id| dec.push(id).unwrap()).collect();
        let s = |x: &str| Some(x.to_string());
        assert_eq!(
            pieces,
            vec![s("he"), s("é"), None, s("漢"), None, None, s("😀"), s("!")]
        );
        assert_eq!(dec.finish().unwrap(), None);

        // Special tokens: kept or skipped.
        let mut keep = p.stream_decoder(false);
        assert_eq!(keep.push(256).unwrap(), s("he"));
        assert_eq!(keep.push(IM_END).unwrap(), s("<|im_end|>"));
        let mut skip = p.stream_decoder(true);
        assert_eq!(skip.push(256).unwrap(), s("he"));
        assert_eq!(skip.push(IM_END).unwrap(), None);
        assert_eq!(skip.push(u32::from(b'!')).unwrap(), s("!"));

        // A dangling partial character is flushed as U+FFFD by finish(), which also resets.
        let mut dec = p.stream_decoder(true);
        assert_eq!(dec.push(u32::from(b'x')).unwrap(), s("x"));
        assert_eq!(dec.push(258).unwrap(), None);
        assert_eq!(dec.finish().unwrap(), s("\u{FFFD}"));
        assert_eq!(dec.push(257).unwrap(), s("é"));
    }

    #[test]
    fn stream_decoder_concatenation_equals_full_decode() {
        let (_dir, p) = prompter();
        let text = "Ünïcödé 漢字 🎉🙂 mixed\twith\nnewlines é😀";
        let ids = p
            .tokenizer()
            .encode(text, false)
            .unwrap()
            .get_ids()
            .to_vec();
        let mut dec = p.stream_decoder(false);
        let mut out = String::new();
        for &id in &ids {
            if let Some(piece) = dec.push(id).unwrap() {
                assert!(!piece.contains('\u{FFFD}'), "{piece:?}");
                out.push_str(&piece);
            }
        }
        if let Some(rest) = dec.finish().unwrap() {
            out.push_str(&rest);
        }
        assert_eq!(out, text);
        assert_eq!(p.decode(&ids, false).unwrap(), text);
    }

    #[test]
    fn template_sources_in_priority_order() {
        // A list of named templates: "default" is used.
        let dir = model_dir(json!({
            "chat_template": [
                {"name": "tool_use", "template": "TOOLS"},
                {"name": "default", "template": "DEFAULT{{ eos_token }}"},
            ],
            "eos_token": {"content": "<|im_end|>"},
        }));
        let p = Prompter::from_model_dir(dir.path(), IMAGE_PAD).unwrap();
        assert_eq!(p.render(0, None).unwrap(), "DEFAULT<|im_end|>");

        // chat_template.json beats tokenizer_config.json; chat_template.jinja beats both.
        std::fs::write(
            dir.path().join(CHAT_TEMPLATE_JSON_FILE),
            r#"{"chat_template": "FROM JSON"}"#,
        )
        .unwrap();
        let p = Prompter::from_model_dir(dir.path(), IMAGE_PAD).unwrap();
        assert_eq!(p.render(0, None).unwrap(), "FROM JSON");
        std::fs::write(dir.path().join(CHAT_TEMPLATE_FILE), "FROM JINJA").unwrap();
        let p = Prompter::from_model_dir(dir.path(), IMAGE_PAD).unwrap();
        assert_eq!(p.render(0, None).unwrap(), "FROM JINJA");
        assert_eq!(p.chat_template(), "FROM JINJA");

        // No tokenizer_config.json at all is fine when the .jinja file exists.
        std::fs::remove_file(dir.path().join(TOKENIZER_CONFIG_FILE)).unwrap();
        assert!(Prompter::from_model_dir(dir.path(), IMAGE_PAD).is_ok());
    }

    #[test]
    fn python_methods_and_raise_exception() {
        let template = "{% if messages[0]['role'].startswith('us') %}{% for c in messages[0]['content'] %}{% if c['type'] == 'text' %}[{{ c['text'].strip() }}]{% if c['text'].strip().endswith('!') %}{{ raise_exception('no shouting: ' + c['text'].upper().strip()) }}{% endif %}{% endif %}{% endfor %}{% endif %}";
        let dir = model_dir(json!({"chat_template": template}));
        let p = Prompter::from_model_dir(dir.path(), IMAGE_PAD).unwrap();
        assert_eq!(p.render(1, Some("  hi  ")).unwrap(), "[hi]");
        let err = p.render(0, Some(" stop! ")).unwrap_err();
        assert!(matches!(err, PromptError::Render { .. }));
        let msg = err.to_string();
        assert!(msg.contains("no shouting: STOP!"), "{msg}");
        assert!(msg.contains(TOKENIZER_CONFIG_FILE), "{msg}");
    }

    #[test]
    fn load_errors_name_the_file_and_field() {
        // Missing template.
        let dir = model_dir(json!({"eos_token": "<|im_end|>"}));
        let err = Prompter::from_model_dir(dir.path(), IMAGE_PAD).unwrap_err();
        assert!(matches!(err, PromptError::NoChatTemplate { .. }), "{err}");

        // Malformed chat_template field.
        let dir = model_dir(json!({"chat_template": 42}));
        let err = Prompter::from_model_dir(dir.path(), IMAGE_PAD).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(TOKENIZER_CONFIG_FILE) && msg.contains("`chat_template`"),
            "{msg}"
        );

        // A list without "default".
        let dir = model_dir(json!({"chat_template": [{"name": "rag", "template": "x"}]}));
        let err = Prompter::from_model_dir(dir.path(), IMAGE_PAD).unwrap_err();
        assert!(err.to_string().contains("\"rag\""), "{err}");

        // Malformed special token.
        let dir = model_dir(json!({"chat_template": "x", "eos_token": 7}));
        let err = Prompter::from_model_dir(dir.path(), IMAGE_PAD).unwrap_err();
        assert!(err.to_string().contains("`eos_token`"), "{err}");

        // Template syntax error.
        let dir = model_dir(json!({"chat_template": "{% if %}"}));
        let err = Prompter::from_model_dir(dir.path(), IMAGE_PAD).unwrap_err();
        assert!(matches!(err, PromptError::TemplateSyntax { .. }), "{err}");
        assert!(err.to_string().contains(TOKENIZER_CONFIG_FILE), "{err}");

        // Unknown image token id.
        let dir = lightonocr_dir();
        let err = Prompter::from_model_dir(dir.path(), 999_999).unwrap_err();
        assert!(matches!(
            err,
            PromptError::UnknownImageToken { id: 999_999, .. }
        ));
        assert!(err.to_string().contains(TOKENIZER_FILE), "{err}");

        // Broken tokenizer.json.
        std::fs::write(dir.path().join(TOKENIZER_FILE), "{}").unwrap();
        let err = Prompter::from_model_dir(dir.path(), IMAGE_PAD).unwrap_err();
        assert!(matches!(err, PromptError::Tokenizer { .. }), "{err}");
        assert!(err.to_string().contains(TOKENIZER_FILE), "{err}");

        // Missing tokenizer.json.
        std::fs::remove_file(dir.path().join(TOKENIZER_FILE)).unwrap();
        let err = Prompter::from_model_dir(dir.path(), IMAGE_PAD).unwrap_err();
        assert!(matches!(err, PromptError::Io { .. }), "{err}");
        assert!(err.to_string().contains(TOKENIZER_FILE), "{err}");
    }
}
