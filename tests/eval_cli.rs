//! `ocrctl eval --truth DIR` end to end on the fixture: pages (PNG and PDF) whose expected
//! text is what `ocrctl ocr --temperature 0` reads score 0, a text with known edits scores
//! exactly those edits, a page without its text is named and fails the run, and every
//! precision given gets its rows. The fixture model does not read, so the expected texts are
//! made from its own greedy output. Needs pdfium in .venv (`scripts/setup.sh`).

mod common;
use common::*;
use ocrctl::documents::inputs::page_separator;
use ocrctl::quality::cer::normalise;
use serde_json::Value;
use std::path::Path;

const MAX_TOKENS: &str = "16";

/// What `ocrctl ocr --temperature 0` reads from `file`, one text per page.
fn ocr_texts(file: &Path) -> Vec<String> {
    let m = exported().to_str().unwrap();
    let out = ocrctl_ok(&[
        "ocr",
        "--temperature",
        "0",
        "--model",
        m,
        "--max-tokens",
        MAX_TOKENS,
        "--json",
        file.to_str().unwrap(),
    ]);
    out.lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

fn eval(dir: &Path, extra: &[&str]) -> std::process::Output {
    let m = exported().to_str().unwrap();
    let mut args = vec![
        "eval",
        "--truth",
        dir.to_str().unwrap(),
        "--model",
        m,
        "--max-tokens",
        MAX_TOKENS,
    ];
    args.extend_from_slice(extra);
    ocrctl(&args)
}

#[test]
fn truth_pages_score_their_exact_edit_distance_per_page_and_precision() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("truth");
    std::fs::create_dir(&dir).unwrap();
    let images = fixture().join("images");
    std::fs::copy(images.join("aligned.png"), dir.join("exact.png")).unwrap();
    std::fs::copy(images.join("unaligned.png"), dir.join("edited.png")).unwrap();
    std::fs::copy(images.join("portrait.png"), dir.join("orphan.png")).unwrap();
    let pdf = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pdf/two_pages.pdf");
    std::fs::copy(&pdf, dir.join("scan.pdf")).unwrap();

    // Equal up to whitespace: CER 0.
    let exact = ocr_texts(&dir.join("exact.png")).remove(0);
    std::fs::write(
        dir.join("exact.txt"),
        format!("\n  {}\n\n", exact.replace(' ', " \t ")),
    )
    .unwrap();
    // Four characters appended to the last word: 4 character errors, 1 word error.
    let edited = normalise(&ocr_texts(&dir.join("edited.png")).remove(0));
    let (chars, words) = (edited.chars().count(), edited.split(' ').count());
    assert!(chars > 0, "the fixture reads something");
    std::fs::write(dir.join("edited.md"), format!("{edited}ZZZZ")).unwrap();
    // A PDF's text is its pages joined as `ocr --out` joins them.
    let pages = ocr_texts(&dir.join("scan.pdf"));
    assert_eq!(pages.len(), 2);
    std::fs::write(
        dir.join("scan.txt"),
        format!("{}{}{}\n", pages[0], page_separator(2), pages[1]),
    )
    .unwrap();

    let o = eval(&dir, &["--precision", "fp32,fp16", "--json"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "a page without its text fails the run: {err}"
    );
    assert!(
        err.lines().any(|l| l.starts_with("error: ")
            && l.contains(&dir.join("orphan.png").display().to_string())
            && l.contains("orphan.txt or orphan.md")),
        "{err}"
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["problems"].as_array().unwrap().len(), 1, "{v}");
    assert!(v["normalisation"].as_str().unwrap().contains("NFC"));
    let runs = v["runs"].as_array().unwrap();
    let precisions: Vec<&str> = runs
        .iter()
        .map(|r| r["precision"].as_str().unwrap())
        .collect();
    assert_eq!(precisions, ["fp32", "fp16"]);
    for r in runs {
        assert_eq!(r["rows"].as_array().unwrap().len(), 4, "{r}");
        assert_eq!(r["failed"], 0);
    }
    let fp32 = &runs[0];
    let rows = fp32["rows"].as_array().unwrap();
    let row = |file: &str, page: u64| {
        rows.iter()
            .find(|r| r["file"].as_str().unwrap().ends_with(file) && r["page"] == page)
            .unwrap_or_else(|| panic!("{file} page {page} in {fp32}"))
    };
    for (file, page) in [("exact.png", 1), ("scan.pdf", 1), ("scan.pdf", 2)] {
        let s = &row(file, page)["score"];
        assert_eq!(
            (s["char_errors"].as_u64(), s["word_errors"].as_u64()),
            (Some(0), Some(0)),
            "{file} {page}: {s}"
        );
        assert_eq!(s["cer"].as_f64(), Some(0.0));
    }
    assert_eq!(row("exact.png", 1)["text"].as_str().unwrap(), exact);
    let s = &row("edited.png", 1)["score"];
    assert_eq!(s["char_errors"], 4);
    assert_eq!(s["chars"].as_u64(), Some(chars as u64 + 4));
    assert_eq!(s["cer"].as_f64(), Some(4.0 / (chars + 4) as f64));
    assert_eq!(
        (s["word_errors"].as_u64(), s["words"].as_u64()),
        (Some(1), Some(words as u64))
    );
    assert_eq!(s["wer"].as_f64(), Some(1.0 / words as f64));
    let total = &fp32["overall"];
    assert_eq!(total["char_errors"], 4);
    let all_chars: usize = [exact.as_str(), &pages[0], &pages[1]]
        .iter()
        .map(|t| normalise(t).chars().count())
        .sum::<usize>()
        + chars
        + 4;
    assert_eq!(total["chars"].as_u64(), Some(all_chars as u64));
    assert_eq!(total["cer"].as_f64(), Some(4.0 / all_chars as f64));

    // Every page with its text: success, and the table names each page and the total.
    std::fs::remove_file(dir.join("orphan.png")).unwrap();
    let o = eval(&dir, &[]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let cer = format!("{:.2}%", 100.0 * (4.0 / (chars + 4) as f64));
    assert!(
        out.lines()
            .any(|l| l.contains("edited.png") && l.contains(&cer)),
        "{out}"
    );
    assert!(out.contains("scan.pdf: page 2"), "{out}");
    assert!(out.contains("overall (4 pages)"), "{out}");
    assert!(out.contains("fp32, gqa decoder, KV cache auto"), "{out}");

    // A PDF text with the wrong number of pages is named.
    std::fs::write(dir.join("scan.txt"), "only one page").unwrap();
    let o = eval(&dir, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("scan.txt: 1 page(s)") && err.contains("has 2"),
        "{err}"
    );
}

#[test]
fn truth_and_the_teacher_forced_comparison_do_not_mix() {
    let e = ocrctl_err(&["eval", "--truth", "x", "--model", "m", "--reference", "m"]);
    assert!(e.contains("--reference"), "{e}");
    let e = ocrctl_err(&["eval", "--truth", "x"]);
    assert!(e.contains("--model"), "{e}");
}
