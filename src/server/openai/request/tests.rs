//! Unit tests of the request types (`src/server/openai/request.rs`).

use super::*;
use base64::Engine as _;

fn err(body: &str) -> ApiError {
    parse_chat(body.as_bytes()).unwrap_err()
}

fn param(e: &ApiError) -> String {
    e.body().error.param.unwrap_or_default()
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
fn type_errors_name_the_exact_path_in_plain_words() {
    let cases = [
        (
            r#""top_p":"high""#,
            "top_p",
            r#"top_p must be a number, got string "high""#,
        ),
        (
            r#""n":-1"#,
            "n",
            "n must be a non-negative integer, got integer `-1`",
        ),
        (
            r#""stream":"yes""#,
            "stream",
            "stream must be true or false",
        ),
        (r#""seed":1.5"#, "seed", "seed must be an integer"),
        (
            r#""stop":5"#,
            "stop",
            "stop must be a string or a list of strings",
        ),
        (r#""stop":["a",5]"#, "stop[1]", "stop[1] must be a string"),
        (r#""model":3"#, "model", "model must be a string"),
    ];
    for (field, want_param, want_msg) in cases {
        let body = format!(r#"{{"messages":[{{"role":"user","content":"x"}}],{field}}}"#);
        let e = err(&body);
        assert_eq!(param(&e), want_param, "{field}: {e}");
        assert!(e.to_string().starts_with(want_msg), "{field}: {e}");
        assert!(!e.to_string().contains("line 1"), "{field}: {e}");
    }
    let msgs = [
        (r#""x""#, "messages", "messages must be a list"),
        (
            r#"["hi"]"#,
            "messages[0]",
            "messages[0] must be a message object",
        ),
        (
            r#"[{"role":5}]"#,
            "messages[0].role",
            "messages[0].role must be a string",
        ),
        (
            r#"[{"role":"user","content":5}]"#,
            "messages[0].content",
            "messages[0].content must be a string or a list of parts",
        ),
        (
            r#"[{"role":"user","content":["x","y"]}]"#,
            "messages[0].content[0]",
            "must be a content part object",
        ),
        (
            r#"[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":7}]}]"#,
            "messages[0].content[1].text",
            "must be a string",
        ),
        (
            r#"[{"role":"user","content":[{"type":"image_url","image_url":{"url":5}}]}]"#,
            "messages[0].content[0].image_url.url",
            "must be a string",
        ),
        (
            r#"[{"role":"user","content":[{"type":"image_url","image_url":5}]}]"#,
            "messages[0].content[0].image_url",
            "must be an object",
        ),
    ];
    for (messages, want_param, want_msg) in msgs {
        let e = err(&format!(r#"{{"messages":{messages}}}"#));
        assert_eq!(param(&e), want_param, "{messages}: {e}");
        assert!(e.to_string().contains(want_msg), "{messages}: {e}");
    }
    // The body as a whole.
    for body in ["[1, 2]", "5", "\"x\""] {
        let e = err(body);
        assert_eq!(param(&e), "", "{body}");
        assert!(e.to_string().contains("must be a JSON object"), "{e}");
    }
    let e = err(r#"{"messages":[{"role":"user","role":"user"}]}"#);
    assert_eq!(param(&e), "messages[0].role", "{e}");
    assert_eq!(param(&err(r#"{"top_p":1,"top_p":2}"#)), "top_p");
    assert!(err("{} x").to_string().contains("not valid JSON"));
    assert!(err("").to_string().contains("not valid JSON"));
}

#[test]
fn semantic_checks_name_the_parameter() {
    let fields = [
        (r#""top_k":-2"#, "top_k", "-1, 0 or a positive"),
        (r#""stop":[""]"#, "stop", "non-empty"),
        (
            r#""logprobs":true,"top_logprobs":21"#,
            "top_logprobs",
            "at most 20",
        ),
        (
            r#""response_format":{}"#,
            "response_format",
            "structured output",
        ),
    ];
    for (field, want_param, want_msg) in fields {
        let e = err(&format!(
            r#"{{"messages":[{{"role":"user","content":"x"}}],{field}}}"#
        ));
        assert_eq!(param(&e), want_param, "{field}: {e}");
        assert!(e.to_string().contains(want_msg), "{field}: {e}");
    }
    let at = "messages[0].content[0]";
    let parts = [
        (
            r#"{"type":"image_url"}"#,
            format!("{at}.image_url"),
            "part needs",
        ),
        (
            r#"{"type":"image_url","image_url":{"detail":"low"}}"#,
            format!("{at}.image_url.url"),
            "needs a string `url`",
        ),
        (r#"{"type":"text"}"#, format!("{at}.text"), "needs a string"),
        (
            r#"{"type":"input_audio"}"#,
            format!("{at}.type"),
            "unsupported",
        ),
        (r#"{"text":"x"}"#, format!("{at}.type"), "unsupported"),
    ];
    for (part, want_param, want_msg) in &parts {
        let e = err(&format!(
            r#"{{"messages":[{{"role":"user","content":[{part}]}}]}}"#
        ));
        assert_eq!(param(&e), *want_param, "{part}: {e}");
        assert!(e.to_string().contains(want_msg), "{part}: {e}");
    }
    assert_eq!(param(&err(r#"{"messages":[]}"#)), "messages");
    let e = err(r#"{"messages":[{"content":"x"}]}"#);
    assert_eq!(param(&e), "messages[0].role");
    assert!(e.to_string().contains("needs a string role"), "{e}");
}

#[test]
fn nulls_unknown_fields_and_lenient_shapes_are_accepted() {
    let p = parse_chat(
            br#"{"messages":[{"role":"developer","content":null,"name":"x"},
                {"role":"user","content":[{"type":"image_url","image_url":"https://example.com/a.png"}]}],
                "model":null,"temperature":1,"top_p":null,"stop":null,"seed":-1,"n":1,"tools":null,
                "presence_penalty":0,"stream_options":{"include_usage":true},"metadata":{"a":[1]}}"#,
        )
        .unwrap();
    assert_eq!(p.messages[0], json!({"role": "system", "content": ""}));
    assert_eq!(p.temperature, Some(1.0));
    assert_eq!((p.top_p, p.seed, p.model), (None, Some(u64::MAX), None));
    assert!(p.stop.is_empty() && !p.stream);
    assert_eq!(text_bytes(&p.messages), 0);
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

/// Line breaks inside a base64 payload are skipped (MIME-style wrapping), with or without
/// padding; anything else outside the alphabet is refused.
#[test]
fn data_url_payloads_decode_with_line_breaks_and_without_padding() {
    let bytes: Vec<u8> = (0..=255).collect();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
    let wrapped: String = b64
        .as_bytes()
        .chunks(76)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect::<Vec<_>>()
        .join("\r\n");
    for payload in [b64.clone(), wrapped, b64.trim_end_matches('=').to_string()] {
        let url = format!("data:image/png;base64,{payload}");
        assert_eq!(
            image_url::decode_data_url(&url).unwrap(),
            bytes,
            "{payload:.20}"
        );
    }
    assert!(image_url::decode_data_url("data:image/png;base64,AA*A").is_err());
}

/// A data URL is decoded while the body is parsed: the parsed request holds its bytes, never
/// its base64 text (which can be tens of MB), also when the client escaped its slashes.
#[test]
fn data_urls_are_decoded_while_parsing() {
    let bytes: Vec<u8> = (0..=255).collect();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
    assert!(b64.contains('/'));
    for payload in [b64.clone(), b64.replace('/', "\\/")] {
        let body = format!(
            r#"{{"messages":[{{"role":"user","content":[{{"type":"image_url","image_url":{{"url":"data:image/png;base64,{payload}"}}}},{{"type":"image_url","image_url":"DATA:image/png;base64,{payload}"}}]}}]}}"#
        );
        let req = ChatCompletionRequest::from_json(body.as_bytes()).unwrap();
        let Content::Parts(parts) = &req.messages.as_ref().unwrap()[0].content else {
            panic!("list content");
        };
        for part in parts {
            let url = part.image_url.as_ref().and_then(|u| u.url.clone());
            assert_eq!(url, Some(Url::Data(bytes.clone())), "{payload:.20}");
        }
    }
    let other = r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}]}"#;
    let req = ChatCompletionRequest::from_json(other.as_bytes()).unwrap();
    let Content::Parts(parts) = &req.messages.as_ref().unwrap()[0].content else {
        panic!("list content");
    };
    assert_eq!(
        parts[0].image_url.as_ref().unwrap().url,
        Some(Url::Other("https://example.com/a.png".into()))
    );
}

/// Parts and messages are counted while parsing: one past the limit is refused, naming the
/// list and the limit.
#[test]
fn parts_and_messages_are_counted_while_parsing() {
    let part = json!({"type": "text", "text": ""});
    let parts = |n: usize| json!([{"role": "user", "content": vec![part.clone(); n]}]);
    let body = |messages: Value| json!({ "messages": messages }).to_string();
    let p = parse_chat(body(parts(MAX_PARTS)).as_bytes()).unwrap();
    assert_eq!(
        p.messages[0]["content"].as_array().unwrap().len(),
        MAX_PARTS
    );
    let e = err(&body(parts(MAX_PARTS + 1)));
    assert_eq!(param(&e), "messages[0].content");
    assert!(
        e.to_string()
            .contains(&format!("at most {MAX_PARTS} content parts per message")),
        "{e}"
    );
    let message = json!({"role": "user", "content": ""});
    assert!(parse_chat(body(json!(vec![message.clone(); MAX_MESSAGES])).as_bytes()).is_ok());
    let e = err(&body(json!(vec![message; MAX_MESSAGES + 1])));
    assert_eq!(param(&e), "messages");
    assert!(
        e.to_string()
            .contains(&format!("at most {MAX_MESSAGES} messages per request")),
        "{e}"
    );
    let e = err(r#"{"messages":null}"#);
    assert!(
        e.to_string().contains("missing required field messages"),
        "{e}"
    );
}
