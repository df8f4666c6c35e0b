//! PDFs opened and rendered in a worker process ([`super::worker`], this binary re-executed
//! as `ocrctl pdf-worker`), so that a document whose pages never end cannot take the process
//! that reads it. (A 957-byte PDF with two forms that draw each other grew the server by
//! 260 MB/s without end and aborted `ocrctl ocr` with a C++ exception; 10 M rectangles in a
//! 253 KB PDF took 3 GB.) pdfium has no memory limit, and its pausable render does not help:
//! those pages grow while `FPDF_LoadPage` parses them, before any render call.
//!
//! Each step (opening a document, rendering one page) has [`PdfLimits`]: a wall-clock time
//! the parent enforces by killing the worker, the same CPU time enforced by the kernel in the
//! worker, and an address-space limit (`RLIMIT_AS`) for the worker. A step past a limit
//! fails with [`PdfError::Limit`] naming the document, the page and the limit; the next step
//! gets a fresh worker (reopening the document for its next page). Idle workers are kept for
//! the next document ([`MAX_IDLE`]); pixels come back through a pipe (a 1190 × 1540 page is
//! 5.5 MB).

use super::wire;
use super::{PdfDocument, PdfError};
use image::RgbImage;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Default time limit of one step, seconds (a real page renders in well under a second).
pub const DEFAULT_SECONDS: u64 = 60;
/// Default memory limit of the worker, MiB (a real page takes tens of MiB).
pub const DEFAULT_MEMORY_MIB: u64 = 2048;
/// Idle workers kept for later documents.
pub const MAX_IDLE: usize = 4;
/// How often the parent samples a busy worker's size (to tell a memory limit from a crash).
const SAMPLE_EVERY: Duration = Duration::from_millis(20);

/// What one step of reading a PDF may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PdfLimits {
    /// Wall-clock (and CPU) seconds to open a document or render a page.
    pub seconds: u64,
    /// Address space of the worker, MiB.
    pub memory_mib: u64,
}

impl Default for PdfLimits {
    fn default() -> Self {
        Self {
            seconds: DEFAULT_SECONDS,
            memory_mib: DEFAULT_MEMORY_MIB,
        }
    }
}

/// Which step of reading a document failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Step {
    /// Opening it (parsing the file, counting pages).
    Open,
    /// Rendering this page (1-based).
    Page(usize),
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Open => f.write_str("opening the document"),
            Step::Page(n) => write!(f, "page {n}"),
        }
    }
}

/// Which limit a step went past.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Exceeded {
    /// [`PdfLimits::seconds`].
    Time {
        /// The limit.
        seconds: u64,
    },
    /// [`PdfLimits::memory_mib`].
    Memory {
        /// The limit.
        mib: u64,
    },
}

impl std::fmt::Display for Exceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exceeded::Time { seconds } => write!(
                f,
                "took longer than the PDF time limit of {seconds} s a page (--pdf-page-timeout); \
                 the renderer was stopped"
            ),
            Exceeded::Memory { mib } => write!(
                f,
                "needed more than the PDF memory limit of {mib} MiB (--pdf-page-memory); the \
                 renderer was stopped"
            ),
        }
    }
}

/// Starts workers and keeps idle ones. Shared (`Arc`) by everything that reads PDFs.
#[derive(Debug)]
pub struct Sandbox {
    exe: PathBuf,
    pdfium: Option<PathBuf>,
    limits: PdfLimits,
    idle: Mutex<Vec<Worker>>,
}

impl Sandbox {
    /// Workers of this very binary (`/proc/self/exe`, which still runs if the file was
    /// replaced since), with `pdfium` as the explicit library path (else searched).
    pub fn new(pdfium: Option<PathBuf>, limits: PdfLimits) -> Sandbox {
        let me = Path::new("/proc/self/exe");
        let exe = match me.exists() {
            true => me.to_path_buf(),
            false => std::env::current_exe().unwrap_or_else(|_| "ocrctl".into()),
        };
        Self::with_exe(exe, pdfium, limits)
    }

    /// Workers of the `ocrctl` binary `exe` (for tests, whose own binary is not `ocrctl`).
    pub fn with_exe(exe: PathBuf, pdfium: Option<PathBuf>, limits: PdfLimits) -> Sandbox {
        Sandbox {
            exe,
            pdfium,
            limits,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// The limits of each step.
    pub fn limits(&self) -> PdfLimits {
        self.limits
    }

    /// Opens a document in a worker and counts its pages (the checks of
    /// [`PdfDocument::open`]); `name` names it in errors.
    pub fn open(self: &Arc<Self>, bytes: Vec<u8>, name: &str) -> Result<SandboxedPdf, PdfError> {
        let mut doc = SandboxedPdf {
            sandbox: self.clone(),
            worker: None,
            bytes,
            name: name.to_string(),
            pages: 0,
        };
        doc.reopen()?;
        Ok(doc)
    }

    /// An idle worker, else a new one.
    fn take(&self, name: &str) -> Result<Worker, PdfError> {
        if let Some(w) = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(w);
        }
        Worker::spawn(self).map_err(|e| PdfError::WorkerStart {
            name: name.to_string(),
            detail: format!("{}: {e}", self.exe.display()),
        })
    }

    /// Keeps `w` for the next document (up to [`MAX_IDLE`]).
    fn give(&self, w: Worker) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(w);
        }
    }
}

/// A document open in a worker of a [`Sandbox`]. It keeps its bytes to open them again in
/// a fresh worker when a page stopped the last one.
pub struct SandboxedPdf {
    sandbox: Arc<Sandbox>,
    worker: Option<Worker>,
    bytes: Vec<u8>,
    name: String,
    pages: usize,
}

impl SandboxedPdf {
    /// Number of pages (1 ..= [`super::PDF_MAX_PAGES`]).
    pub fn page_count(&self) -> usize {
        self.pages
    }

    /// Renders page `index` (0-based) like [`PdfDocument::render_page`], within the limits.
    pub fn render_page(&mut self, index: usize) -> Result<RgbImage, PdfError> {
        self.render(index, wire::RENDER, &[])
    }

    /// Renders page `index` like [`PdfDocument::render_page_full`], within the limits.
    pub fn render_page_full(
        &mut self,
        index: usize,
        max_pixels: u64,
    ) -> Result<RgbImage, PdfError> {
        self.render(index, wire::RENDER_FULL, &max_pixels.to_le_bytes())
    }

    /// Page `index`'s text layer, like [`PdfDocument::page_text`], within the limits.
    pub fn page_text(&mut self, index: usize) -> Result<String, PdfError> {
        if self.worker.is_none() {
            self.reopen()?;
        }
        let p = self.call(
            Step::Page(index + 1),
            wire::TEXT,
            &[&(index as u32).to_le_bytes()],
        )?;
        Ok(String::from_utf8_lossy(&p).into_owned())
    }

    /// One render request of tag `tag` for page `index`, `extra` after the index.
    fn render(&mut self, index: usize, tag: u8, extra: &[u8]) -> Result<RgbImage, PdfError> {
        if self.worker.is_none() {
            self.reopen()?;
        }
        let step = Step::Page(index + 1);
        let p = self.call(step, tag, &[&(index as u32).to_le_bytes(), extra])?;
        let bad = || PdfError::Worker {
            name: self.name.clone(),
            step,
            detail: "a malformed answer".into(),
        };
        let (w, h) = (wire::u32_at(&p, 0), wire::u32_at(&p, 4));
        let (Ok(w), Ok(h)) = (w, h) else {
            return Err(bad());
        };
        let mut p = p;
        p.drain(..8);
        RgbImage::from_raw(w, h, p).ok_or_else(bad)
    }

    /// Opens the document in a worker (an idle or a new one).
    fn reopen(&mut self) -> Result<(), PdfError> {
        self.worker = Some(self.sandbox.take(&self.name)?);
        let name = self.name.clone();
        let name_len = (name.len() as u32).to_le_bytes();
        let bytes = std::mem::take(&mut self.bytes);
        let parts: [&[u8]; 3] = [&name_len, name.as_bytes(), &bytes];
        let answer = self.call(Step::Open, wire::OPEN, &parts);
        self.bytes = bytes;
        let p = answer?;
        self.pages = wire::u32_at(&p, 0).map_err(|e| PdfError::Worker {
            name: self.name.clone(),
            step: Step::Open,
            detail: e.to_string(),
        })? as usize;
        Ok(())
    }

    /// Sends one request to the worker held and returns its answer. A worker that went past
    /// a limit or failed is gone afterwards; one that answered (even with an error) stays.
    fn call(&mut self, step: Step, tag: u8, parts: &[&[u8]]) -> Result<Vec<u8>, PdfError> {
        let limits = self.sandbox.limits;
        let w = self.worker.as_mut().expect("a worker is held");
        match w.call(tag, parts, limits) {
            Ok(answer) => answer,
            Err(stop) => {
                self.worker = None;
                Err(match stop {
                    Stop::Limit(exceeded) => PdfError::Limit {
                        name: self.name.clone(),
                        step,
                        exceeded,
                    },
                    Stop::Failed(detail) => PdfError::Worker {
                        name: self.name.clone(),
                        step,
                        detail,
                    },
                })
            }
        }
    }
}

impl Drop for SandboxedPdf {
    /// Closes the document and keeps the worker for the next one.
    fn drop(&mut self) {
        if let Some(mut w) = self.worker.take() {
            if let Ok(Ok(_)) = w.call(wire::CLOSE, &[], self.sandbox.limits) {
                self.sandbox.give(w);
            }
        }
    }
}

/// How a worker stopped without answering.
enum Stop {
    /// It went past a limit (and was killed, or the kernel stopped it).
    Limit(Exceeded),
    /// It could not be reached, or died short of a limit.
    Failed(String),
}

/// One worker process: its pipes, and the largest size seen while it worked.
#[derive(Debug)]
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: ChildStdout,
    peak: u64,
}

impl Worker {
    fn spawn(sb: &Sandbox) -> io::Result<Worker> {
        let mut cmd = Command::new(&sb.exe);
        cmd.arg(super::worker::COMMAND)
            .arg("--memory-bytes")
            .arg((sb.limits.memory_mib << 20).to_string())
            .arg("--cpu-seconds")
            .arg(sb.limits.seconds.to_string());
        if let Some(lib) = &sb.pdfium {
            cmd.arg("--pdfium-lib").arg(lib);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let (stdin, stdout) = (child.stdin.take(), child.stdout.take());
        Ok(Worker {
            child,
            stdin: stdin.expect("piped"),
            stdout: stdout.expect("piped"),
            peak: 0,
        })
    }

    /// Sends a request and waits for the answer within `limits.seconds`: the answer's
    /// payload, or the [`PdfError`] the worker answered with.
    fn call(
        &mut self,
        tag: u8,
        parts: &[&[u8]],
        limits: PdfLimits,
    ) -> Result<Result<Vec<u8>, PdfError>, Stop> {
        let deadline = Instant::now() + Duration::from_secs(limits.seconds);
        self.peak = 0;
        if wire::write_message(&mut self.stdin, tag, parts).is_err() {
            return Err(self.stopped(false, limits));
        }
        let mut h = [0u8; 9];
        let read = self.read_by(&mut h, deadline).and_then(|()| {
            let (tag, len) = wire::parse_header(&h).map_err(|_| false)?;
            let mut payload = vec![0u8; len];
            self.read_by(&mut payload, deadline)?;
            Ok((tag, payload))
        });
        match read {
            Ok((wire::OK, p)) => Ok(Ok(p)),
            Ok((wire::ERR, p)) => match wire::parse_error(&p) {
                Ok(e) => Ok(Err(e)),
                Err(e) => Err(Stop::Failed(format!("a malformed error: {e}"))),
            },
            Ok((tag, _)) => Err(Stop::Failed(format!("an answer tagged {tag}"))),
            Err(timed_out) => Err(self.stopped(timed_out, limits)),
        }
    }

    /// Fills `buf` from the worker by `deadline`, sampling its size while it works.
    /// `Err(true)`: the deadline passed; `Err(false)`: the pipe closed or failed.
    fn read_by(&mut self, buf: &mut [u8], deadline: Instant) -> Result<(), bool> {
        let fd = self.stdout.as_raw_fd();
        let mut filled = 0;
        while filled < buf.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(true);
            }
            let wait = left.min(SAMPLE_EVERY).as_millis().max(1) as libc::c_int;
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the duration of the call.
            let ready = unsafe { libc::poll(&mut pfd, 1, wait) };
            if ready == 0 {
                self.sample();
                continue;
            }
            if ready < 0 {
                match io::Error::last_os_error().kind() {
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(false),
                }
            }
            match self.stdout.read(&mut buf[filled..]) {
                Ok(0) => return Err(false),
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Err(false),
            }
        }
        Ok(())
    }

    /// Notes the worker's address-space size (Linux: `/proc/PID/statm`, in pages).
    fn sample(&mut self) {
        let statm = std::fs::read_to_string(format!("/proc/{}/statm", self.child.id()));
        let pages = statm
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok());
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
        if let Some(p) = pages {
            self.peak = self.peak.max(p * page);
        }
    }

    /// Stops the worker (killed when `timed_out`, else it is already ending) and says why it
    /// stopped: the time limit, the memory limit (it crashed within a quarter of it: an
    /// allocation past `RLIMIT_AS` aborts pdfium), or a failure.
    fn stopped(&mut self, timed_out: bool, limits: PdfLimits) -> Stop {
        let _ = self.child.kill();
        let status = self.child.wait();
        let time = Stop::Limit(Exceeded::Time {
            seconds: limits.seconds,
        });
        if timed_out {
            return time;
        }
        let signal = status.as_ref().ok().and_then(|s| s.signal());
        if signal == Some(libc::SIGXCPU) {
            return time;
        }
        let limit = limits.memory_mib << 20;
        if self.peak >= limit / 4 * 3 {
            return Stop::Limit(Exceeded::Memory {
                mib: limits.memory_mib,
            });
        }
        let how = match (signal, &status) {
            (Some(s), _) => format!("killed by signal {s}"),
            (None, Ok(s)) => s.to_string(),
            (None, Err(e)) => e.to_string(),
        };
        Stop::Failed(format!("it stopped ({how}) at {} MiB", self.peak >> 20))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How a program reads PDFs: in this process (trusted documents, tests of the renderer
/// itself) or in a [`Sandbox`] (everything `ocrctl ocr` and `ocrctl serve` read).
#[derive(Debug, Clone)]
pub enum PdfReader {
    /// pdfium in this process, from this explicit library path (else searched).
    InProcess(Option<PathBuf>),
    /// pdfium in worker processes.
    Sandboxed(Arc<Sandbox>),
}

impl PdfReader {
    /// Opens a document (see [`PdfDocument::open`]); `name` names it in errors.
    pub fn open(&self, bytes: Vec<u8>, name: &str) -> Result<OpenPdf, PdfError> {
        match self {
            PdfReader::InProcess(lib) => {
                PdfDocument::open(bytes, name, lib.as_deref()).map(OpenPdf::InProcess)
            }
            PdfReader::Sandboxed(sb) => sb.open(bytes, name).map(OpenPdf::Sandboxed),
        }
    }
}

/// A document opened by a [`PdfReader`].
pub enum OpenPdf {
    /// In this process.
    InProcess(PdfDocument<'static>),
    /// In a worker.
    Sandboxed(SandboxedPdf),
}

impl OpenPdf {
    /// Number of pages.
    pub fn page_count(&self) -> usize {
        match self {
            OpenPdf::InProcess(d) => d.page_count(),
            OpenPdf::Sandboxed(d) => d.page_count(),
        }
    }

    /// Renders page `index` (0-based); see [`PdfDocument::render_page`].
    pub fn render_page(&mut self, index: usize) -> Result<RgbImage, PdfError> {
        match self {
            OpenPdf::InProcess(d) => d.render_page(index),
            OpenPdf::Sandboxed(d) => d.render_page(index),
        }
    }

    /// Page `index`'s text layer; see [`PdfDocument::page_text`].
    pub fn page_text(&mut self, index: usize) -> Result<String, PdfError> {
        match self {
            OpenPdf::InProcess(d) => d.page_text(index),
            OpenPdf::Sandboxed(d) => d.page_text(index),
        }
    }

    /// Renders page `index` at full resolution; see [`PdfDocument::render_page_full`].
    pub fn render_page_full(
        &mut self,
        index: usize,
        max_pixels: u64,
    ) -> Result<RgbImage, PdfError> {
        match self {
            OpenPdf::InProcess(d) => d.render_page_full(index, max_pixels),
            OpenPdf::Sandboxed(d) => d.render_page_full(index, max_pixels),
        }
    }
}
