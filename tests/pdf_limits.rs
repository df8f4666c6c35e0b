//! Issue 42 N1 and N4: hostile PDFs are read in a worker process with time and memory
//! limits. Two forms that draw each other (pdfium expands them while it loads the page,
//! without end) and a page of very many rectangles fail naming the file, the page and the
//! limit; `ocrctl ocr` goes on with the next input and exits 2; the server answers 400 and
//! serves the next request. Needs pdfium in .venv (`scripts/setup.sh --test`).

#[path = "common/mod.rs"]
mod common;

use common::pdfgen::pdf;
use common::server::{multipart, request, Server};
use ocrctl::documents::pdf::sandbox::{Exceeded, PdfLimits, Sandbox, Step};
use ocrctl::documents::pdf::{render_pdf, PdfDocument, PdfError};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Forms A and B that each draw the other twice: 2^depth copies, a 1.3 KB file.
fn recursive_forms() -> [(&'static str, &'static str); 2] {
    [
        ("A", "/B Do /B Do 0 0 1 1 re f"),
        ("B", "/A Do /A Do 0 0 1 1 re f"),
    ]
}

/// A page drawing form A (of [`recursive_forms`]).
fn recursion_page() -> (Vec<u8>, &'static str) {
    (b"/A Do".to_vec(), "")
}

/// A page of `n` filled rectangles, Flate-compressed (2 M: a 51 KB file that pdfium holds
/// in about 700 MB).
fn rectangles_page(n: usize) -> (Vec<u8>, &'static str) {
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    for _ in 0..n {
        z.write_all(b"0 0 1 1 re f\n").unwrap();
    }
    (z.finish().unwrap(), "/Filter /FlateDecode")
}

/// A plain page: one black square.
fn plain_page() -> (Vec<u8>, &'static str) {
    (b"0 g 100 100 200 200 re f".to_vec(), "")
}

/// A one-page PDF of `n` filled rectangles.
fn rect_pdf(n: usize) -> Vec<u8> {
    pdf(&[rectangles_page(n)], &[])
}

fn sandbox(seconds: u64, memory_mib: u64) -> Arc<Sandbox> {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_ocrctl"));
    let limits = PdfLimits {
        seconds,
        memory_mib,
    };
    Arc::new(Sandbox::with_exe(exe, None, limits))
}

fn fixture_pdf() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pdf/two_pages.pdf")
}

#[test]
fn sandboxed_renders_match_in_process_ones() {
    let bytes = std::fs::read(fixture_pdf()).unwrap();
    let t = Instant::now();
    let want = render_pdf(&bytes, "two_pages.pdf", None).unwrap();
    let in_process = t.elapsed();
    let sb = sandbox(60, 2048);
    let t = Instant::now();
    let mut doc = sb.open(bytes.clone(), "two_pages.pdf").unwrap();
    assert_eq!(doc.page_count(), 2);
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&doc.render_page(i).unwrap(), w, "page {}", i + 1);
    }
    let sandboxed = t.elapsed();
    // Full resolution (what figures are cropped from), in and out of process alike.
    let local = PdfDocument::open(bytes.clone(), "two_pages.pdf", None).unwrap();
    let full = local.render_page_full(1, 4_000_000).unwrap();
    assert!(full.width() * full.height() <= 4_000_000);
    assert!(
        full.width() > want[1].width(),
        "larger than the model's copy"
    );
    assert_eq!(doc.render_page_full(1, 4_000_000).unwrap(), full);
    let e = doc.render_page(2).unwrap_err();
    assert!(matches!(e, PdfError::Page { page: 3, .. }), "{e}");
    drop(doc);
    // The idle worker serves the next document.
    let t = Instant::now();
    let mut again = sb.open(bytes, "again.pdf").unwrap();
    assert_eq!(&again.render_page(1).unwrap(), &want[1]);
    eprintln!(
        "two pages: in process {in_process:?}, sandboxed {sandboxed:?} (new worker), \
         one page with an idle worker {:?}",
        t.elapsed()
    );
}

#[test]
fn forms_that_draw_each_other_fail_the_page_at_the_memory_limit() {
    let bomb = pdf(&[recursion_page(), plain_page()], &recursive_forms());
    assert!(bomb.len() < 2000, "{} bytes", bomb.len());
    let sb = sandbox(60, 256);
    let mut doc = sb.open(bomb, "bomb.pdf").unwrap();
    let e = doc.render_page(0).unwrap_err();
    assert!(
        matches!(
            e,
            PdfError::Limit {
                step: Step::Page(1),
                exceeded: Exceeded::Memory { mib: 256 },
                ..
            }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(msg.starts_with("bomb.pdf: page 1: "), "{msg}");
    assert!(msg.contains("memory limit of 256 MiB"), "{msg}");
    // The next page of the same document renders, in a fresh worker.
    let page2 = doc.render_page(1).unwrap();
    assert!(
        page2.pixels().any(|p| p.0 == [0, 0, 0]),
        "the square is drawn"
    );
}

#[test]
fn a_page_that_runs_on_fails_at_the_time_limit() {
    let bomb = pdf(&[recursion_page()], &recursive_forms());
    // Memory enough for ~1 minute of the growth: the 1 s limit comes first.
    let sb = sandbox(1, 16 << 10);
    let mut doc = sb.open(bomb, "slow.pdf").unwrap();
    let e = doc.render_page(0).unwrap_err();
    assert!(
        matches!(
            e,
            PdfError::Limit {
                step: Step::Page(1),
                exceeded: Exceeded::Time { seconds: 1 },
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("time limit of 1 s"), "{e}");
}

#[test]
fn millions_of_rectangles_fail_at_the_memory_limit() {
    let rects = rect_pdf(2_000_000);
    let sb = sandbox(60, 256);
    let mut doc = sb.open(rects.clone(), "rects.pdf").unwrap();
    let e = doc.render_page(0).unwrap_err();
    assert!(
        matches!(
            e,
            PdfError::Limit {
                exceeded: Exceeded::Memory { mib: 256 },
                ..
            }
        ),
        "{e:?}"
    );
    // The same page with a few rectangles is fine (the document is well-formed).
    let mut few = sb.open(rect_pdf(1000), "few.pdf").unwrap();
    few.render_page(0).unwrap();
}

/// `ocrctl ocr --out` with a hostile PDF first: it is named with its page and limit, the
/// files after it are read, and the exit code is 2.
#[test]
fn ocr_names_the_hostile_page_and_reads_the_next_files() {
    let d = tempfile::tempdir().unwrap();
    let bomb = d.path().join("a-bomb.pdf");
    std::fs::write(&bomb, pdf(&[recursion_page()], &recursive_forms())).unwrap();
    let rects = d.path().join("b-rects.pdf");
    std::fs::write(&rects, rect_pdf(2_000_000)).unwrap();
    std::fs::copy(fixture_pdf(), d.path().join("c-scan.pdf")).unwrap();
    let out = d.path().join("out");
    let model = common::exported();
    let o = common::ocrctl(&[
        "ocr",
        "--model",
        model.to_str().unwrap(),
        "--precision",
        "fp32",
        "--max-tokens",
        "4",
        "--accept-length",
        "--pdf-page-memory",
        "256",
        "--out",
        out.to_str().unwrap(),
        d.path().to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    for name in ["a-bomb.pdf", "b-rects.pdf"] {
        let line = err
            .lines()
            .find(|l| l.contains(name) && l.contains("page 1"))
            .unwrap_or_else(|| panic!("{name} not named: {err}"));
        assert!(line.contains("memory limit of 256 MiB"), "{line}");
    }
    let md = std::fs::read_to_string(out.join("c-scan.md")).unwrap();
    assert!(md.contains("<!-- page 2 -->"), "{md}");
}

/// `/v1/ocr` with the hostile PDF: 400 naming the page and the limit; the server then reads
/// a real PDF.
#[test]
fn the_server_refuses_the_hostile_page_and_serves_the_next_request() {
    let d = tempfile::tempdir().unwrap();
    let profile = common::server::test_profile(d.path(), 2, 8, 8);
    let s = Server::start(
        common::exported(),
        &[
            "--profile",
            profile.to_str().unwrap(),
            "--pdf-page-memory",
            "256",
        ],
        true,
    );
    let post = |name: &str, bytes: &[u8]| {
        let fields = [("max_tokens", "4"), ("accept_length", "true")];
        let (ct, mp) = multipart(&fields, Some((name, bytes)));
        request(&s.addr, "POST", "/v1/ocr", &[("Content-Type", &ct)], &mp).unwrap()
    };
    let bomb = pdf(&[recursion_page()], &recursive_forms());
    let r = post("bomb.pdf", &bomb);
    assert_eq!(r.status, 400, "{}", r.text());
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("bomb.pdf: page 1"), "{msg}");
    assert!(msg.contains("memory limit of 256 MiB"), "{msg}");
    assert_eq!(s.get("/health").unwrap().status, 200);
    let r = post("scan.pdf", &std::fs::read(fixture_pdf()).unwrap());
    assert_eq!(r.status, 200, "{}", r.text());
}
