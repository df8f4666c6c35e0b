//! The worker process of the [`super::sandbox`]: `ocrctl pdf-worker` (a hidden subcommand)
//! opens documents and renders pages with pdfium on request ([`super::wire`]), under an
//! address-space limit for its whole life and a CPU-time limit renewed before each request,
//! so that a page that never ends (forms that draw each other: pdfium expands them while it
//! loads the page, before any render call that could be paused) dies here, not in the
//! process that asked.

use super::{wire, PdfDocument, PdfError};
use std::fs::File;
use std::io::BufWriter;
use std::os::fd::FromRawFd;
use std::path::Path;
use std::process::ExitCode;

/// The subcommand that runs [`run`].
pub const COMMAND: &str = "pdf-worker";

/// Serves requests on stdin until it closes: `memory` bytes of address space at most,
/// `cpu_seconds` of CPU time per request (the kernel stops the process past either). Answers
/// go to what was stdout; stdout itself is pointed at stderr, so that nothing pdfium prints
/// can garble them.
pub fn run(pdfium: Option<&Path>, memory: u64, cpu_seconds: u64) -> ExitCode {
    // SAFETY: plain descriptor calls on this process's own stdout and stderr.
    let answers = unsafe {
        let fd = libc::dup(1);
        if fd < 0 || libc::dup2(2, 1) < 0 {
            return ExitCode::FAILURE;
        }
        File::from_raw_fd(fd)
    };
    let mut out = BufWriter::with_capacity(1 << 20, answers);
    if limit_memory(memory).is_err() {
        return ExitCode::FAILURE;
    }
    let mut stdin = std::io::stdin().lock();
    let mut doc: Option<PdfDocument<'static>> = None;
    loop {
        let (tag, payload) = match wire::read_message(&mut stdin) {
            Ok(Some(m)) => m,
            Ok(None) => return ExitCode::SUCCESS,
            Err(_) => return ExitCode::FAILURE,
        };
        if renew_cpu_limit(cpu_seconds).is_err() {
            return ExitCode::FAILURE;
        }
        let answer = match tag {
            wire::OPEN => open(&mut doc, payload, pdfium),
            wire::RENDER => match (&doc, wire::u32_at(&payload, 0)) {
                (Some(d), Ok(i)) => render(d, i as usize, None),
                _ => return ExitCode::FAILURE,
            },
            wire::RENDER_FULL => match (&doc, wire::u32_at(&payload, 0), wire::u64_at(&payload, 4))
            {
                (Some(d), Ok(i), Ok(max)) => render(d, i as usize, Some(max)),
                _ => return ExitCode::FAILURE,
            },
            wire::TEXT => match (&doc, wire::u32_at(&payload, 0)) {
                (Some(d), Ok(i)) => d.page_text(i as usize).map(String::into_bytes),
                _ => return ExitCode::FAILURE,
            },
            wire::CLOSE => {
                doc = None;
                Ok(Vec::new())
            }
            _ => return ExitCode::FAILURE,
        };
        let sent = match answer {
            Ok(p) => wire::write_message(&mut out, wire::OK, &[&p]),
            Err(e) => wire::write_message(&mut out, wire::ERR, &[&wire::error_payload(&e)]),
        };
        if sent.is_err() {
            return ExitCode::FAILURE;
        }
    }
}

/// Opens the document of an [`wire::OPEN`] payload in place of `doc`; answers its page count.
fn open(
    doc: &mut Option<PdfDocument<'static>>,
    mut payload: Vec<u8>,
    pdfium: Option<&Path>,
) -> Result<Vec<u8>, PdfError> {
    *doc = None;
    let (name, bytes) = wire::split_open(&payload).map_err(|e| PdfError::Broken {
        name: "?".into(),
        detail: e.to_string(),
    })?;
    let skip = payload.len() - bytes.len();
    payload.drain(..skip);
    let d = PdfDocument::open(payload, &name, pdfium)?;
    let pages = d.page_count() as u32;
    *doc = Some(d);
    Ok(pages.to_le_bytes().to_vec())
}

/// Renders page `index` (at full resolution within `full` pixels when given); answers its
/// width, height and RGB rows.
fn render(doc: &PdfDocument<'_>, index: usize, full: Option<u64>) -> Result<Vec<u8>, PdfError> {
    let img = match full {
        Some(max) => doc.render_page_full(index, max)?,
        None => doc.render_page(index)?,
    };
    let (w, h) = img.dimensions();
    let mut p = Vec::with_capacity(8 + img.as_raw().len());
    p.extend_from_slice(&w.to_le_bytes());
    p.extend_from_slice(&h.to_le_bytes());
    p.extend_from_slice(img.as_raw());
    Ok(p)
}

/// Limits this process's address space to `bytes` (soft and hard limit).
fn limit_memory(bytes: u64) -> std::io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: bytes as libc::rlim_t,
        rlim_max: bytes as libc::rlim_t,
    };
    // SAFETY: a plain system call on this process.
    match unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Lets the next request use `seconds` (+1, the kernel counts whole seconds) of CPU time on
/// top of what this process has used: past it the kernel sends SIGXCPU, which ends it. Only
/// the soft limit moves (an unprivileged process cannot raise a hard limit it lowered).
fn renew_cpu_limit(seconds: u64) -> std::io::Result<()> {
    // SAFETY: getrusage fills the struct it is given.
    let used = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut u) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        (u.ru_utime.tv_sec + u.ru_stime.tv_sec) as u64
    };
    let lim = libc::rlimit {
        rlim_cur: (used + seconds + 1) as libc::rlim_t,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a plain system call on this process.
    match unsafe { libc::setrlimit(libc::RLIMIT_CPU, &lim) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}
