//! The messages between the [`super::sandbox`] and its worker process, over the worker's
//! stdin (requests) and a pipe that was its stdout (answers). Every message is a tag byte, a
//! little-endian `u64` payload length and the payload:
//!
//! | request | payload                                   | answer payload (tag [`OK`])   |
//! |---------|-------------------------------------------|-------------------------------|
//! | [`OPEN`]   | `u32` name length, name (UTF-8), PDF bytes | `u32` page count           |
//! | [`RENDER`] | `u32` 0-based page index                   | `u32` w, `u32` h, RGB rows |
//! | [`RENDER_FULL`] | `u32` page index, `u64` most pixels   | `u32` w, `u32` h, RGB rows |
//! | [`TEXT`]   | `u32` 0-based page index                   | the page's text layer, UTF-8 |
//! | [`CLOSE`]  | none                                       | none                       |
//!
//! An answer tagged [`ERR`] carries a [`PdfError`] as JSON.

use super::PdfError;
use std::io::{self, Read, Write};

/// Request: open a document (closing the one open, if any).
pub const OPEN: u8 = 1;
/// Request: render a page of the open document.
pub const RENDER: u8 = 2;
/// Request: close the open document.
pub const CLOSE: u8 = 3;
/// Request: render a page at full resolution (what figures are cropped from).
pub const RENDER_FULL: u8 = 4;
/// Request: a page's text layer.
pub const TEXT: u8 = 5;
/// Answer: done.
pub const OK: u8 = 0;
/// Answer: failed with a [`PdfError`].
pub const ERR: u8 = 1;

/// The largest payload read: a PDF of 1 GiB, or a full-resolution page of ~350 M pixels.
pub const MAX_PAYLOAD: u64 = 1 << 30;

/// Writes one message of `parts` concatenated.
pub fn write_message(w: &mut impl Write, tag: u8, parts: &[&[u8]]) -> io::Result<()> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    w.write_all(&[tag])?;
    w.write_all(&(len as u64).to_le_bytes())?;
    for p in parts {
        w.write_all(p)?;
    }
    w.flush()
}

/// The tag and payload length of a message header.
pub fn parse_header(h: &[u8; 9]) -> io::Result<(u8, usize)> {
    let len = u64::from_le_bytes(h[1..].try_into().expect("8 bytes"));
    if len > MAX_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a message of {len} bytes, more than {MAX_PAYLOAD}"),
        ));
    }
    Ok((h[0], len as usize))
}

/// Reads one message (blocking); `None` at the end of the stream before a header.
pub fn read_message(r: &mut impl Read) -> io::Result<Option<(u8, Vec<u8>)>> {
    let mut h = [0u8; 9];
    match r.read_exact(&mut h) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        r => r?,
    }
    let (tag, len) = parse_header(&h)?;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok(Some((tag, payload)))
}

/// The `u32` at `at` of `p`.
pub fn u32_at(p: &[u8], at: usize) -> io::Result<u32> {
    p.get(at..at + 4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "a message cut short"))
}

/// The little-endian `u64` at byte `at` of `p`.
pub fn u64_at(p: &[u8], at: usize) -> io::Result<u64> {
    p.get(at..at + 8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "a message cut short"))
}

/// An [`OPEN`] payload split into the document's name and bytes.
pub fn split_open(p: &[u8]) -> io::Result<(String, &[u8])> {
    let n = u32_at(p, 0)? as usize;
    let name = p
        .get(4..4 + n)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "a name cut short"))?;
    Ok((String::from_utf8_lossy(name).into_owned(), &p[4 + n..]))
}

/// An [`ERR`] answer's payload.
pub fn error_payload(e: &PdfError) -> Vec<u8> {
    serde_json::to_vec(e).expect("PdfError serialises")
}

/// The [`PdfError`] of an [`ERR`] answer's payload.
pub fn parse_error(p: &[u8]) -> io::Result<PdfError> {
    serde_json::from_slice(p).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}
