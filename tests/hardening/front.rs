//! The front door against hostile clients (issue 42): duplicate `Host` headers, prompts of
//! countless empty parts, clients that stop reading, bodies that never arrive.

use super::common::server::{chat_body, gauge, request};
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

/// N2: `/metrics` needed no key (nor did `/health` and `/`). With a key set it now needs it;
/// `/health` stays open for probes, and `--open-metrics` opens `/metrics` for a scraper
/// that cannot send it.
#[test]
fn metrics_need_the_api_key_when_one_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), "", &["--api-key", "k"]);
    assert_eq!(s.get("/metrics").unwrap().status, 401);
    assert_eq!(s.get("/health").unwrap().status, 200);
    let r = request(
        &s.addr,
        "GET",
        "/metrics",
        &[("Authorization", "Bearer k")],
        b"",
    )
    .unwrap();
    assert_eq!(r.status, 200);
    assert!(r.text().contains("ocrctl_queue_depth"));
    drop(s);
    let s = start(dir.path(), "", &["--api-key", "k", "--open-metrics"]);
    assert_eq!(s.get("/metrics").unwrap().status, 200);
}

/// N2: there was no write timeout: a client that pipelines requests and never reads held its
/// connection (and the answers) for as long as it liked. Now a write the client does not take
/// within `--write-timeout` closes the connection: of 6000 pipelined `GET /metrics` (~30 MB
/// of answers, more than the loopback socket buffers hold) only part is ever delivered.
#[test]
fn a_client_that_never_reads_is_disconnected_after_the_write_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), "", &["--write-timeout", "1"]);
    let n = 6000;
    let mut c = TcpStream::connect(&s.addr).unwrap();
    let one = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    c.write_all(one.repeat(n).as_bytes()).unwrap();
    // Long past the write timeout (the server gives up after one second without progress).
    std::thread::sleep(std::time::Duration::from_secs(4));
    c.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut got = Vec::new();
    match c.read_to_end(&mut got) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the connection is still open: {e}"),
    }
    let answered = String::from_utf8_lossy(&got)
        .matches("HTTP/1.1 200")
        .count();
    assert!(answered < n, "all {n} answers were delivered");
    assert_eq!(s.get("/health").unwrap().status, 200);
}

/// N5: a request head declaring `Content-Length: 60 MiB` took its share of
/// `--body-memory-mb` before a byte arrived, so three silent ones made every other POST wait
/// for the body timeout (then 503). Now a body takes its share when its first bytes arrive,
/// and a body that stalls for `--header-timeout` gets 408 and gives its share back.
#[test]
fn bodies_take_the_budget_as_bytes_arrive_and_stalled_ones_give_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let p = super::profile(dir.path(), "");
    let yaml = std::fs::read_to_string(&p).unwrap();
    std::fs::write(&p, yaml.replace("max_body_mb: 8", "max_body_mb: 64")).unwrap();
    let s = super::common::server::Server::start(
        super::common::exported(),
        &[
            "--profile",
            p.to_str().unwrap(),
            "--body-memory-mb",
            "100",
            "--body-timeout",
            "20",
            "--header-timeout",
            "2",
        ],
        true,
    );
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        60 << 20
    );
    let silent: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut c = TcpStream::connect(&s.addr).unwrap();
            c.write_all(head.as_bytes()).unwrap();
            c
        })
        .collect();
    let png = std::fs::read(image("aligned.png")).unwrap();
    let honest = || s.post_json("/v1/chat/completions", &chat_body(&png, "image/png", 2));
    let r = honest();
    assert_eq!(r.status, 200, "{}", r.text());
    // A body that sends its first kilobyte and stalls holds the whole budget until it is
    // refused; the next POST waits for that, not for the body timeout.
    let mut stalled = TcpStream::connect(&s.addr).unwrap();
    stalled.write_all(head.as_bytes()).unwrap();
    stalled.write_all(&[b' '; 1024]).unwrap();
    let t = std::time::Instant::now();
    while gauge(&s, "ocrctl_request_body_bytes") == 0 {
        assert!(t.elapsed().as_secs() < 15, "the stalled body took no share");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let r = honest();
    assert_eq!(r.status, 200, "{}", r.text());
    stalled
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut answer = [0u8; 12];
    stalled.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"HTTP/1.1 408");
    assert_eq!(gauge(&s, "ocrctl_request_body_bytes"), 0);
    drop(silent);
}
