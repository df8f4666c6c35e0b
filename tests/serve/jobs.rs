//! Asynchronous OCR jobs (`/v1/ocr/jobs`, issue 41): a job reads a document as `/v1/ocr` does
//! (same pages, same text), reports each finished page while it runs, waits for room when the
//! queue is full instead of failing, and is bounded (`--max-jobs`), cancellable and named in
//! its errors.

use super::*;

fn two_pages() -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pdf/two_pages.pdf"))
        .unwrap()
}

/// A multipart POST of `file` with `fields` to `path`.
fn upload(
    s: &Server,
    path: &str,
    file: (&str, &[u8]),
    fields: &[(&str, &str)],
) -> common::server::Resp {
    let (ct, mp) = multipart(fields, Some(file));
    request(&s.addr, "POST", path, &[("Content-Type", &ct)], &mp).unwrap()
}

/// Polls a job until it has ended; its last status.
fn wait_for(s: &Server, id: &str) -> Value {
    let t = std::time::Instant::now();
    loop {
        let r = s.get(&format!("/v1/ocr/jobs/{id}")).unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        if v["status"] != "running" {
            return v;
        }
        assert!(t.elapsed().as_secs() < 300, "job {id} still running: {v}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn a_job_reads_a_document_like_v1_ocr() {
    let dir = tempfile::tempdir().unwrap();
    // A queue of one: a page of the job that finds it full waits for room rather than failing.
    let s = server(dir.path(), 1, 1, &[]);
    let pdf = two_pages();
    let fields = [("max_tokens", "16"), ("temperature", "0"), ("seed", "7")];
    let direct = upload(&s, "/v1/ocr?format=json", ("two_pages.pdf", &pdf), &fields);
    assert_eq!(direct.status, 200, "{}", direct.text());
    let direct_md = upload(&s, "/v1/ocr", ("two_pages.pdf", &pdf), &fields);
    let r = upload(&s, "/v1/ocr/jobs", ("two_pages.pdf", &pdf), &fields);
    assert_eq!(r.status, 202, "{}", r.text());
    let v = r.json();
    let id = v["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("ocrjob-") && id.len() > 30, "{id}");
    assert_eq!(
        (&v["object"], &v["pages_total"]),
        (&json!("ocr.job"), &json!(2))
    );
    let done = wait_for(&s, &id);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        (&done["pages_done"], &done["pages_failed"]),
        (&json!(2), &json!(0))
    );
    for p in done["pages"].as_array().unwrap() {
        assert_eq!(p["status"], "ok", "{p}");
        assert!(p.get("text").is_none(), "the status carries no text: {p}");
    }
    // The result is what /v1/ocr answered, in JSON and in markdown, as often as asked.
    let res = s
        .get(&format!("/v1/ocr/jobs/{id}/result?format=json"))
        .unwrap();
    assert_eq!(res.status, 200, "{}", res.text());
    let (a, b) = (res.json(), direct.json());
    assert_eq!(a["text"], b["text"]);
    assert_eq!(a["pages"], b["pages"]);
    for _ in 0..2 {
        let md = s.get(&format!("/v1/ocr/jobs/{id}/result")).unwrap();
        assert_eq!((md.status, md.text()), (200, direct_md.text()));
    }
    // An image is a job of one page.
    let png = std::fs::read(image("aligned.png")).unwrap();
    let r = upload(&s, "/v1/ocr/jobs", ("aligned.png", &png), &fields);
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_string();
    assert_eq!(wait_for(&s, &id)["pages_done"], 1);
}

#[test]
fn jobs_are_bounded_cancellable_and_named_in_errors() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), 1, 8, &["--max-jobs", "1"]);
    let pdf = two_pages();
    let fields = [("max_tokens", "24"), ("temperature", "0")];
    // An upload that cannot be read is refused before a job exists.
    let pdfs = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pdf");
    let bad = std::fs::read(pdfs.join("encrypted.pdf")).unwrap();
    let r = upload(&s, "/v1/ocr/jobs", ("encrypted.pdf", &bad), &fields);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "file");
    let r = upload(
        &s,
        "/v1/ocr/jobs",
        ("two_pages.pdf", &pdf),
        &[("pages", "5")],
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "pages");
    let r = upload(
        &s,
        "/v1/ocr/jobs",
        ("two_pages.pdf", &pdf),
        &[("colour", "red")],
    );
    assert_eq!(
        (r.status, &r.json()["error"]["param"]),
        (400, &json!("colour"))
    );
    // One job is all this server keeps: a second is a 429 that says why. The first is long
    // (40 pages at batch 1), so that it is still running when it is cancelled.
    let page = (b"BT /F1 36 Tf 72 600 Td (4 8 1 5) Tj ET".to_vec(), "");
    let long = common::pdfgen::pdf(&vec![page; 40], &[]);
    let r = upload(&s, "/v1/ocr/jobs", ("long.pdf", &long), &fields);
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_string();
    let r2 = upload(&s, "/v1/ocr/jobs", ("two_pages.pdf", &pdf), &fields);
    assert_eq!(r2.status, 429, "{}", r2.text());
    assert!(r2.header("retry-after").is_some());
    assert_eq!(r2.json()["error"]["code"], "too_many_jobs");
    assert!(r2.text().contains("--max-jobs"), "{}", r2.text());
    // Cancelled: kept, with no result.
    let r = request(&s.addr, "DELETE", &format!("/v1/ocr/jobs/{id}"), &[], b"").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let st = s.get(&format!("/v1/ocr/jobs/{id}")).unwrap().json();
    assert_eq!(st["status"], "cancelled", "{st}");
    assert!(st["pages_done"].as_u64().unwrap() < 40, "{st}");
    let r = s.get(&format!("/v1/ocr/jobs/{id}/result")).unwrap();
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.text().contains("cancelled"), "{}", r.text());
    let r = s.get("/v1/ocr/jobs/ocrjob-nosuchjob").unwrap();
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(r.text().contains("--job-ttl"), "{}", r.text());
    let r = s
        .get(&format!("/v1/ocr/jobs/{id}/result?format=xml"))
        .unwrap();
    assert_eq!(
        (r.status, &r.json()["error"]["param"]),
        (400, &json!("format"))
    );
    // The server goes on answering.
    let png = std::fs::read(image("aligned.png")).unwrap();
    let r = upload(&s, "/v1/ocr", ("aligned.png", &png), &fields);
    assert_eq!(r.status, 200, "{}", r.text());
}
