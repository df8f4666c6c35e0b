//! Fuzzes what an HTTP request reaches before the model: the chat-completion parser
//! (JSON, content parts, data URLs, parameters) and image decoding with its pixel limit,
//! then preprocessing of whatever decodes. Nothing here may panic, and a decoded image
//! must respect the pixel limit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ocrctl::model::preprocess::{decode_image_bytes, preprocess, PreprocessConfig};
use ocrctl::server::openai::{image_source, parse_chat, ImageSource};

/// Small enough that a fuzzed image decodes quickly.
const MAX_PIXELS: u64 = 1 << 20;

fn image(bytes: &[u8]) {
    if let Ok(img) = decode_image_bytes(bytes, "fuzz", MAX_PIXELS) {
        assert!(img.width() as u64 * img.height() as u64 <= MAX_PIXELS);
        let mut cfg = PreprocessConfig::default();
        cfg.longest_edge = 112;
        let p = preprocess(&img, &cfg);
        assert_eq!(p.num_image_tokens, (p.height / 28 * (p.width / 28)) as usize);
    }
}

fuzz_target!(|data: &[u8]| {
    // The raw bytes as an upload.
    image(data);
    // The raw bytes as a request body.
    if let Ok(p) = parse_chat(data) {
        for s in p.images {
            if let ImageSource::Data { bytes, .. } = s {
                image(&bytes);
            }
        }
    }
    // The raw bytes as an image URL.
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = image_source(s, "url");
    }
});
