//! The front door against hostile clients (issue 42): duplicate `Host` headers, prompts of
//! countless empty parts, clients that stop reading, bodies that never arrive.

use super::common::server::chat_body;
use super::{error_of, image, start};
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;

/// A raw HTTP/1.1 `GET path` with these header lines; the whole answer.
fn raw_get(addr: &str, path: &str, headers: &str) -> String {
    let mut c = TcpStream::connect(addr).unwrap();
    write!(
        c,
        "GET {path} HTTP/1.1\r\n{headers}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    out
}

/// N10: two `Host` headers were answered as if the first were the only one (a proxy may
/// route by the other). Now 400.
#[test]
fn two_host_headers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), "", &[]);
    let one = raw_get(&s.addr, "/v1/models", "Host: 127.0.0.1\r\n");
    assert!(one.starts_with("HTTP/1.1 200"), "{one}");
    for hosts in [
        "Host: 127.0.0.1\r\nHost: attacker.example\r\n",
        "Host: 127.0.0.1\r\nHost: 127.0.0.1\r\n",
    ] {
        let two = raw_get(&s.addr, "/v1/models", hosts);
        assert!(two.starts_with("HTTP/1.1 400"), "{two}");
        assert!(two.contains("more than one Host header"), "{two}");
    }
}

/// N3: 2.4 M empty text parts passed the text-size check (0 bytes) and took 5.3 GB in the
/// template and tokenizer. Parts are now counted while the body is parsed: 200 000 empty
/// parts get a 400 naming the message's content and the limit.
#[test]
fn countless_empty_parts_are_refused_while_parsing() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), "", &[]);
    let png = std::fs::read(image("aligned.png")).unwrap();
    let mut b = chat_body(&png, "image/png", 2);
    let parts = b["messages"][0]["content"].as_array_mut().unwrap();
    parts.extend(std::iter::repeat_n(
        json!({"type": "text", "text": ""}),
        200_000,
    ));
    let r = s.post_json("/v1/chat/completions", &b);
    assert_eq!(r.status, 400, "{}", r.text());
    let (param, msg) = error_of(&r);
    assert_eq!(param, "messages[0].content");
    assert!(
        msg.as_str().unwrap().contains("at most 256 content parts"),
        "{msg}"
    );
    let r = s.post_json("/v1/chat/completions", &chat_body(&png, "image/png", 2));
    assert_eq!(r.status, 200, "{}", r.text());
}
