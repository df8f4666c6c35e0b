//! Page outcomes on `/v1/ocr` (issue 38.1): a page cut at `max_tokens` is retried, then
//! failed, and never presented as complete (status code, `x-ocr-failed-pages`, markers,
//! per-page `status`/`attempts`/`reason`); `/metrics` counts the outcomes; the chat endpoint
//! keeps OpenAI's `finish_reason: length` without retries.

use super::*;
use ocrctl::documents::inputs::page_separator;

/// A `/v1/ocr` upload of `file` with `fields` (greedy unless they say otherwise).
fn ocr(
    s: &Server,
    query: &str,
    file: (&str, &[u8]),
    fields: &[(&str, &str)],
) -> common::server::Resp {
    let mut all = vec![("temperature", "0")];
    all.extend_from_slice(fields);
    let (ct, mp) = multipart(&all, Some(file));
    request(
        &s.addr,
        "POST",
        &format!("/v1/ocr{query}"),
        &[("Content-Type", &ct)],
        &mp,
    )
    .unwrap()
}

/// The value of the sample `name` (labels included) in `/metrics`.
fn metric(s: &Server, name: &str) -> String {
    let text = s.get("/metrics").unwrap().text();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        .to_string()
}

#[test]
fn cut_pages_are_retried_then_failed_and_never_presented_as_complete() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), 2, 8, &[]);
    let png = std::fs::read(image("aligned.png")).unwrap();
    let file = ("aligned.png", &png[..]);
    // The fixture needs 8 tokens for this page (as in tests/ocr_cli.rs): 4 is a cut, 3 times.
    let r = ocr(&s, "?format=json", file, &[("max_tokens", "4")]);
    assert_eq!(r.status, 422, "every page failed: {}", r.text());
    assert_eq!(r.header("x-ocr-failed-pages"), Some("1"));
    let v = r.json();
    let p = &v["pages"][0];
    assert_eq!(
        (
            &p["status"],
            &p["reason"],
            &p["finish_reason"],
            &p["attempts"]
        ),
        (
            &json!("failed"),
            &json!("length"),
            &json!("length"),
            &json!(3)
        ),
        "{v}"
    );
    assert_eq!(
        p["text"], "5930",
        "the last attempt's cut text, marked failed"
    );
    assert_eq!(v["text"], "<!-- page 1 failed: length -->");
    assert_eq!(v["failed_pages"], json!([1]));
    assert_eq!(v["error"]["code"], "pages_failed");
    assert_eq!(
        v["usage"]["completion_tokens"], 12,
        "three attempts of 4 tokens"
    );
    // Markdown: the marker in the page's place.
    let r = ocr(&s, "", file, &[("max_tokens", "4")]);
    assert_eq!(r.status, 422);
    assert_eq!(r.text(), "<!-- page 1 failed: length -->\n");
    // retries=0: one attempt; accept_length: ok at length, a plain 200.
    let r = ocr(
        &s,
        "?format=json",
        file,
        &[("max_tokens", "4"), ("retries", "0")],
    );
    assert_eq!(r.json()["pages"][0]["attempts"], 1);
    let r = ocr(
        &s,
        "?format=json",
        file,
        &[("max_tokens", "4"), ("accept_length", "true")],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-ocr-failed-pages"), None);
    let v = r.json();
    assert_eq!(
        (&v["pages"][0]["status"], &v["text"]),
        (&json!("ok"), &json!("5930"))
    );
    // End of sequence biased to just below the greedy choice: only the first retry
    // (temperature 0.5, the seed moved on) reaches it, as with the CLI.
    let fields = [
        ("max_tokens", "4"),
        ("seed", "1"),
        ("logit_bias", r#"{"322": 13}"#),
    ];
    let r = ocr(&s, "?format=json", file, &fields);
    assert_eq!(r.status, 200, "{}", r.text());
    let p = &r.json()["pages"][0];
    assert_eq!(
        (&p["status"], &p["attempts"], &p["finish_reason"]),
        (&json!("retried"), &json!(2), &json!("stop")),
        "{p}"
    );
    // A stream makes one attempt and marks the cut page after its text.
    let r = ocr(&s, "?stream=true", file, &[("max_tokens", "4")]);
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "5930\n\n<!-- page 1 failed: length -->");
    let r = ocr(
        &s,
        "?stream=true",
        file,
        &[("max_tokens", "4"), ("retries", "1")],
    );
    assert_eq!(
        (r.status, r.json()["error"]["param"].clone()),
        (400, json!("retries"))
    );
    for (field, bad) in [
        ("retries", "9"),
        ("retries", "x"),
        ("accept_length", "maybe"),
    ] {
        let r = ocr(&s, "", file, &[(field, bad)]);
        assert_eq!(r.status, 400, "{field}={bad}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], field);
    }
    // /metrics: 4 pages failed (two after 3 attempts, one with retries=0, one streamed),
    // 1 ok at length, 1 retried; 2 + 2 + 1 attempts tried again.
    let pages = "ocrctl_ocr_pages_total";
    assert_eq!(metric(&s, &format!("{pages}{{status=\"ok\"}}")), "1");
    assert_eq!(metric(&s, &format!("{pages}{{status=\"retried\"}}")), "1");
    let failed = |why: &str| {
        metric(
            &s,
            &format!("{pages}{{status=\"failed\",reason=\"{why}\"}}"),
        )
    };
    assert_eq!(
        (failed("length"), failed("loop"), failed("error")),
        ("4".into(), "0".into(), "0".into())
    );
    assert_eq!(metric(&s, "ocrctl_ocr_page_retries_total"), "5");
}

/// A PDF with one page that finishes and one that does not: 207, the finished page's text
/// and the other's marker, `x-ocr-failed-pages: 2`.
#[test]
fn a_document_with_some_failed_pages_is_a_207_with_their_markers() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), 2, 8, &[]);
    let pdf = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pdf/two_pages.pdf"),
    )
    .unwrap();
    let file = ("two_pages.pdf", &pdf[..]);
    // Greedy, page 1 takes 8 tokens and page 2 takes 11: 9 cuts page 2 only.
    let fields = [("max_tokens", "9"), ("seed", "3")];
    let r = ocr(&s, "?format=json", file, &fields);
    assert_eq!(r.status, 207, "{}", r.text());
    assert_eq!(r.header("x-ocr-failed-pages"), Some("2"));
    let v = r.json();
    assert_eq!(v["pages"][0]["status"], "ok");
    assert_eq!(
        (&v["pages"][1]["status"], &v["pages"][1]["attempts"]),
        (&json!("failed"), &json!(3))
    );
    let want = format!("5930284{}<!-- page 2 failed: length -->", page_separator(2));
    assert_eq!(v["text"], want);
    assert!(v.get("error").is_none(), "{v}");
    let r = ocr(&s, "", file, &fields);
    assert_eq!((r.status, r.text()), (207, format!("{want}\n")));
}

/// The chat endpoint keeps OpenAI's semantics: a cut answer is `finish_reason: length`, a
/// 200, and is not retried (one request admitted, no page counted).
#[test]
fn chat_answers_cut_at_max_tokens_are_length_and_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), 2, 8, &[]);
    let png = std::fs::read(image("aligned.png")).unwrap();
    let mut body = chat_body(&png, "image/png", 4);
    body["temperature"] = json!(0);
    let r = s.post_json("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["choices"][0]["message"]["content"], "5930");
    assert_eq!(v["usage"]["completion_tokens"], 4);
    assert_eq!(
        metric(&s, "ocrctl_engine_requests_total{device=\"cpu:0\"}"),
        "1"
    );
    assert_eq!(metric(&s, "ocrctl_ocr_page_retries_total"), "0");
    assert_eq!(
        metric(
            &s,
            "ocrctl_ocr_pages_total{status=\"failed\",reason=\"length\"}"
        ),
        "0"
    );
}
