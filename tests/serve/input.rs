//! What a request may send: every kind of bad input gets a clear 4xx naming the field and the
//! server stays healthy; the API key on `/v1`.

use super::*;
use common::server::png_header;

fn image_part(url: &str) -> Value {
    json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}], "max_tokens": 4})
}

fn data_url(bytes: &[u8]) -> String {
    use base64::Engine as _;
    format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// What is sent, the body, the expected status, the expected `param` and a part of the message.
type BadCase<'a> = (&'a str, Vec<u8>, u16, Option<&'a str>, &'a str);

#[test]
fn bad_input_gets_a_clear_4xx_and_the_server_stays_healthy() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), 2, 8, &[]);
    let png = std::fs::read(image("aligned.png")).unwrap();
    let url0 = "messages[0].content[0].image_url.url";
    // The fixture image's chat body (4 tokens) with one field set.
    let with = |png: &[u8], key: &str, value: Value| {
        let mut b = chat_body(png, "image/png", 4);
        b[key] = value;
        b.to_string().into_bytes()
    };
    let send = |body: &[u8]| {
        request(
            &s.addr,
            "POST",
            "/v1/chat/completions",
            &[("Content-Type", "application/json")],
            body,
        )
        .unwrap()
    };
    let cases: [BadCase; 13] = [
        (
            "invalid JSON",
            b"{\"messages\": [".to_vec(),
            400,
            None,
            "not valid JSON",
        ),
        (
            "missing messages",
            br#"{"model": "x"}"#.to_vec(),
            400,
            Some("messages"),
            "messages",
        ),
        (
            "bad base64",
            image_part("data:image/png;base64,!!!notbase64")
                .to_string()
                .into_bytes(),
            400,
            Some(url0),
            "base64",
        ),
        (
            "not an image",
            image_part(&data_url(b"hello, I am text"))
                .to_string()
                .into_bytes(),
            400,
            Some(url0),
            "unrecognised image format",
        ),
        (
            "truncated PNG",
            image_part(&data_url(&png[..png.len() / 2]))
                .to_string()
                .into_bytes(),
            400,
            Some(url0),
            "cannot decode",
        ),
        (
            "20000x20000 PNG header",
            image_part(&data_url(&png_header(20000, 20000)))
                .to_string()
                .into_bytes(),
            400,
            Some(url0),
            "400000000 pixels",
        ),
        (
            "remote URL",
            image_part("https://example.com/page.png")
                .to_string()
                .into_bytes(),
            400,
            Some(url0),
            "--allow-remote-images",
        ),
        (
            "file URL",
            image_part("file:///etc/passwd").to_string().into_bytes(),
            400,
            Some(url0),
            "file://",
        ),
        (
            "n=2",
            with(&png, "n", json!(2)),
            400,
            Some("n"),
            "n must be 1",
        ),
        (
            "max_tokens over the limit",
            with(&png, "max_tokens", json!(257)),
            400,
            Some("max_tokens"),
            "limit of 256",
        ),
        (
            "bad top_p",
            with(&png, "top_p", json!(1.5)),
            400,
            Some("top_p"),
            "top_p",
        ),
        (
            "wrong model",
            with(&png, "model", json!("gpt-4o")),
            404,
            None,
            "does not exist",
        ),
        (
            "too many images",
            {
                let p = json!({"type": "image_url", "image_url": {"url": data_url(&png)}});
                json!({"messages": [{"role": "user", "content": [p, p, p, p, p]}]})
                    .to_string()
                    .into_bytes()
            },
            400,
            Some("messages"),
            "max_images_per_request",
        ),
    ];
    for (what, body, status, param, needle) in &cases {
        let r = send(body);
        assert_eq!(r.status, *status, "{what}: {}", r.text());
        let e = r.json();
        let msg = e["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: {e}"));
        assert!(msg.contains(needle), "{what}: {msg}");
        assert!(e["error"]["type"].is_string(), "{what}: {e}");
        if let Some(p) = param {
            assert_eq!(e["error"]["param"], *p, "{what}: {e}");
        }
    }
    // An oversize body (profile: 2 MiB) is refused with 413 in the same error shape.
    let big = vec![b'a'; 3 * 1024 * 1024];
    let r = send(&big);
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("max_body_mb"));
    // Uploads: a missing file field, an empty file, a broken file.
    let (ct, mp) = multipart(&[("max_tokens", "4")], None);
    let r = request(&s.addr, "POST", "/v1/ocr", &[("Content-Type", &ct)], &mp).unwrap();
    assert_eq!(
        (r.status, r.json()["error"]["param"].clone()),
        (400, json!("file"))
    );
    let (ct, mp) = multipart(&[], Some(("cut.png", &png[..100])));
    let r = request(&s.addr, "POST", "/v1/ocr", &[("Content-Type", &ct)], &mp).unwrap();
    assert_eq!(r.status, 400);
    assert!(r.text().contains("cut.png"), "{}", r.text());
    let r = request(&s.addr, "GET", "/v2/nothing", &[], b"").unwrap();
    assert_eq!(r.status, 404);
    assert!(r.json()["error"]["message"].is_string());
    // Still healthy and still answering.
    assert_eq!(s.get("/health").unwrap().status, 200);
    let r = s.post_json("/v1/chat/completions", &chat_body(&png, "image/png", 4));
    assert_eq!(r.status, 200, "{}", r.text());
    let m = s.get("/metrics").unwrap().text();
    assert!(m.contains("status=\"400\"}"), "{m}");
    assert!(m.contains("status=\"413\"}"), "{m}");
}

#[test]
fn api_key_is_required_on_v1_when_set() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), 1, 4, &["--api-key", "s3cret-key"]);
    let png = std::fs::read(image("aligned.png")).unwrap();
    let body = chat_body(&png, "image/png", 4).to_string();
    for (auth, status) in [
        (None, 401),
        (Some("Bearer wrong"), 401),
        (Some("Bearer s3cret-ke"), 401),
        (Some("Bearer s3cret-key"), 200),
    ] {
        let mut h = vec![("Content-Type", "application/json")];
        if let Some(a) = auth {
            h.push(("Authorization", a));
        }
        let r = request(&s.addr, "POST", "/v1/chat/completions", &h, body.as_bytes()).unwrap();
        assert_eq!(r.status, status, "{auth:?}: {}", r.text());
        if status == 401 {
            assert_eq!(r.json()["error"]["type"], "authentication_error");
        }
    }
    let r = request(&s.addr, "GET", "/v1/models", &[], b"").unwrap();
    assert_eq!(r.status, 401);
    // Health and the page stay open (load balancers, browsers).
    assert_eq!(s.get("/health").unwrap().status, 200);
    assert_eq!(s.get("/").unwrap().status, 200);
}
