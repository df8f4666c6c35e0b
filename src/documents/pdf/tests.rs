//! Unit tests of [`crate::documents::pdf`] on the committed fixtures (`tests/fixtures/pdf/`, made by
//! `scripts/make_pdf_fixtures.py`) and on small PDFs written here. pdfium must be found
//! (`scripts/setup.sh`): these tests fail, they do not skip, when it is missing.

use super::*;

fn fixture(name: &str) -> (Vec<u8>, String) {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pdf")
        .join(name);
    (std::fs::read(&p).unwrap(), p.display().to_string())
}

fn source_image(name: &str) -> RgbImage {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tiny-lightonocr/images")
        .join(name);
    image::open(p).unwrap().to_rgb8()
}

/// A PDF of `n` blank pages of `w × h` points, with a correct cross-reference table.
fn blank_pdf(n: usize, w: f32, h: f32) -> Vec<u8> {
    let mut objs = vec![
        "<< /Type /Catalog /Pages 2 0 R >>".to_string(),
        format!(
            "<< /Type /Pages /Kids [{}] /Count {n} >>",
            (0..n)
                .map(|i| format!("{} 0 R", i + 3))
                .collect::<Vec<_>>()
                .join(" ")
        ),
    ];
    for _ in 0..n {
        objs.push(format!(
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 {w} {h}] >>"
        ));
    }
    let mut out = b"%PDF-1.7\n".to_vec();
    let mut offsets = Vec::new();
    for (i, o) in objs.iter().enumerate() {
        offsets.push(out.len());
        out.extend_from_slice(format!("{} 0 obj\n{o}\nendobj\n", i + 1).as_bytes());
    }
    let xref = out.len();
    out.extend_from_slice(format!("xref\n0 {}\n0000000000 65535 f \n", objs.len() + 1).as_bytes());
    for off in offsets {
        out.extend_from_slice(format!("{off:010} 00000 n \n").as_bytes());
    }
    out.extend_from_slice(
        format!(
            "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
            objs.len() + 1
        )
        .as_bytes(),
    );
    out
}

/// Mean absolute difference per channel value after averaging `k × k` blocks (pdfium
/// smooths images it draws, so single pixels differ by a few levels), over the blocks whose
/// top-left pixel satisfies `keep(x, y)`.
fn block_diff(a: &RgbImage, b: &RgbImage, k: u32, keep: impl Fn(u32, u32) -> bool) -> f64 {
    assert_eq!(a.dimensions(), b.dimensions());
    let (w, h) = a.dimensions();
    let (mut sum, mut n) = (0f64, 0u32);
    for by in (0..h - k + 1).step_by(k as usize) {
        for bx in (0..w - k + 1).step_by(k as usize) {
            if !keep(bx, by) {
                continue;
            }
            for c in 0..3 {
                let mean = |img: &RgbImage| {
                    let mut t = 0u32;
                    for y in by..by + k {
                        for x in bx..bx + k {
                            t += u32::from(img.get_pixel(x, y).0[c]);
                        }
                    }
                    f64::from(t) / f64::from(k * k)
                };
                sum += (mean(a) - mean(b)).abs();
                n += 1;
            }
        }
    }
    sum / f64::from(n)
}

#[test]
fn render_sizes_follow_200_dpi_capped_at_1540() {
    // 72 pt = 1 inch = 200 px.
    assert_eq!(render_size(72.0, 36.0), Some((200, 100)));
    // US Letter: 1700 x 2200 at 200 DPI, capped: 1190 x 1540.
    assert_eq!(render_size(612.0, 792.0), Some((1190, 1540)));
    // A4 (595 x 842 pt): 1653 x 2339 at 200 DPI -> 1088 x 1540.
    assert_eq!(render_size(595.0, 842.0), Some((1088, 1540)));
    // Enormous and degenerate pages stay within one 1540 x 1540 bitmap.
    assert_eq!(render_size(1e30, 1e30), Some((1540, 1540)));
    assert_eq!(render_size(f32::MAX, 1.0), Some((1540, 1)));
    assert_eq!(render_size(1e-6, 1e-6), Some((1, 1)));
    for (w, h) in [
        (0.0, 10.0),
        (10.0, -1.0),
        (f32::NAN, 10.0),
        (10.0, f32::INFINITY),
    ] {
        assert_eq!(render_size(w, h), None, "{w} x {h}");
    }
}

#[test]
fn pdf_magic_is_recognised() {
    assert!(is_pdf(b"%PDF-1.7\n..."));
    assert!(is_pdf(b"\xef\xbb\xbf junk then %PDF-1.4"));
    assert!(!is_pdf(b"\x89PNG\r\n\x1a\n"));
    assert!(!is_pdf(b""));
    let mut late = vec![b' '; 1024];
    late.extend_from_slice(b"%PDF-1.4");
    assert!(!is_pdf(&late));
}

#[test]
fn fixture_pages_have_the_expected_size_and_pixels() {
    let (bytes, name) = fixture("two_pages.pdf");
    let doc = PdfDocument::open(bytes.as_slice(), &name, None).unwrap();
    assert_eq!(doc.page_count(), 2);
    let pages = render_pdf(&bytes, &name, None).unwrap();
    assert_eq!(pages.len(), 2);

    // Page 1: aligned.png placed at 200 DPI renders back at its own size and pixels, except
    // the 8 x 8 px corner under the annotation, which is blue only if annotations are drawn.
    let src = source_image("aligned.png");
    assert_eq!(pages[0].dimensions(), (224, 56));
    let outside = |x: u32, y: u32| x >= 8 || y >= 8;
    let d = block_diff(&pages[0], &src, 4, outside);
    let white = RgbImage::from_pixel(224, 56, image::Rgb([255; 3]));
    let blank = block_diff(&white, &src, 4, outside);
    // Measured: 2.7 (a blank page: 13.4).
    assert!(
        d < 4.0 && blank > 8.0,
        "page 1 differs from aligned.png by {d} (blank: {blank})"
    );
    for (x, y) in [(1, 1), (4, 4), (6, 6)] {
        let [r, g, b] = pages[0].get_pixel(x, y).0;
        assert!(
            b > 200 && r < 60 && g < 60,
            "annotation pixel ({x},{y}) = {r},{g},{b}"
        );
    }

    // Page 2: wide_downscale.png (1800 x 96 px at 200 DPI) is capped to 1540 px wide; it
    // matches the source scaled to that size.
    assert_eq!(pages[1].dimensions(), (1540, 82));
    let want = image::imageops::resize(
        &source_image("wide_downscale.png"),
        1540,
        82,
        image::imageops::FilterType::Triangle,
    );
    // Measured: 0.02 (a blank page: 6.1).
    let d = block_diff(&pages[1], &want, 4, |_, _| true);
    let white = RgbImage::from_pixel(1540, 82, image::Rgb([255; 3]));
    let blank = block_diff(&white, &want, 4, |_, _| true);
    assert!(
        d < 1.0 && blank > 4.0,
        "page 2 differs from the scaled source by {d} (blank: {blank})"
    );
}

#[test]
fn huge_pages_are_rendered_within_the_cap() {
    // 14400 pt (200 inches, PDF's largest page) would be 40000 px at 200 DPI.
    let bytes = blank_pdf(1, 14400.0, 7200.0);
    let pages = render_pdf(&bytes, "huge.pdf", None).unwrap();
    assert_eq!(pages[0].dimensions(), (1540, 770));
    assert!(
        pages[0].pixels().all(|p| p.0 == [255, 255, 255]),
        "white background"
    );
}

#[test]
fn each_error_names_the_document_and_the_cause() {
    let (bytes, name) = fixture("encrypted.pdf");
    let e = render_pdf(&bytes, &name, None).unwrap_err();
    assert!(matches!(e, PdfError::Encrypted { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.starts_with(&name) && msg.contains("password-protected"),
        "{msg}"
    );

    let (bytes, name) = fixture("truncated.pdf");
    let e = render_pdf(&bytes, &name, None).unwrap_err();
    assert!(matches!(e, PdfError::Broken { .. }), "{e}");
    assert!(e.to_string().starts_with(&name), "{e}");
    assert!(e.to_string().contains("damaged"), "{e}");

    let e = render_pdf(b"this is not a PDF at all", "notes.pdf", None).unwrap_err();
    assert!(matches!(e, PdfError::Broken { .. }), "{e}");
    assert!(e.to_string().starts_with("notes.pdf:"), "{e}");

    let e = render_pdf(&blank_pdf(0, 100.0, 100.0), "empty.pdf", None).unwrap_err();
    assert!(matches!(e, PdfError::NoPages { .. }), "{e}");
    assert_eq!(e.to_string(), "empty.pdf: the PDF has no pages");

    let e = render_pdf(&blank_pdf(PDF_MAX_PAGES + 1, 10.0, 10.0), "long.pdf", None).unwrap_err();
    assert!(
        matches!(e, PdfError::TooManyPages { pages, max, .. } if pages == 501 && max == 500),
        "{e}"
    );
    assert!(e.to_string().starts_with("long.pdf:"), "{e}");
    let doc = PdfDocument::open(blank_pdf(PDF_MAX_PAGES, 10.0, 10.0), "max.pdf", None).unwrap();
    assert_eq!(doc.page_count(), PDF_MAX_PAGES);

    let e = doc.render_page(PDF_MAX_PAGES).unwrap_err();
    assert!(matches!(e, PdfError::Page { page: 501, .. }), "{e}");
    assert!(e.to_string().starts_with("max.pdf: page 501:"), "{e}");
}

#[test]
fn a_missing_library_names_the_path_and_the_fix() {
    let e = find_library(Some(Path::new("/nowhere/libpdfium.so")), "scan.pdf").unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with("scan.pdf:")
            && msg.contains("/nowhere/libpdfium.so")
            && msg.contains("--pdfium-lib")
            && msg.contains("scripts/setup.sh"),
        "{msg}"
    );
    let e = PdfError::LibraryNotFound {
        name: "scan.pdf".into(),
        searched: "/a\n  /b".into(),
    };
    let msg = e.to_string();
    assert!(
        msg.contains("scripts/setup.sh") && msg.contains(PYPDFIUM2_VERSION) && msg.contains("/b"),
        "{msg}"
    );
    // The one in .venv (what `scripts/setup.sh` makes) is found without help.
    let found = find_library(None, "x.pdf").unwrap();
    assert!(
        found.ends_with("pypdfium2_raw/libpdfium.so"),
        "{}",
        found.display()
    );
}

#[test]
fn concurrent_renders_are_serialised_and_agree() {
    let (bytes, name) = fixture("two_pages.pdf");
    let want = render_pdf(&bytes, &name, None).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| render_pdf(&bytes, &name, None).unwrap()))
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), want);
        }
    });
}

/// A one-page PDF of `w × h` points with `/Rotate rotate` whose content stream is `content`.
fn drawn_pdf(w: f32, h: f32, rotate: u32, content: &str) -> Vec<u8> {
    let objs = [
        "<< /Type /Catalog /Pages 2 0 R >>".to_string(),
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>".to_string(),
        format!(
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 {w} {h}] /Rotate {rotate} \
             /Contents 4 0 R >>"
        ),
        format!(
            "<< /Length {} >>\nstream\n{content}\nendstream",
            content.len()
        ),
    ];
    let mut out = b"%PDF-1.7\n".to_vec();
    let mut offsets = Vec::new();
    for (i, o) in objs.iter().enumerate() {
        offsets.push(out.len());
        out.extend_from_slice(format!("{} 0 obj\n{o}\nendobj\n", i + 1).as_bytes());
    }
    let xref = out.len();
    out.extend_from_slice(format!("xref\n0 {}\n0000000000 65535 f \n", objs.len() + 1).as_bytes());
    for off in offsets {
        out.extend_from_slice(format!("{off:010} 00000 n \n").as_bytes());
    }
    out.extend_from_slice(
        format!(
            "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
            objs.len() + 1
        )
        .as_bytes(),
    );
    out
}

/// A page stored sideways with `/Rotate` (as scanners write them) renders like its upright
/// twin: the same size (pdfium reports the rotated page's size) and the same pixels.
#[test]
fn rotated_pages_render_like_their_upright_twin() {
    // 144 x 72 pt = 400 x 200 px; three rectangles that no flip or turn maps onto each other.
    let (w, h) = (144.0, 72.0);
    let shapes = "1 0 0 rg 9 9 36 18 re f 0 0 1 rg 90 36 27 27 re f 0 0.6 0 rg 54 54 9 9 re f";
    let upright = render_pdf(&drawn_pdf(w, h, 0, shapes), "upright.pdf", None).unwrap();
    let upright = &upright[0];
    assert_eq!(upright.dimensions(), (400, 200));
    // The page's content is stored turned the other way, so that /Rotate turns it upright:
    // each matrix maps upright coordinates to those of the stored page.
    for (rotate, stored, matrix) in [
        (90, (h, w), format!("0 1 -1 0 {h} 0")),
        (180, (w, h), format!("-1 0 0 -1 {w} {h}")),
        (270, (h, w), format!("0 -1 1 0 0 {w}")),
    ] {
        let content = format!("q {matrix} cm {shapes} Q");
        let pdf = drawn_pdf(stored.0, stored.1, rotate, &content);
        let name = format!("rotate-{rotate}.pdf");
        let page = &render_pdf(&pdf, &name, None).unwrap()[0];
        assert_eq!(page.dimensions(), upright.dimensions(), "/Rotate {rotate}");
        // Edges are anti-aliased from other sub-pixel positions: a few levels on a few pixels.
        let (mut sum, mut off) = (0u64, 0usize);
        for (a, b) in page.pixels().zip(upright.pixels()) {
            for c in 0..3 {
                let d = a.0[c].abs_diff(b.0[c]);
                sum += u64::from(d);
                off += usize::from(d > 64);
            }
        }
        let mean = sum as f64 / (400.0 * 200.0 * 3.0);
        assert!(
            mean < 0.5 && off < 200,
            "/Rotate {rotate}: mean difference {mean}, {off} values off by more than 64"
        );
        // And the twin is not trivially equal: the red rectangle is where it should be.
        assert_eq!(page.get_pixel(50, 170).0, [255, 0, 0], "/Rotate {rotate}");
    }
}

#[test]
fn full_resolution_renders_skip_the_side_cap_within_a_pixel_budget() {
    // US Letter at 200 DPI: 1700 x 2200 (the model's copy is 1190 x 1540).
    assert_eq!(full_render_size(612.0, 792.0, 1 << 30), Some((1700, 2200)));
    let (w, h) = full_render_size(612.0, 792.0, 1_000_000).unwrap();
    assert!(
        u64::from(w) * u64::from(h) <= 1_000_000 && w >= 870 && h >= 1130,
        "{w} x {h}"
    );
    assert_eq!(full_render_size(0.0, 10.0, 100), None);
    let bytes = blank_pdf(1, 612.0, 792.0);
    let doc = PdfDocument::open(bytes.as_slice(), "letter.pdf", None).unwrap();
    assert_eq!(doc.render_page(0).unwrap().dimensions(), (1190, 1540));
    assert_eq!(
        doc.render_page_full(0, 1 << 30).unwrap().dimensions(),
        (1700, 2200)
    );
}
