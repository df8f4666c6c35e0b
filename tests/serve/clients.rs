//! Other clients: the upload page in headless Chromium, the `openai` Python client, PDF
//! uploads.

use super::*;

/// `node tests/browser/upload.mjs ARGS…` against `s`: what the upload page showed (JSON).
fn upload_page(s: &Server, chromium: &Path, args: &[&str]) -> Value {
    let browser = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    let url = format!("http://{}/", s.addr);
    let (flags, rest) = args.split_at(usize::from(args.first() == Some(&"--drop")));
    let out = Command::new("node")
        .current_dir(&browser)
        .env("CHROMIUM", chromium)
        .arg("upload.mjs")
        .args(flags)
        .arg(&url)
        .args(rest)
        .output()
        .expect("node runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The upload page (issue 41 item 6): one image's text as the CLI reads it, "Done"; then
/// two files dropped together, read in turn: the image again, and a PDF whose second page
/// cannot be rendered (past `--pdf-page-memory`), shown as a failed page with its reason, not
/// as "Done" with the error inside the text; "page k/N" while it streams, and each document
/// downloads as NAME.md.
#[test]
fn upload_page_in_headless_chromium_shows_the_text() {
    const TEST: &str = "upload_page_in_headless_chromium_shows_the_text";
    let browser = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    // upload.mjs launches $CHROMIUM when set, else the `chromium` found here.
    let chromium = std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .or_else(|| common::on_path("chromium"));
    let tools = [
        (
            "node",
            common::runs("node", &["--version"]),
            "install Node.js: apt-get install nodejs npm",
        ),
        (
            "tests/browser/node_modules/playwright-core",
            browser.join("node_modules/playwright-core").is_dir(),
            "run scripts/setup.sh --test: npm ci in tests/browser",
        ),
        (
            "chromium",
            chromium.is_some(),
            "run scripts/setup.sh --test: Debian's chromium, apt-get install chromium",
        ),
    ];
    if !tools
        .iter()
        .all(|&(tool, present, install)| common::require_tool(TEST, tool, present, install))
    {
        return;
    }
    let chromium = chromium.expect("checked above");
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), 1, 4, &["--pdf-page-memory", "256"]);
    let want = cli("aligned.png", 32)["text"].as_str().unwrap().to_string();
    let png = image("aligned.png");
    let v = upload_page(&s, &chromium, &["32", png.to_str().unwrap()]);
    assert_eq!(v["text"].as_str().unwrap(), want);
    assert!(v["status"].as_str().unwrap().starts_with("Done"), "{v}");
    assert_eq!(v["failures"], json!([]), "{v}");
    assert_eq!(
        v["downloads"],
        json!([{"name": "aligned.md", "text": want + "\n"}])
    );
    // Page 1 a square, page 2 two forms that draw each other (pdfium's memory grows until
    // the render worker's limit stops it).
    let forms = [
        ("A", "/B Do /B Do 0 0 1 1 re f"),
        ("B", "/A Do /A Do 0 0 1 1 re f"),
    ];
    let square = (b"0 g 100 100 200 200 re f".to_vec(), "");
    let bomb = common::pdfgen::pdf(&[square, (b"/A Do".to_vec(), "")], &forms);
    let bomb_path = dir.path().join("bomb.pdf");
    std::fs::write(&bomb_path, bomb).unwrap();
    let args = [
        "--drop",
        "32",
        png.to_str().unwrap(),
        bomb_path.to_str().unwrap(),
    ];
    let v = upload_page(&s, &chromium, &args);
    let docs = v["docs"].as_array().unwrap();
    assert_eq!(docs[0], "aligned.png — done", "{v}");
    let bomb_entry = docs[1].as_str().unwrap();
    assert!(
        bomb_entry.starts_with("bomb.pdf — ") && bomb_entry.ends_with("of 2 pages failed"),
        "{v}"
    );
    // The PDF is shown last: its failures listed, the status an error that is not "Done".
    let status = v["status"].as_str().unwrap();
    assert!(
        status.starts_with("Finished 2 files") && status.contains("bomb.pdf"),
        "{v}"
    );
    assert_eq!(v["statusClass"], "error", "{v}");
    let failures = v["failures"].as_array().unwrap();
    let page2 = failures
        .iter()
        .filter_map(Value::as_str)
        .find(|f| f.starts_with("Page 2 failed: error: "))
        .unwrap_or_else(|| panic!("no failure of page 2: {v}"));
    assert!(page2.contains("memory limit of 256 MiB"), "{page2}");
    let text = v["text"].as_str().unwrap();
    assert!(
        text.contains("<!-- page 2 -->") && text.contains("<!-- page 2 failed: error: "),
        "{text}"
    );
    assert!(!text.contains("[error"), "{text}");
    let history: Vec<&str> = v["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        history.iter().any(|h| h.contains("bomb.pdf: page 2/2")),
        "{history:?}"
    );
    assert!(
        history
            .iter()
            .any(|h| h.starts_with("(1/2) Done: aligned.png")),
        "{history:?}"
    );
    let names: Vec<&Value> = v["downloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| &d["name"])
        .collect();
    assert_eq!(names, [&json!("aligned.md"), &json!("bomb.md")]);
    assert_eq!(
        v["downloads"][1]["text"].as_str().unwrap(),
        format!("{text}\n")
    );
}

#[test]
fn the_openai_python_client_gets_the_cli_answer() {
    let python = common::venv_python();
    if !common::require_tool(
        "the_openai_python_client_gets_the_cli_answer",
        ".venv/bin/python with the openai package",
        common::runs(&python, &["-c", "import openai"]),
        "run scripts/setup.sh --test",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = server(
        dir.path(),
        2,
        8,
        &["--served-model-name", "tiny-ocr", "--api-key", "k-123"],
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/openai_client.py");
    for name in ["photo.jpg", "unaligned.png"] {
        let want = cli(name, MAX_TOKENS);
        let out = Command::new(&python)
            .arg(&script)
            .args([
                &format!("http://{}/v1", s.addr),
                "tiny-ocr",
                image(name).to_str().unwrap(),
                &MAX_TOKENS.to_string(),
                "k-123",
            ])
            .output()
            .expect(".venv/bin/python runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let text = want["text"].as_str().unwrap();
        assert_eq!(v["models"], json!(["tiny-ocr"]));
        assert_eq!(v["text"], text, "{name}");
        assert_eq!(v["stream_text"], text, "{name}");
        assert_eq!(v["stream_role"], "assistant");
        let n = want["token_ids"].as_array().unwrap().len();
        assert_eq!(v["usage"]["completion_tokens"], n);
        assert_eq!(v["usage"]["prompt_tokens"], want["prompt_tokens"]);
        assert_eq!(v["stream_usage"]["completion_tokens"], n);
        assert_eq!(v["finish_reason"], v["stream_finish_reason"]);
        assert!(v["stream_chunks"].as_u64().unwrap() >= 3);
        let lps = v["logprobs"].as_array().unwrap();
        assert_eq!(lps.len(), n);
        for (got, cli_top) in lps.iter().zip(want["top_logprobs"].as_array().unwrap()) {
            assert!(
                (got["logprob"].as_f64().unwrap() - cli_top[0]["logprob"].as_f64().unwrap()).abs()
                    < 1e-4
            );
            assert_eq!(got["top"].as_array().unwrap().len(), 2);
        }
    }
}

#[test]
fn a_pdf_upload_reads_like_its_pages_and_bad_pdfs_are_400() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), 2, 8, &[]);
    let pdfs = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pdf");
    let pdf = std::fs::read(pdfs.join("two_pages.pdf")).unwrap();
    // Each page on its own, rendered through the library like the server does.
    let pages = ocrctl::documents::pdf::render_pdf(&pdf, "two_pages.pdf", None).unwrap();
    assert_eq!(pages.len(), 2);
    let mut want = Vec::new();
    for (i, p) in pages.iter().enumerate() {
        let mut png = Vec::new();
        p.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
            .unwrap();
        let (ct, mp) = multipart(
            &[("max_tokens", "16"), ("temperature", "0")],
            Some((&format!("p{i}.png"), &png)),
        );
        let r = request(&s.addr, "POST", "/v1/ocr", &[("Content-Type", &ct)], &mp).unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        want.push(r.text().trim_end_matches('\n').to_string());
    }
    let (ct, mp) = multipart(
        &[("max_tokens", "16"), ("temperature", "0")],
        Some(("two_pages.pdf", &pdf)),
    );
    let r = request(
        &s.addr,
        "POST",
        "/v1/ocr?format=json",
        &[("Content-Type", &ct)],
        &mp,
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["pages"][0]["text"], want[0]);
    assert_eq!(v["pages"][1]["text"], want[1]);
    assert_eq!(
        v["text"],
        format!(
            "{}{}{}",
            want[0],
            ocrctl::documents::inputs::page_separator(2),
            want[1]
        )
    );
    // Streamed: the same markdown.
    let r = request(
        &s.addr,
        "POST",
        "/v1/ocr?stream=true",
        &[("Content-Type", &ct)],
        &mp,
    )
    .unwrap();
    assert_eq!(r.text(), v["text"].as_str().unwrap());
    // figures=true: the same text (the fixture model writes no boxes, so nothing is cropped:
    // the crops themselves are tested in server::routes::ocr_figures), `figures` per page;
    // JSON only.
    let r = request(
        &s.addr,
        "POST",
        "/v1/ocr?format=json&figures=true",
        &[("Content-Type", &ct)],
        &mp,
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let f = r.json();
    assert_eq!(f["text"], v["text"]);
    assert_eq!(f["pages"][1]["figures"], serde_json::json!([]));
    let r = request(
        &s.addr,
        "POST",
        "/v1/ocr?figures=true",
        &[("Content-Type", &ct)],
        &mp,
    )
    .unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "figures");
    for (file, needle) in [
        ("encrypted.pdf", "encrypted"),
        ("truncated.pdf", "truncated.pdf"),
    ] {
        let bytes = std::fs::read(pdfs.join(file)).unwrap();
        let (ct, mp) = multipart(&[], Some((file, &bytes)));
        let r = request(&s.addr, "POST", "/v1/ocr", &[("Content-Type", &ct)], &mp).unwrap();
        assert_eq!(r.status, 400, "{file}: {}", r.text());
        let e = r.json();
        assert_eq!(e["error"]["param"], "file");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(needle),
            "{e}"
        );
    }
}

/// The `pages` form field reads only the chosen pages of a PDF, numbered as in the file; a
/// page past the end or a malformed list is a 400 naming `pages`.
#[test]
fn the_pages_field_reads_only_the_chosen_pages() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), 2, 8, &[]);
    let pdf = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pdf/two_pages.pdf"),
    )
    .unwrap();
    let post = |fields: &[(&str, &str)]| {
        let mut all = vec![("max_tokens", "16"), ("temperature", "0")];
        all.extend_from_slice(fields);
        let (ct, mp) = multipart(&all, Some(("two_pages.pdf", &pdf)));
        let path = "/v1/ocr?format=json";
        request(&s.addr, "POST", path, &[("Content-Type", &ct)], &mp).unwrap()
    };
    let all = post(&[]).json();
    let r = post(&[("pages", "2-")]);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["pages"].as_array().unwrap().len(), 1);
    assert_eq!(v["pages"][0]["page"], 2);
    assert_eq!(v["pages"][0]["text"], all["pages"][1]["text"]);
    assert_eq!(v["text"], all["pages"][1]["text"]);
    for (list, needle) in [
        ("3", "page 3 is past the end"),
        ("2-1", "reversed"),
        ("x", "not a page"),
    ] {
        let r = post(&[("pages", list)]);
        assert_eq!(r.status, 400, "{list}: {}", r.text());
        let e = r.json();
        assert_eq!(e["error"]["param"], "pages", "{e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(needle),
            "{e}"
        );
    }
}

/// Issue 41 item 3: `/v1/ocr` reads a PDF through a window of pages, so a document of
/// hundreds of pages is answered whole (before, at most `max_images_per_request` pages, all
/// rendered and held at once), its decode budget taken one rendered page at a time (before,
/// the whole document's worst case up front); past `--max-pages-per-request` it is a 400
/// naming the flag. One-inch pages and two tokens a page keep it fast.
#[test]
fn a_300_page_pdf_is_read_through_v1_ocr_within_the_page_limit() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), 4, 8, &["--max-pages-per-request", "300"]);
    let page = |i: usize| {
        (
            format!("BT /F1 24 Tf 4 30 Td ({}) Tj ET", i % 10).into_bytes(),
            "",
        )
    };
    let long =
        |n: usize| common::pdfgen::pdf_sized(&(0..n).map(page).collect::<Vec<_>>(), &[], (72, 72));
    let fields = [
        ("max_tokens", "2"),
        ("accept_length", "true"),
        ("temperature", "0"),
    ];
    let post = |path: &str, pdf: &[u8]| {
        let (ct, mp) = multipart(&fields, Some(("long.pdf", pdf)));
        request(&s.addr, "POST", path, &[("Content-Type", &ct)], &mp).unwrap()
    };
    let pdf = long(300);
    let t = std::time::Instant::now();
    let r = post("/v1/ocr?format=json", &pdf);
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let pages = v["pages"].as_array().unwrap();
    assert_eq!(pages.len(), 300);
    for (i, p) in pages.iter().enumerate() {
        assert_eq!(
            (&p["page"], &p["status"]),
            (&json!(i + 1), &json!("ok")),
            "{p}"
        );
    }
    let text = v["text"].as_str().unwrap();
    assert!(
        text.contains(&ocrctl::documents::inputs::page_separator(300)),
        "{text}"
    );
    // One rendered page's worth of the decode budget at most (a PDF page at the renderer's
    // largest side and its model pixels), not 300 of them.
    let one_page = ocrctl::server::images::pdf_page_bytes(&Default::default());
    let peak = gauge(&s, "ocrctl_image_decode_peak_bytes");
    assert!(
        peak > 0 && peak <= one_page,
        "peak {peak}, one page {one_page}"
    );
    eprintln!("300 pages through /v1/ocr in {secs:.1} s");
    // Streamed: the same markdown, the page count in `x-ocr-pages` before the text.
    let r = post("/v1/ocr?stream=true", &pdf);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-ocr-pages"), Some("300"));
    assert_eq!(r.text(), text);
    // One page more is refused before anything is rendered, naming the flag and the field.
    let r = post("/v1/ocr", &long(301));
    assert_eq!(r.status, 400, "{}", r.text());
    let e = r.json();
    assert_eq!(e["error"]["param"], "file", "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("301 pages, more than the limit of 300 per request")
            && msg.contains("--max-pages-per-request")
            && msg.contains("max_pages_per_request"),
        "{msg}"
    );
    assert_eq!(s.get("/health").unwrap().status, 200);
}
