//! Incremental detokenisation for streaming: text is released only once it is final.

use super::*;

/// Incremental detokenizer for streaming generation.
///
/// [`push`](Self::push) returns only text that is final: while the ids decoded so far end in an
/// incomplete UTF-8 sequence (a byte-level BPE token can hold part of a character) the text is
/// held back, and it is released once a later token completes the character.
/// [`finish`](Self::finish) flushes whatever is left (an unfinished character becomes U+FFFD)
/// and resets the decoder. Concatenating every returned piece gives the same text as
/// decoding all ids at once.
#[derive(Clone)]
pub struct StreamDecoder {
    tokenizer: Arc<Tokenizer>,
    skip_special: bool,
    /// Ids not yet fully emitted, preceded by one already-emitted id kept as context (decoders
    /// such as Metaspace treat the first token of a sequence specially).
    ids: Vec<u32>,
    /// The decoding of the context part of `ids`, already emitted.
    prefix: String,
}

impl fmt::Debug for StreamDecoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamDecoder")
            .field("skip_special", &self.skip_special)
            .field("ids", &self.ids)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl StreamDecoder {
    /// A decoder over `tokenizer`; `skip_special` drops special tokens from the text.
    pub fn new(tokenizer: Arc<Tokenizer>, skip_special: bool) -> Self {
        Self {
            tokenizer,
            skip_special,
            ids: Vec::new(),
            prefix: String::new(),
        }
    }

    /// Adds one generated id; returns the newly completed text, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>, PromptError> {
        self.ids.push(id);
        let text = self.decode_window()?;
        if text.len() <= self.prefix.len() || text.ends_with(char::REPLACEMENT_CHARACTER) {
            return Ok(None);
        }
        let new = suffix_after(&text, &self.prefix).to_string();
        // Everything decoded so far is final: keep only the last id as context.
        self.ids.drain(..self.ids.len() - 1);
        self.prefix = self.decode_window()?;
        Ok(Some(new))
    }

    /// Flushes text still held back (an incomplete character decodes to U+FFFD) and resets the
    /// decoder for a new sequence.
    pub fn finish(&mut self) -> Result<Option<String>, PromptError> {
        let text = self.decode_window()?;
        let rest = if text.len() > self.prefix.len() {
            Some(suffix_after(&text, &self.prefix).to_string())
        } else {
            None
        };
        self.ids.clear();
        self.prefix.clear();
        Ok(rest.filter(|s| !s.is_empty()))
    }

    fn decode_window(&self) -> Result<String, PromptError> {
        self.tokenizer
            .decode(&self.ids, self.skip_special)
            .map_err(|e| PromptError::Decode(e.to_string()))
    }
}

/// The part of `text` after `prefix`; when `text` unexpectedly does not start with `prefix`,
/// the part after their longest common prefix (at a character boundary).
pub(crate) fn suffix_after<'a>(text: &'a str, prefix: &str) -> &'a str {
    if let Some(rest) = text.strip_prefix(prefix) {
        return rest;
    }
    let common = text
        .char_indices()
        .zip(prefix.chars())
        .find(|((_, a), b)| a != b)
        .map(|((i, _), _)| i)
        .unwrap_or_else(|| text.len().min(prefix.len()));
    &text[common..]
}
