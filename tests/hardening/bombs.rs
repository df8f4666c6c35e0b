//! Small images that decode to far more than their size says (issue 42: N4): compressed PNG
//! metadata.

use super::common::server::{multipart, request, Server};
use super::images::peak_rss_kib;
use super::{common, profile};
use std::io::Write;

/// zlib of `n` zero bytes.
fn zlib_zeros(n: usize) -> Vec<u8> {
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    let block = vec![0u8; 1 << 20];
    for _ in 0..n / block.len() {
        z.write_all(&block).unwrap();
    }
    z.finish().unwrap()
}

/// A PNG chunk: length, type, data, CRC.
fn chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut crc = flate2::Crc::new();
    crc.update(kind);
    crc.update(data);
    let mut c = (data.len() as u32).to_be_bytes().to_vec();
    c.extend_from_slice(kind);
    c.extend_from_slice(data);
    c.extend_from_slice(&crc.sum().to_be_bytes());
    c
}

/// A 64×64 grey PNG with an `iCCP` chunk that inflates to `icc_bytes`.
fn png_with_icc(icc_bytes: usize) -> Vec<u8> {
    let mut png = Vec::new();
    image::RgbImage::from_pixel(64, 64, image::Rgb([200, 200, 200]))
        .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
        .unwrap();
    // After the signature (8 bytes) and IHDR (25).
    let mut icc = b"bomb\0\0".to_vec();
    icc.extend_from_slice(&zlib_zeros(icc_bytes));
    let mut out = png[..33].to_vec();
    out.extend_from_slice(&chunk(b"iCCP", &icc));
    out.extend_from_slice(&png[33..]);
    out
}

fn ocr_upload(s: &Server, name: &str, bytes: &[u8]) -> common::server::Resp {
    // A two-token preview: a page cut there is ok here (issue 38's accept_length).
    let fields = [("max_tokens", "2"), ("accept_length", "true")];
    let (ct, mp) = multipart(&fields, Some((name, bytes)));
    request(&s.addr, "POST", "/v1/ocr", &[("Content-Type", &ct)], &mp).unwrap()
}

/// N4: a 1 MB PNG whose `iCCP` chunk inflates to 1 GiB added 1 GB to the server (the chunk
/// was inflated when the header was read to plan the decode, and again when decoding). The
/// compressed metadata chunks are now left out before the `png` crate sees them: a 256 MiB
/// profile (a 256 KB upload) is read as the 64×64 image it is, and memory stays flat.
#[test]
fn a_png_whose_icc_profile_inflates_to_256_mib_costs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let p = profile(dir.path(), "");
    let s = Server::start(
        common::exported(),
        &["--profile", p.to_str().unwrap()],
        true,
    );
    let png = png_with_icc(256 << 20);
    let before = peak_rss_kib(s.child.id());
    let r = ocr_upload(&s, "icc.png", &png);
    assert_eq!(r.status, 200, "{}", r.text());
    let grown_mib = (peak_rss_kib(s.child.id()) - before) / 1024;
    eprintln!("iCCP bomb: peak RSS grew by {grown_mib} MiB");
    assert!(grown_mib < 64, "peak RSS grew by {grown_mib} MiB");
}
