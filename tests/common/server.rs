//! A live `ocrctl serve` for integration tests, and a minimal blocking HTTP/1.1 client
//! (one request per connection; chunked bodies decoded) so the tests need no HTTP crate.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// A response: status, lower-cased headers, body.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    /// The body as UTF-8 text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (panics with the body when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of an SSE body.
    pub fn sse_data(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
            .map(str::to_string)
            .collect()
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size_s = String::from_utf8_lossy(&b[..eol]);
        let size = usize::from_str_radix(size_s.split(';').next().unwrap().trim(), 16).unwrap_or(0);
        if size == 0 {
            return out;
        }
        let start = eol + 2;
        out.extend_from_slice(&b[start..(start + size).min(b.len())]);
        b = &b[(start + size + 2).min(b.len())..];
    }
}

/// Sends one request to `addr` (`host:port`) and reads the whole response.
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Resp> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(300)))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    // The server may answer (413) before reading a large body; ignore a reset here.
    let _ = s.write_all(body);
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| {
            std::io::Error::other(format!(
                "no response head: {:?}",
                String::from_utf8_lossy(&buf)
            ))
        })?;
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("bad status line"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let raw = &buf[end + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked { dechunk(raw) } else { raw.to_vec() };
    Ok(Resp {
        status,
        headers,
        body,
    })
}

/// `POST path` to `addr` with a JSON body already serialised (what client threads send).
pub fn post_json_to(addr: &str, path: &str, body: &str) -> Resp {
    request(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    )
    .expect("request")
}

/// Client threads started together; [`Clients::join`] waits for all of them.
pub struct Clients<T>(Vec<std::thread::JoinHandle<T>>);

impl<T> Clients<T> {
    /// Every client's result, in client order (panics if a client panicked).
    pub fn join(self) -> Vec<T> {
        self.0
            .into_iter()
            .map(|h| h.join().expect("client thread"))
            .collect()
    }
}

/// Starts `n` clients, client `i` running `f(i)` on its own thread, and returns at once.
pub fn spawn_clients<T: Send + 'static>(
    n: usize,
    f: impl Fn(usize) -> T + Send + Sync + 'static,
) -> Clients<T> {
    let f = Arc::new(f);
    Clients(
        (0..n)
            .map(|i| {
                let f = f.clone();
                std::thread::spawn(move || f(i))
            })
            .collect(),
    )
}

/// Runs `f(i)` for each of `n` clients on its own thread; results in client order.
pub fn concurrently<T: Send + 'static>(
    n: usize,
    f: impl Fn(usize) -> T + Send + Sync + 'static,
) -> Vec<T> {
    spawn_clients(n, f).join()
}

/// The text of a chat completion, which must be a 200.
pub fn chat_text(r: &Resp) -> String {
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The fixture's images `(file name, MIME type)`, read: `(bytes, MIME type)`.
pub fn fixture_images(names: &[(&str, &'static str)]) -> Vec<(Vec<u8>, &'static str)> {
    names
        .iter()
        .map(|(n, m)| {
            let p = super::fixture().join("images").join(n);
            (std::fs::read(p).unwrap(), *m)
        })
        .collect()
}

/// `n` greedy chat requests to `addr` sent together, request `i` with image
/// `images[i % len]` (bytes, MIME type) and `max_tokens(i)` new tokens: the responses in
/// request order.
pub fn concurrent_chats(
    addr: &str,
    images: &[(Vec<u8>, &'static str)],
    n: usize,
    max_tokens: impl Fn(usize) -> usize + Send + Sync + 'static,
) -> Vec<Resp> {
    let (addr, images) = (addr.to_string(), images.to_vec());
    concurrently(n, move |i| {
        let (b, m) = &images[i % images.len()];
        let body = chat_body(b, m, max_tokens(i)).to_string();
        post_json_to(&addr, "/v1/chat/completions", &body)
    })
}

/// A multipart/form-data body with text fields and one file field `file`.
pub fn multipart(fields: &[(&str, &str)], file: Option<(&str, &[u8])>) -> (String, Vec<u8>) {
    let boundary = "ocrctl-test-boundary-7d1f";
    let mut b = Vec::new();
    for (k, v) in fields {
        b.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n")
                .as_bytes(),
        );
    }
    if let Some((name, data)) = file {
        b.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        b.extend_from_slice(data);
        b.extend_from_slice(b"\r\n");
    }
    b.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), b)
}

/// A running `ocrctl serve`, killed on drop.
pub struct Server {
    pub child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// Everything the server wrote to stderr so far.
    pub log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `ocrctl serve --model MODEL --port 0 ARGS…` and waits until it listens; with
    /// `wait_ready` also until `/health` is 200.
    pub fn start(model: &Path, args: &[&str], wait_ready: bool) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ocrctl"))
            .args(["serve", "--model", model.to_str().unwrap(), "--port", "0"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ocrctl serve starts");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(a) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(a.trim().to_string());
                }
                let mut l = log2.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!("ocrctl serve did not start:\n{}", log.lock().unwrap());
            }
        };
        let s = Server { child, addr, log };
        if wait_ready {
            let t = Instant::now();
            loop {
                if let Ok(r) = s.get("/health") {
                    if r.status == 200 {
                        break;
                    }
                }
                assert!(
                    t.elapsed() < Duration::from_secs(60),
                    "model did not load:\n{}",
                    s.log.lock().unwrap()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        s
    }

    /// `GET path`.
    pub fn get(&self, path: &str) -> std::io::Result<Resp> {
        request(&self.addr, "GET", path, &[], b"")
    }

    /// `POST path` with a JSON body.
    pub fn post_json(&self, path: &str, body: &serde_json::Value) -> Resp {
        post_json_to(&self.addr, path, &body.to_string())
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -TERM");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of the unlabelled gauge `name` in `s`'s `/metrics`.
pub fn gauge(s: &Server, name: &str) -> u64 {
    let m = s.get("/metrics").unwrap().text();
    m.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
        .parse()
        .unwrap()
}

/// A chat request for one image (data URL) with greedy decoding.
pub fn chat_body(image: &[u8], mime: &str, max_tokens: usize) -> serde_json::Value {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(image);
    serde_json::json!({
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": format!("data:{mime};base64,{b64}")}}
        ]}],
        "max_tokens": max_tokens,
        "temperature": 0
    })
}

/// A test profile (CPU, fp32) with these overrides of its YAML fields, written to `dir`.
pub fn test_profile(dir: &Path, batch: usize, queue: usize, body_mb: usize) -> std::path::PathBuf {
    let p = dir.join(format!("test-b{batch}-q{queue}.yaml"));
    std::fs::write(
        &p,
        format!(
            "name: test\ndescription: test profile\ngpu_memory_gb: 0\nproviders: [cpu]\nprecision: fp32\n\
             max_batch_size: {batch}\nmax_image_side: 1540\nmax_sequence_length: 4096\n\
             default_max_new_tokens: 32\nmax_new_tokens_limit: 256\nkv_cache_gb: 1\n\
             max_images_per_request: 4\nmax_body_mb: {body_mb}\nqueue_size: {queue}\ncpu:\n  threads: 1\n"
        ),
    )
    .unwrap();
    p
}

/// A PNG declaring `w`×`h` whose data is one empty zlib stream: what a decompression bomb
/// looks like before decoding (header, a tiny IDAT, IEND).
pub fn png_header(w: u32, h: u32) -> Vec<u8> {
    fn chunk(v: &mut Vec<u8>, kind: &[u8], data: &[u8]) {
        v.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let start = v.len();
        v.extend_from_slice(kind);
        v.extend_from_slice(data);
        let crc = crc32(&v[start..]);
        v.extend_from_slice(&crc.to_be_bytes());
    }
    let mut v = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = w.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(&mut v, b"IHDR", &ihdr);
    chunk(
        &mut v,
        b"IDAT",
        &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
    );
    chunk(&mut v, b"IEND", &[]);
    v
}

fn crc32(data: &[u8]) -> u32 {
    let mut c = 0xffff_ffffu32;
    for b in data {
        c ^= *b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}
