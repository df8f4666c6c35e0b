//! What the model expects of its inputs, exactly as the reference builds them:
//! [`preprocess`] (image decoding, Pillow-exact resize, normalisation) and [`prompt`] (chat
//! template, tokenizer, image-token expansion, streaming detokenisation); [`export`] reads an
//! export's folder once (manifest, generation config, processor and tokenizer).

pub mod export;
pub mod preprocess;
pub mod prompt;
