//! The front door against hostile clients (issue 42): duplicate `Host` headers, prompts of
//! countless empty parts, clients that stop reading, bodies that never arrive.

use super::start;
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
