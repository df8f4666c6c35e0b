//! `ocrctl ocr` on PDFs, folders and glob patterns: a PDF page reads exactly like the image
//! pdfium renders for it, bad files are named while the rest are written, pages are joined
//! with the documented marker, `--resume` skips finished documents. Needs pdfium in .venv
//! (`scripts/setup.sh`); without it these tests fail.

mod common;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

const MAX_TOKENS: &str = "16";

fn pdf_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pdf")
        .join(name)
}

/// `ocrctl ocr --model <fixture> --max-tokens 16 <args>`.
fn ocr(args: &[&str]) -> std::process::Output {
    let model = exported();
    let mut all = vec![
        "ocr",
        "--accept-length",
        "--temperature",
        "0",
        "--model",
        model.to_str().unwrap(),
        "--max-tokens",
        MAX_TOKENS,
    ];
    all.extend_from_slice(args);
    ocrctl(&all)
}

fn json_lines(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The texts ocrctl reads from the PNG images of the PDF's pages, rendered here through the
/// library API.
fn texts_of_rendered_pages(pdf: &Path) -> Vec<String> {
    let d = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(pdf).unwrap();
    let pages =
        ocrctl::documents::pdf::render_pdf(&bytes, "scan.pdf", None).expect("pdfium renders");
    assert_eq!(pages.len(), 2);
    for (i, p) in pages.iter().enumerate() {
        p.save(d.path().join(format!("page{}.png", i + 1))).unwrap();
    }
    let o = ocr(&["--json", d.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = json_lines(&o.stdout);
    assert_eq!(v.len(), 2);
    v.iter()
        .map(|x| x["text"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_folder_of_pdfs_and_images_reads_pages_like_their_renders_and_names_bad_files() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("in");
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(pdf_fixture("two_pages.pdf"), dir.join("scan.pdf")).unwrap();
    std::fs::copy(pdf_fixture("encrypted.pdf"), dir.join("locked.pdf")).unwrap();
    std::fs::copy(pdf_fixture("truncated.pdf"), dir.join("cut.pdf")).unwrap();
    std::fs::copy(
        fixture().join("images/aligned.png"),
        dir.join("aligned.png"),
    )
    .unwrap();
    std::fs::write(dir.join("broken.png"), b"\x89PNG\r\n\x1a\nnot really").unwrap();

    let want = texts_of_rendered_pages(&dir.join("scan.pdf"));
    assert!(
        want.iter().all(|t| !t.is_empty()) && want[0] != want[1],
        "the two pages read as different, non-empty texts: {want:?}"
    );

    // --out: one markdown file per document, bad files named, exit code non-zero.
    let md = d.path().join("md");
    let o = ocr(&[
        "--batch-size",
        "2",
        "--out",
        md.to_str().unwrap(),
        dir.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "failures give a non-zero exit: {err}");
    for (file, cause) in [
        ("locked.pdf", "encrypted"),
        ("cut.pdf", "damaged"),
        ("broken.png", "cannot decode"),
    ] {
        let path = dir.join(file).display().to_string();
        assert!(
            err.lines()
                .any(|l| l.starts_with("error: ") && l.contains(&path) && l.contains(cause)),
            "{file}: {cause}\n{err}"
        );
    }
    let mut written: Vec<String> = std::fs::read_dir(&md)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    written.sort();
    // The failed inputs are listed beside the documents (issue 41.5), one JSON row each.
    assert_eq!(written, ["aligned.md", "failures.jsonl", "scan.md"]);
    let failures = std::fs::read_to_string(md.join("failures.jsonl")).unwrap();
    for file in ["locked.pdf", "cut.pdf", "broken.png"] {
        assert!(failures.contains(file), "{file}: {failures}");
    }
    assert_eq!(failures.lines().count(), 3, "{failures}");
    assert_eq!(o.status.code(), Some(2), "some inputs failed: {err}");
    let scan = std::fs::read_to_string(md.join("scan.md")).unwrap();
    assert_eq!(
        scan,
        format!("{}\n\n<!-- page 2 -->\n\n{}\n", want[0], want[1])
    );

    // --json: one object per page, numbered from 1, same texts.
    let o = ocr(&["--json", dir.join("scan.pdf").to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = json_lines(&o.stdout);
    assert_eq!(v.len(), 2);
    for (i, x) in v.iter().enumerate() {
        assert_eq!(x["page"], i + 1);
        assert!(x["file"].as_str().unwrap().ends_with("scan.pdf"), "{x}");
        assert_eq!(x["text"].as_str().unwrap(), want[i]);
    }

    // Plain text: the pages in order with the same marker.
    let o = ocr(&[dir.join("scan.pdf").to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), scan);

    // --resume skips documents whose markdown exists and redoes the rest.
    std::fs::write(md.join("scan.md"), "kept").unwrap();
    std::fs::remove_file(md.join("aligned.md")).unwrap();
    let o = ocr(&[
        "--out",
        md.to_str().unwrap(),
        "--resume",
        dir.join("scan.pdf").to_str().unwrap(),
        dir.join("aligned.png").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read_to_string(md.join("scan.md")).unwrap(), "kept");
    assert!(
        md.join("aligned.md").exists(),
        "the missing document was redone"
    );
}

#[test]
fn glob_patterns_select_files_and_an_empty_match_is_an_error() {
    let d = tempfile::tempdir().unwrap();
    std::fs::copy(pdf_fixture("two_pages.pdf"), d.path().join("a.pdf")).unwrap();
    std::fs::copy(pdf_fixture("two_pages.pdf"), d.path().join("b.PDF")).unwrap();
    std::fs::copy(fixture().join("images/aligned.png"), d.path().join("c.png")).unwrap();
    // Passed unexpanded (no shell), as a quoted pattern would be.
    let pattern = d.path().join("[ab].*").display().to_string();
    let o = ocr(&["--json", &pattern]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got: Vec<(String, u64)> = json_lines(&o.stdout)
        .iter()
        .map(|x| {
            let f = Path::new(x["file"].as_str().unwrap());
            (
                f.file_name().unwrap().to_string_lossy().into_owned(),
                x["page"].as_u64().unwrap(),
            )
        })
        .collect();
    let want =
        [("a.pdf", 1), ("a.pdf", 2), ("b.PDF", 1), ("b.PDF", 2)].map(|(f, p)| (f.to_string(), p));
    assert_eq!(got, want);

    let none = d.path().join("*.tiff").display().to_string();
    let png = d.path().join("c.png");
    let o = ocr(&["--json", &none, png.to_str().unwrap()]);
    assert!(!o.status.success(), "an empty pattern fails the run");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&none) && err.contains("no image or PDF file"),
        "{err}"
    );
    assert_eq!(json_lines(&o.stdout).len(), 1, "the other input still ran");
}

/// `--shard K/N` over a folder: the shards' outputs partition the folder's files exactly, and a
/// copy of the folder under another name, listed in another order, gives the same shards.
#[test]
fn shards_partition_the_inputs() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (d.path().join("batch-a"), d.path().join("renamed"));
    for dir in [&a, &b] {
        std::fs::create_dir(dir).unwrap();
        for e in std::fs::read_dir(fixture().join("images")).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
        }
    }
    let m = exported().to_str().unwrap().to_string();
    let files_of = |dir: &Path, shard: &str| -> Vec<String> {
        let out = ocrctl_ok(&[
            "ocr",
            "--accept-length",
            "--temperature",
            "0",
            "--model",
            &m,
            "--max-tokens",
            "1",
            "--json",
            "--shard",
            shard,
            dir.to_str().unwrap(),
        ]);
        let mut v: Vec<String> = out
            .lines()
            .map(|l| {
                let j: serde_json::Value = serde_json::from_str(l).unwrap();
                let f = j["file"].as_str().unwrap().to_string();
                Path::new(&f)
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        v.sort();
        v
    };
    let mut all = Vec::new();
    for k in 0..3 {
        let shard = format!("{k}/3");
        let here = files_of(&a, &shard);
        assert_eq!(here, files_of(&b, &shard), "shard {shard}");
        all.extend(here);
    }
    all.sort();
    let mut want: Vec<String> = std::fs::read_dir(&a)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    want.sort();
    assert_eq!(all, want);
}

/// `ocr` starts from the model's generation_config.json like `serve` (issue 11.2): the
/// fixture's says temperature 0.2, top-p 0.9; flags override single fields.
#[test]
fn ocr_samples_with_the_models_generation_config_unless_told_otherwise() {
    let model = exported();
    let img = fixture().join("images/aligned.png");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "ocr",
            "--accept-length",
            "--model",
            model.to_str().unwrap(),
            "--max-tokens",
            "4",
        ];
        args.extend_from_slice(extra);
        args.push(img.to_str().unwrap());
        let out = ocrctl(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = run(&[]);
    assert!(
        e.contains("generation_config.json (temperature 0.2, top-p 0.9)"),
        "{e}"
    );
    assert!(!run(&["--temperature", "0"]).contains("generation_config"));
    // Bad values are refused by name whatever their source.
    let out = ocrctl(&[
        "ocr",
        "--accept-length",
        "--model",
        model.to_str().unwrap(),
        "--top-p",
        "0",
        img.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--top-p"));
}

/// `--log-format json` (issue 11.5): the library's log lines are JSON objects with level,
/// target and message; `RUST_LOG` sets the level.
#[test]
fn log_lines_can_be_json_and_rust_log_sets_the_level() {
    let model = exported();
    let img = fixture().join("images/aligned.png");
    let args = [
        "--log-format",
        "json",
        "ocr",
        "--accept-length",
        "--model",
        model.to_str().unwrap(),
        "--temperature",
        "0",
        "--max-tokens",
        "2",
        img.to_str().unwrap(),
    ];
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ocrctl"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let logs: Vec<Value> = err
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let verified = logs
        .iter()
        .find(|v| {
            v["fields"]["message"]
                .as_str()
                .unwrap_or("")
                .starts_with("verified")
        })
        .unwrap_or_else(|| panic!("no verified line in {err}"));
    assert_eq!(verified["level"], "INFO");
    assert!(verified["target"].as_str().unwrap().starts_with("ocrctl"));
    // RUST_LOG=warn drops the info lines.
    let quiet = std::process::Command::new(env!("CARGO_BIN_EXE_ocrctl"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&quiet.stderr).contains("verified"));
}

/// Page outcomes (issue 38.1) and exit codes (issue 41.5): a page cut at --max-tokens is
/// retried, then failed (exit 2, JSON status, no .md, failures.jsonl); --keep-partial marks
/// it; a page whose end-of-sequence only a sampled retry reaches is `retried`.
#[test]
fn cut_pages_are_retried_then_failed_and_never_written_as_complete() {
    let model = exported();
    let img = fixture().join("images/aligned.png");
    let base = [
        "ocr",
        "--model",
        model.to_str().unwrap(),
        "--temperature",
        "0",
        "--max-tokens",
        "4",
    ];
    let run = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        args.push(img.to_str().unwrap());
        ocrctl(&args)
    };
    // The fixture needs 8 tokens for this page: 4 is a cut, three times.
    let o = run(&["--json"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v = &json_lines(&o.stdout)[0];
    assert_eq!(v["status"], "failed");
    assert_eq!(v["reason"], "length");
    assert_eq!(v["finish_reason"], "length");
    assert_eq!(v["attempts"], 3);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("1 failed (length 1)"), "{err}");
    // --retries 0: one attempt; --accept-length: ok at length, exit 0.
    assert_eq!(
        json_lines(&run(&["--json", "--retries", "0"]).stdout)[0]["attempts"],
        1
    );
    let o = run(&["--json", "--accept-length"]);
    assert!(o.status.success());
    assert_eq!(json_lines(&o.stdout)[0]["status"], "ok");

    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("md");
    let o = run(&["--out", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        !out.join("aligned.md").exists(),
        "a cut page is not written"
    );
    let f: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("failures.jsonl")).unwrap())
            .unwrap();
    assert!(f["file"].as_str().unwrap().ends_with("aligned.png"), "{f}");
    assert_eq!(f["pages"][0]["reason"], "length");
    assert_eq!(f["written"], false);
    let o = run(&["--out", out.to_str().unwrap(), "--keep-partial"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        std::fs::read_to_string(out.join("aligned.md")).unwrap(),
        "<!-- page 1 failed: length -->\n"
    );
    // --resume redoes a partial document; with --accept-length it completes.
    let o = run(&[
        "--out",
        out.to_str().unwrap(),
        "--resume",
        "--accept-length",
    ]);
    assert!(o.status.success());
    assert_eq!(
        std::fs::read_to_string(out.join("aligned.md")).unwrap(),
        "5930\n"
    );
    assert!(
        !out.join("failures.jsonl").exists(),
        "a clean rerun clears it"
    );

    // End of sequence biased to just below the greedy choice: greedy never takes it, the
    // first retry (temperature 0.5, seed 1) does.
    let o = run(&["--json", "--seed", "1", "--logit-bias", "322=13"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = &json_lines(&o.stdout)[0];
    assert_eq!(
        (&v["status"], &v["attempts"]),
        (&"retried".into(), &2.into()),
        "{v}"
    );
    assert_eq!(v["finish_reason"], "stop");
}

/// `--pages`: only the pages chosen are read, numbered as in the file; a page past the end
/// fails that document by name and page count, while the others still run.
#[test]
fn page_ranges_read_only_the_pages_chosen() {
    let d = tempfile::tempdir().unwrap();
    let scan = d.path().join("scan.pdf");
    std::fs::copy(pdf_fixture("two_pages.pdf"), &scan).unwrap();
    let scan = scan.to_str().unwrap();
    let all = json_lines(&ocr(&["--json", scan]).stdout);
    assert_eq!(all.len(), 2);

    let o = ocr(&["--json", "--pages", "2-", scan]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = json_lines(&o.stdout);
    assert_eq!(v.len(), 1);
    assert_eq!(v[0]["page"], 2);
    assert_eq!(v[0]["text"], all[1]["text"]);

    // --out: the document holds the chosen pages only, in file order, each once.
    let md = d.path().join("md");
    let o = ocr(&["--out", md.to_str().unwrap(), "--pages", "2,1-2", scan]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(md.join("scan.md")).unwrap();
    let (p1, p2) = (
        all[0]["text"].as_str().unwrap(),
        all[1]["text"].as_str().unwrap(),
    );
    assert_eq!(text, format!("{p1}\n\n<!-- page 2 -->\n\n{p2}\n"));

    // A page past the end: that document fails, named with its page count; an image still runs.
    let png = fixture().join("images/aligned.png");
    let o = ocr(&["--json", "--pages", "1,3", scan, png.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!(
            "error: {scan}: pages 1,3: page 3 is past the end (the document has 2 pages)"
        )),
        "{err}"
    );
    assert_eq!(o.status.code(), Some(2), "some inputs failed");
    let rows = json_lines(&o.stdout);
    let (failed, read): (Vec<_>, Vec<_>) = rows.iter().partition(|r| r["status"] == "failed");
    assert_eq!(read.len(), 1, "the image was read: {rows:?}");
    assert!(read[0]["file"].as_str().unwrap().ends_with("aligned.png"));
    assert_eq!(failed.len(), 1, "the PDF has its failure row: {rows:?}");
    assert!(failed[0]["file"].as_str().unwrap().ends_with("scan.pdf"));

    // Page 0 and reversed ranges are refused before anything runs.
    for (bad, why) in [("0-2", "numbered from 1"), ("2-1", "reversed")] {
        let err = ocrctl_err(&["ocr", "--model", "m", "--pages", bad, scan]);
        assert!(err.contains("--pages") && err.contains(why), "{bad}: {err}");
    }
}

/// A one-page PDF of `w × h` points whose content stream is `content` (xref offsets exact).
fn drawn_pdf(w: f32, h: f32, content: &str) -> Vec<u8> {
    let objs = [
        "<< /Type /Catalog /Pages 2 0 R >>".to_string(),
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>".to_string(),
        format!("<< /Type /Page /Parent 2 0 R /MediaBox [0 0 {w} {h}] /Contents 4 0 R >>"),
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

/// What `--figures` runs on a page whose text holds a box (the fixture model never writes
/// one): the page loaded at full resolution as the CLI loads it ([`PageLoader::load_full`]),
/// cropped by [`crop_figures`]. A synthetic page with a drawn rectangle, as a PDF (rendered
/// at 200 DPI, not the model's 1540-px copy) and as a PNG, gives the rectangle pixel-exact.
#[test]
fn boxed_figures_are_cropped_pixel_exact_from_the_full_resolution_page() {
    use ocrctl::documents::inputs::{Document, PageLoader};
    use ocrctl::output::figures::crop_figures;
    let d = tempfile::tempdir().unwrap();
    // 720 × 540 pt = 2000 × 1500 px; the rectangle is x 180..432 pt, y 108..432 pt from the
    // top: pixels x 500..1200, y 300..1200, i.e. 250,200,600,800 in thousandths.
    let pdf = d.path().join("drawn.pdf");
    std::fs::write(
        &pdf,
        drawn_pdf(720.0, 540.0, "0 0 1 rg 180 108 252 324 re f"),
    )
    .unwrap();
    let text = "Figure 1 shows it.\n\n![image](image_1.png)250,200,600,800\n\nThe end.";
    let mut loader = PageLoader::new(None, 100_000_000);
    let doc = Document::open(&pdf, None).unwrap();
    assert_eq!(loader.load(&doc, 0).unwrap().dimensions(), (1540, 1155));
    let page = loader.load_full(&doc, 0).unwrap();
    assert_eq!(page.dimensions(), (2000, 1500));
    let png = d.path().join("drawn.png");
    page.save(&png).unwrap();
    let image_doc = Document::open(&png, None).unwrap();
    for doc in [doc, image_doc] {
        let page = loader.load_full(&doc, 0).unwrap();
        let got = crop_figures(text, &page, |n| format!("drawn/page-1-figure-{n}.png"));
        assert_eq!(
            got.text,
            "Figure 1 shows it.\n\n![image](drawn/page-1-figure-1.png)\n\nThe end."
        );
        let f = &got.figures[0];
        assert_eq!(
            f.pixels,
            Some([500, 300, 1200, 1200]),
            "{}",
            doc.path.display()
        );
        let crop = f.crop.as_ref().unwrap();
        assert_eq!(crop.dimensions(), (700, 900));
        assert!(
            crop.pixels().all(|p| p.0 == [0, 0, 255]),
            "{}",
            doc.path.display()
        );
        // One pixel outside the box on every side is the white page.
        for (x, y) in [(499, 700), (1200, 700), (800, 299), (800, 1200)] {
            assert_eq!(page.get_pixel(x, y).0, [255, 255, 255], "({x}, {y})");
        }
    }
}

/// The flags on the fixture: `--figures` needs a folder; with one, pages whose text holds no
/// box (all the fixture writes) are written as without it and no crop is made, and `--json`
/// rows carry `figures: []`; `--tables` takes html or markdown.
#[test]
fn figures_and_tables_flags_on_pages_without_boxes() {
    let d = tempfile::tempdir().unwrap();
    let img = fixture().join("images/aligned.png");
    let img = img.to_str().unwrap();
    let e = ocr(&["--figures", img]);
    assert!(!e.status.success());
    let err = String::from_utf8_lossy(&e.stderr);
    assert!(
        err.contains("--figures needs a folder") && err.contains("--out"),
        "{err}"
    );
    let e = ocr(&["--tables", "pdf", img]);
    assert!(String::from_utf8_lossy(&e.stderr).contains("html or markdown"));
    let (plain, figs) = (d.path().join("plain"), d.path().join("figs"));
    for (dir, extra) in [
        (&plain, vec![]),
        (&figs, vec!["--figures", "--tables", "markdown"]),
    ] {
        let mut args = vec!["--out", dir.to_str().unwrap(), img];
        args.extend(extra);
        let o = ocr(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let read = |dir: &Path| std::fs::read_to_string(dir.join("aligned.md")).unwrap();
    assert_eq!(read(&figs), read(&plain));
    assert!(!figs.join("aligned").exists());
    let crops = d.path().join("crops");
    let flag = format!("--figures={}", crops.display());
    let o = ocr(&["--json", &flag, img]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows = json_lines(&o.stdout);
    assert_eq!(rows[0]["figures"], serde_json::json!([]));
    assert!(crops.is_dir());
}

/// `--fallback text`: PDF pages that did not finish are followed by the PDF's own text layer,
/// marked, and the document is written; the exit code stays 2 and `--json` rows carry the
/// text. Without the flag the document is withheld, as before.
#[test]
fn failed_pdf_pages_fall_back_on_their_text_layer_marked() {
    use common::pdfgen::pdf;
    let d = tempfile::tempdir().unwrap();
    let doc = d.path().join("letter.pdf");
    // White text on black: the fixture repeats one token on such a page (greedy), so two
    // tokens are a cut.
    let page = |text: &str| {
        let ops =
            format!("0 0 0 rg 0 0 612 792 re f 1 1 1 rg BT /F1 24 Tf 72 700 Td ({text}) Tj ET");
        (ops.into_bytes(), "")
    };
    std::fs::write(&doc, pdf(&[page("Dear reader"), page("Yours truly")], &[])).unwrap();
    let model = exported();
    let out = d.path().join("md");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "ocr",
            "--model",
            model.to_str().unwrap(),
            "--temperature",
            "0",
            "--max-tokens",
            "2",
            "--retries",
            "0",
        ];
        args.extend_from_slice(extra);
        args.push(doc.to_str().unwrap());
        ocrctl(&args)
    };
    let o = run(&["--out", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        !out.join("letter.md").exists(),
        "withheld without --fallback"
    );
    let o = run(&["--out", out.to_str().unwrap(), "--fallback", "text"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("2 of them followed by the PDF's text layer"),
        "{err}"
    );
    let md = std::fs::read_to_string(out.join("letter.md")).unwrap();
    assert_eq!(
        md,
        "<!-- page 1 failed: length -->\n<!-- page 1: text layer -->\nDear reader\
         \n\n<!-- page 2 -->\n\n\
         <!-- page 2 failed: length -->\n<!-- page 2: text layer -->\nYours truly\n"
    );
    let f: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("failures.jsonl")).unwrap())
            .unwrap();
    assert_eq!(f["written"], "partial");
    assert_eq!(f["pages"][1]["fallback"], "text_layer");
    let rows = json_lines(&run(&["--json", "--fallback", "text"]).stdout);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["status"], "failed");
    assert_eq!(rows[0]["text_layer"], "Dear reader");
    assert_eq!(rows[1]["text_layer"], "Yours truly");
}

#[test]
fn plain_text_of_several_documents_names_each_and_help_groups_the_options() {
    let images = fixture().join("images");
    let (a, b) = (images.join("aligned.png"), images.join("portrait.png"));
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let text = |o: std::process::Output| {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let one_a = text(ocr(&[a]));
    let one_b = text(ocr(&[b]));
    // One document: its text alone, as before.
    assert!(!one_a.contains("<!--"), "{one_a}");
    // Two: each opens with its file's name, then the same text as alone.
    let both = text(ocr(&[a, b]));
    assert_eq!(
        both,
        format!("<!-- file: {a} -->\n{one_a}<!-- file: {b} -->\n{one_b}")
    );
    // `ocr -h` lists its options under headings, each option once.
    let help = text(ocrctl(&["ocr", "-h"]));
    // The heading above the line that lists `flag` (`--flag`, `-f, --flag`, `[INPUTS]...`).
    let heading_of = |flag: &str| {
        let mut heading = "";
        for l in help.lines() {
            if l.ends_with(':') && !l.starts_with(' ') {
                heading = l;
            }
            let item = l.trim_start();
            // `-r, --recursive`: the long name after the short one.
            let item = match item.as_bytes() {
                [b'-', c, ..] if *c != b'-' => item.split_once(", ").map_or(item, |(_, l)| l),
                _ => item,
            };
            if item.split([' ', '<']).next() == Some(flag) {
                return heading.to_string();
            }
        }
        panic!("{flag} not in\n{help}")
    };
    for (flag, heading) in [
        ("--temperature", "Generation:"),
        ("--providers", "Runtime:"),
        ("--retries", "Page outcomes:"),
        ("--out", "Output:"),
        ("--recursive", "Inputs:"),
        ("--pdf-page-timeout", "PDF:"),
        ("[INPUTS]...", "Inputs:"),
    ] {
        assert_eq!(heading_of(flag), heading, "{flag}");
    }
}
