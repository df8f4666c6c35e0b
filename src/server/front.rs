//! The front door: connection handling and the checks every request passes before a handler
//! sees it.
//!
//! - **Connections** ([`serve`]): at most [`FrontLimits::max_connections`] at once (when all
//!   are taken the listener is not polled, so new ones wait in the kernel's backlog instead
//!   of taking file descriptors), and at most [`FrontLimits::max_per_client`] from one IP
//!   address (more are closed at once: ~700 silent reconnecting sockets from one host had
//!   made probes from others wait 4–28 s, 2026-12-05); a connection must send a request head within
//!   [`FrontLimits::header_read_timeout`], which hyper also applies to idle keep-alive
//!   connections, so silent sockets are closed; a response write that the client does not
//!   take within [`FrontLimits::write_timeout`] closes the connection too. axum's own
//!   `serve` has none of these settings, hence this small accept loop over hyper's HTTP/1
//!   connection builder.
//! - **Requests** ([`guard`]): headers over [`MAX_HEADER_BYTES`] get 431, two `Host`
//!   headers 400; a `Host` this server does not answer to gets 403 when no API key is set
//!   (DNS rebinding: a web page on another name must not reach a key-less local server); a
//!   declared `Content-Length` over the body limit gets 413 before anything is read (so no
//!   `100 Continue`); JSON routes refuse any `Content-Type` but `application/json` with 415
//!   (a cross-site form or `text/plain` POST cannot be sent as JSON by a browser without a
//!   preflight); once its first bytes are here a body takes its share of the server's
//!   [`BodyBudget`] (503 when it is not free in time), and the whole body must arrive within
//!   [`FrontLimits::body_timeout`], with no pause longer than the header timeout (408: a
//!   stalled body gives its share back).
//! - **Shutdown**: SIGTERM/SIGINT stops accepting, lets requests in flight finish for the
//!   grace period, then tells streams to end with an error event (see
//!   [`super::AppState::cut`]) and returns.

use super::error::ApiError;
use super::AppState;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

/// Largest request head (names and values of all headers) a handler is given; larger ones
/// get an OpenAI-shaped 431. (hyper refuses heads past its ~400 KiB read buffer itself.)
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// Routes whose bodies are JSON.
const JSON_ROUTES: [&str; 1] = ["/v1/chat/completions"];

/// Connection-level limits of a server.
#[derive(Debug, Clone)]
pub struct FrontLimits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Connections served at once from one IP address (0: no limit).
    pub max_per_client: usize,
    /// Time a connection has to send a request head (also while idle between requests).
    pub header_read_timeout: Duration,
    /// Time a request's body has to arrive.
    pub body_timeout: Duration,
    /// Time a response write may wait for the client to take bytes before the connection
    /// is closed (see [`super::write_timeout`]).
    pub write_timeout: Duration,
    /// Host names (besides IP literals and `localhost`) a key-less server answers to.
    pub allowed_hosts: Vec<String>,
}

impl Default for FrontLimits {
    fn default() -> Self {
        FrontLimits {
            max_connections: 512,
            max_per_client: 256,
            header_read_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(30),
            allowed_hosts: Vec::new(),
        }
    }
}

/// Memory for request bodies held at once, across all connections: a POST takes
/// [`BODY_COPIES`] times its `Content-Length` (the body limit when it declares none) when its
/// first bytes arrive (not before: a head alone holds nothing), and holds it until its handler
/// is done with the bytes ([`BodyPermit`]). A body larger than the whole budget waits until it
/// can be read alone.
///
/// Why: every route reads its body whole, so at the defaults (512 connections, 64 MiB bodies)
/// the bodies alone could hold 32 GiB; 32 concurrent 60 MB chat bodies took the fixture server
/// from 60 MB to 2.0 GB.
/// What a body costs at its peak, in multiples of its length: the body itself ([`read_body`])
/// and the image bytes a data URL's base64 decodes to (3/4 of its length), decoded while the
/// body is parsed (`openai::request::Url`). (Measured: one 30 MB chat body raises the fixture
/// server's resident memory by 45–50 MB, 1.5–1.7 times; 75–81 MB while the parsed request
/// held the base64 as a string of its own, 141 MB before the body was read into one buffer.)
pub const BODY_COPIES: u64 = 2;

#[derive(Debug)]
pub struct BodyBudget {
    permits: Arc<Semaphore>,
    /// The budget in KiB, the semaphore's unit.
    total_kib: u32,
    /// Bytes granted now. (Not the semaphore's count: while a large body waits, the semaphore
    /// sets aside the permits freed for it, which no body holds yet.)
    held: Arc<AtomicU64>,
    /// The most bytes ever granted at once.
    peak: AtomicU64,
}

/// A body's share of the [`BodyBudget`]: the request carries it to its handler (an extension),
/// and it is given back when the last copy is dropped (by a handler when the body's bytes, and
/// what was decoded from them, are gone; with the request otherwise).
#[derive(Debug, Clone)]
pub struct BodyPermit {
    /// Held for its drop.
    _held: Arc<Held>,
}

#[derive(Debug)]
struct Held {
    _permit: OwnedSemaphorePermit,
    bytes: u64,
    held: Arc<AtomicU64>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.held.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl BodyBudget {
    /// A budget of `bytes` (at least 1 KiB).
    pub fn new(bytes: u64) -> BodyBudget {
        // Half of u32's range: tokio's semaphore takes at most `usize::MAX >> 3` permits and
        // `acquire_many` a u32.
        let total_kib = bytes.div_ceil(1024).clamp(1, u64::from(u32::MAX / 2)) as u32;
        BodyBudget {
            permits: Arc::new(Semaphore::new(total_kib as usize)),
            total_kib,
            held: Arc::new(AtomicU64::new(0)),
            peak: AtomicU64::new(0),
        }
    }

    /// Waits up to `wait` for `bytes` (capped at the whole budget); `None` when they did not
    /// become free in time.
    pub async fn acquire(&self, bytes: u64, wait: Duration) -> Option<BodyPermit> {
        let kib = bytes.div_ceil(1024).clamp(1, u64::from(self.total_kib)) as u32;
        let permit = tokio::time::timeout(wait, self.permits.clone().acquire_many_owned(kib))
            .await
            .ok()?
            .ok()?;
        let bytes = u64::from(kib) * 1024;
        let now = self.held.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
        Some(BodyPermit {
            _held: Arc::new(Held {
                _permit: permit,
                bytes,
                held: self.held.clone(),
            }),
        })
    }

    /// Bytes granted now (in whole KiB per body).
    pub fn in_use(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// The most bytes ever granted at once.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
}

/// The host name of a `Host` header value (`name:port`, `[v6]:port`, `name`), lower-cased.
fn host_name(value: &str) -> String {
    let v = value.trim();
    let name = if let Some(rest) = v.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        match v.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => v,
        }
    };
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// Whether a key-less server answers to `Host: value`: IP literals (a browser page can only
/// name an IP it really talks to), `localhost` and its subdomains (resolved locally), and the
/// `allowed` names. Anything else is what a DNS-rebinding page would send.
pub fn host_allowed(value: &str, allowed: &[String]) -> bool {
    let name = host_name(value);
    if name.is_empty() {
        return false;
    }
    name.parse::<IpAddr>().is_ok()
        || name == "localhost"
        || name.ends_with(".localhost")
        || allowed
            .iter()
            .any(|a| a.trim_end_matches('.').eq_ignore_ascii_case(&name))
}

fn head_bytes(h: &HeaderMap) -> usize {
    h.iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum()
}

fn is_json(h: &HeaderMap) -> bool {
    h.get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

/// The request checks of the module documentation, then the body read in full within the
/// body timeout (every route's body is read whole anyway, within `max_body_bytes`).
pub async fn guard(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    match check(&st, req).await {
        Ok(req) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

async fn check(st: &AppState, req: Request) -> Result<Request, ApiError> {
    check_head(st, &req)?;
    if req.method() != Method::POST {
        return Ok(req);
    }
    let declared = check_body_head(st, &req)?;
    read_whole_body(st, req, declared).await
}

/// The head's checks: its size, one Host header, and without an API key a Host this server
/// answers to.
fn check_head(st: &AppState, req: &Request) -> Result<(), ApiError> {
    let h = req.headers();
    if head_bytes(h) > MAX_HEADER_BYTES {
        return Err(ApiError::HeadersTooLarge {
            limit_kib: MAX_HEADER_BYTES / 1024,
        });
    }
    // Two `Host` headers: which one a proxy, a cache or the guard below reads differs, so
    // the request is refused (RFC 9112 §3.2: 400).
    if h.get_all(header::HOST).iter().nth(1).is_some() {
        return Err(ApiError::invalid(
            "the request has more than one Host header",
        ));
    }
    if st.cfg.api_key.is_none() {
        let host = h
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .or_else(|| req.uri().authority().map(|a| a.to_string()))
            .unwrap_or_default();
        if !host_allowed(&host, &st.cfg.front.allowed_hosts) {
            return Err(ApiError::Forbidden(format!(
                "Host {host:?} is not one this server answers to without an API key; \
                 use localhost or an IP address, start it with --allowed-hosts {}, or set --api-key",
                host_name(&host)
            )));
        }
    }
    Ok(())
}

/// A POST's declared body: within `max_body_bytes`, and JSON where the route takes JSON;
/// its declared length.
fn check_body_head(st: &AppState, req: &Request) -> Result<Option<u64>, ApiError> {
    let h = req.headers();
    let limit = st.cfg.max_body_bytes;
    let declared = h
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::TooLarge {
            limit_mb: (limit / (1024 * 1024)) as u64,
        });
    }
    if JSON_ROUTES.contains(&req.uri().path()) && !is_json(h) {
        let got = h
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("none");
        return Err(ApiError::UnsupportedMediaType(format!(
            "this route takes Content-Type: application/json (got {got})"
        )));
    }
    Ok(declared)
}

/// `req` with its body read whole within the body timeout, holding its share of the body
/// budget (taken once the first bytes are here) until the request is done.
async fn read_whole_body(
    st: &AppState,
    req: Request,
    declared: Option<u64>,
) -> Result<Request, ApiError> {
    let limit = st.cfg.max_body_bytes;
    let front = &st.cfg.front;
    let secs = front.body_timeout.as_secs();
    let timed_out = || {
        ApiError::BodyTimeout(format!(
            "the request body did not arrive within {secs} s (--body-timeout)"
        ))
    };
    let deadline = tokio::time::Instant::now() + front.body_timeout;
    let (parts, mut body) = req.into_parts();
    // Nothing is taken from the budget before the body's first bytes are here: a head that
    // declares 64 MiB and sends nothing held 128 MiB of it until the body timeout.
    let first = tokio::time::timeout_at(deadline, next_data(&mut body))
        .await
        .map_err(|_| timed_out())??;
    let wait = deadline.saturating_duration_since(tokio::time::Instant::now());
    let share = BODY_COPIES * declared.unwrap_or(limit as u64);
    let permit = st.body_budget.acquire(share, wait).await.ok_or_else(|| {
        ApiError::Unavailable(format!(
            "other requests' bodies hold the memory for request bodies \
             (--body-memory-mb) and it did not free up within {secs} s; retry"
        ))
    })?;
    let capacity = declared.map_or(0, |n| n as usize);
    let read = read_body(first, body, limit, capacity, front.header_read_timeout);
    let bytes = tokio::time::timeout_at(deadline, read)
        .await
        .map_err(|_| timed_out())??;
    let mut req = Request::from_parts(parts, Body::from(bytes));
    req.extensions_mut().insert(permit);
    Ok(req)
}

/// The next data of `body` (trailers skipped); `None` at its end.
async fn next_data(body: &mut Body) -> Result<Option<bytes::Bytes>, ApiError> {
    use http_body_util::BodyExt;
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| ApiError::invalid(format!("cannot read the request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            return Ok(Some(data));
        }
    }
    Ok(None)
}

/// Reads `first` and the rest of `body` (at most `limit` bytes, else 413) into one buffer of
/// `capacity` bytes (the declared length), each chunk appended and dropped as it arrives; a
/// body that sends nothing for `stall` gets 408 (and so gives its share of the budget back
/// long before the body timeout). Why not axum's `to_bytes`: it keeps every chunk until the
/// end and then copies them into one buffer, twice the body at its peak.
async fn read_body(
    first: Option<bytes::Bytes>,
    mut body: Body,
    limit: usize,
    capacity: usize,
    stall: Duration,
) -> Result<bytes::Bytes, ApiError> {
    let mut buf = bytes::BytesMut::with_capacity(capacity.min(limit));
    let mut next = first;
    while let Some(data) = next {
        if buf.len() + data.len() > limit {
            return Err(ApiError::TooLarge {
                limit_mb: (limit / (1024 * 1024)) as u64,
            });
        }
        buf.extend_from_slice(&data);
        next = tokio::time::timeout(stall, next_data(&mut body))
            .await
            .map_err(|_| {
                ApiError::BodyTimeout(format!(
                    "the request body stalled: no bytes for {} s (--header-timeout)",
                    stall.as_secs()
                ))
            })??;
    }
    Ok(buf.freeze())
}

/// Serves `app` on `listener` with `st`'s connection limits until SIGTERM/SIGINT (or
/// `stop` turning true), then shuts down as the module documentation says.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    st: Arc<AppState>,
    grace: Duration,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let limits = st.cfg.front.clone();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let clients = Clients::new(limits.max_per_client);
    let (closing_tx, closing) = watch::channel(false);
    let signalled = super::shutdown_signal();
    tokio::pin!(signalled);
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p.expect("never closed"),
            _ = &mut signalled => break,
            _ = stop.wait_for(|s| *s) => break,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, a)) => (s, a.ip()),
                Err(e) => {
                    // Out of file descriptors, say: wait instead of spinning.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut signalled => break,
            _ = stop.wait_for(|s| *s) => break,
        };
        let Some(client) = clients.admit(peer) else {
            // Over its share: closed now, the slot free for others.
            drop(stream);
            continue;
        };
        let stream = super::write_timeout::WriteTimeout::new(stream, limits.write_timeout);
        // Dropped in this order when the connection ends: the client's count, then the slot.
        let held = (client, permit);
        spawn_connection(&app, stream, held, limits.header_read_timeout, &closing);
    }
    drop(listener);
    shut_down(&st, &slots, limits.max_connections, grace, closing_tx).await;
    Ok(())
}

/// Serves one connection on its own task, holding its connection slot and its client's
/// count (`held`) until it ends; once `closing` turns true it finishes the request in
/// flight and closes.
fn spawn_connection(
    app: &Router,
    stream: super::write_timeout::WriteTimeout<tokio::net::TcpStream>,
    held: (ClientHold, OwnedSemaphorePermit),
    header_timeout: Duration,
    closing: &watch::Receiver<bool>,
) {
    use hyper::server::conn::http1;
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;

    let svc = TowerToHyperService::new(app.clone());
    let mut closing = closing.clone();
    tokio::spawn(async move {
        let _held = held;
        let mut b = http1::Builder::new();
        b.timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .keep_alive(true);
        let conn = b.serve_connection(TokioIo::new(stream), svc);
        tokio::pin!(conn);
        let finished = tokio::select! {
            _ = conn.as_mut() => true,
            _ = closing.wait_for(|c| *c) => false,
        };
        if !finished {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    });
}

/// The shutdown once the listener is closed: connections told to close after their request
/// in flight, and after `grace` the requests still running cut.
async fn shut_down(
    st: &AppState,
    slots: &Semaphore,
    max_connections: usize,
    grace: Duration,
    closing_tx: watch::Sender<bool>,
) {
    st.stopping.store(true, Ordering::Relaxed);
    tracing::info!(
        "shutting down, finishing running requests (at most {} s)",
        grace.as_secs()
    );
    let _ = closing_tx.send(true);
    let all_closed = slots.acquire_many(max_connections as u32);
    tokio::select! {
        _ = all_closed => {}
        _ = tokio::time::sleep(grace) => {
            tracing::warn!("grace period over, ending the requests still running");
            let _ = st.cut.send(true);
            // Let the streams send their error event and [DONE].
            let _ = tokio::time::timeout(
                Duration::from_secs(2),
                slots.acquire_many(max_connections as u32),
            )
            .await;
        }
    }
}

/// Connections open per client address, for [`FrontLimits::max_per_client`].
#[derive(Clone)]
struct Clients {
    max: usize,
    open: Arc<std::sync::Mutex<std::collections::HashMap<IpAddr, usize>>>,
}

/// One admitted connection of a client; its count goes down when this is dropped.
struct ClientHold {
    clients: Clients,
    ip: IpAddr,
}

impl Clients {
    fn new(max: usize) -> Clients {
        Clients {
            max,
            open: Default::default(),
        }
    }

    /// A hold for one more connection from `ip`, or `None` when it has its share already.
    fn admit(&self, ip: IpAddr) -> Option<ClientHold> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(ip).or_insert(0);
        if self.max > 0 && *n >= self.max {
            return None;
        }
        *n += 1;
        Some(ClientHold {
            clients: self.clone(),
            ip,
        })
    }
}

impl Drop for ClientHold {
    fn drop(&mut self) {
        let mut open = self.clients.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Grants within the budget, waits (and gives up after `wait`) beyond it, counts only what
    /// it granted (not what it sets aside for a waiting body), and lets a body larger than the
    /// whole budget through alone.
    #[tokio::test]
    async fn the_body_budget_grants_waits_and_counts_what_it_granted() {
        let b = BodyBudget::new(10 * 1024);
        let short = Duration::from_millis(30);
        let first = b.acquire(4 * 1024, short).await.unwrap();
        let second = b.acquire(3 * 1024 + 1, short).await.unwrap(); // 4 KiB, whole KiB
        assert_eq!(b.in_use(), 8 * 1024);
        assert!(b.acquire(4 * 1024, short).await.is_none(), "2 KiB left");
        drop(first);
        assert_eq!(b.in_use(), 4 * 1024);
        // More than the whole budget: waits for all of it, so the copy of `second` must go.
        let copy = second.clone();
        drop(second);
        assert_eq!(b.in_use(), 4 * 1024, "a clone keeps the share");
        let (big, _) = tokio::join!(b.acquire(1 << 30, Duration::from_secs(5)), async {
            tokio::time::sleep(short).await;
            assert_eq!(
                b.in_use(),
                4 * 1024,
                "set aside for the waiting body, not granted"
            );
            drop(copy);
        });
        assert_eq!(b.in_use(), 10 * 1024);
        drop(big);
        assert_eq!((b.in_use(), b.peak()), (0, 10 * 1024));
    }

    #[test]
    fn host_names_are_read_like_browsers_send_them() {
        assert_eq!(host_name("LocalHost:8000"), "localhost");
        assert_eq!(host_name("[::1]:8000"), "::1");
        assert_eq!(host_name("example.com."), "example.com");
        assert_eq!(host_name("10.1.2.3"), "10.1.2.3");
    }

    #[test]
    fn only_ip_literals_localhost_and_listed_names_pass() {
        let none: Vec<String> = vec![];
        for ok in [
            "127.0.0.1:8000",
            "[::1]:1",
            "localhost",
            "a.localhost:9",
            "192.168.1.5",
        ] {
            assert!(host_allowed(ok, &none), "{ok}");
        }
        for bad in [
            "attacker.example:8000",
            "",
            "localhost.attacker.example",
            "127.0.0.1.nip.io",
        ] {
            assert!(!host_allowed(bad, &none), "{bad}");
        }
        let listed = vec!["ocr.internal".to_string()];
        assert!(host_allowed("OCR.internal:443", &listed));
        assert!(!host_allowed("other.internal", &listed));
    }
}
