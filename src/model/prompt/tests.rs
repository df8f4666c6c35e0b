//! Unit tests of the prompt (`src/model/prompt.rs`).

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
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
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

/// `text`'s token ids, without special tokens.
fn encode(p: &Prompter, text: &str) -> Vec<u32> {
    p.tokenizer()
        .encode(text, false)
        .unwrap()
        .get_ids()
        .to_vec()
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
    let ids = encode(&p, text);
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
    let ids = encode(&p, text);
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
