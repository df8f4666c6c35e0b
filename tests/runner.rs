//! The runner on the fixture: batching does not change greedy results, seeded sampling is
//! reproducible, folders with a broken file, and execution-provider fallback messages.

mod common;
use common::*;
use serde_json::Value;

fn image_dir() -> (tempfile::TempDir, std::path::PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("pages");
    std::fs::create_dir(&dir).unwrap();
    for e in std::fs::read_dir(fixture().join("images")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    (d, dir)
}

fn ocr_json(extra: &[&str], dir: &std::path::Path) -> Vec<Value> {
    let model = exported();
    let mut args = vec![
        "ocr",
        "--accept-length",
        "--model",
        model.to_str().unwrap(),
        "--max-tokens",
        "24",
        "--json",
        "--top-logprobs",
        "3",
    ];
    // Greedy unless the test samples (the fixture's generation_config.json says 0.2).
    if !extra.contains(&"--temperature") {
        args.extend_from_slice(&["--temperature", "0"]);
    }
    args.extend_from_slice(extra);
    args.push(dir.to_str().unwrap());
    ocrctl_ok(&args)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn greedy_results_do_not_depend_on_the_batch() {
    let (_d, dir) = image_dir();
    let one = ocr_json(&["--batch-size", "1", "--ignore-eos"], &dir);
    let four = ocr_json(&["--batch-size", "4", "--ignore-eos"], &dir);
    assert!(one.len() >= 4);
    assert_eq!(one.len(), four.len());
    for (a, b) in one.iter().zip(&four) {
        assert_eq!(a["file"], b["file"]);
        assert_eq!(a["token_ids"], b["token_ids"], "{}", a["file"]);
        for (sa, sb) in a["top_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .zip(b["top_logprobs"].as_array().unwrap())
        {
            for (x, y) in sa.as_array().unwrap().iter().zip(sb.as_array().unwrap()) {
                let d = (x["logprob"].as_f64().unwrap() - y["logprob"].as_f64().unwrap()).abs();
                assert!(d < 1e-4, "{}: batched logprob differs by {d}", a["file"]);
            }
        }
    }
}

#[test]
fn requests_leaving_and_joining_mid_batch_keep_their_results() {
    // Without --ignore-eos the pages stop at different steps (6–10 tokens): sequences leave
    // the batch one by one and the fifth joins while others are still decoding.
    let (_d, dir) = image_dir();
    let one = ocr_json(&["--batch-size", "1"], &dir);
    let four = ocr_json(&["--batch-size", "4"], &dir);
    let lens: Vec<usize> = one
        .iter()
        .map(|v| v["token_ids"].as_array().unwrap().len())
        .collect();
    assert!(
        lens.iter().min() != lens.iter().max(),
        "lengths differ: {lens:?}"
    );
    for (a, b) in one.iter().zip(&four) {
        assert_eq!(a["token_ids"], b["token_ids"], "{}", a["file"]);
        assert_eq!(a["text"], b["text"]);
    }
}

#[test]
fn seeded_sampling_is_reproducible_and_batch_independent() {
    let (_d, dir) = image_dir();
    let s = [
        "--temperature",
        "1.5",
        "--top-p",
        "0.95",
        "--seed",
        "7",
        "--ignore-eos",
    ];
    let a = ocr_json(&[&s[..], &["--batch-size", "1"]].concat(), &dir);
    let b = ocr_json(&[&s[..], &["--batch-size", "3"]].concat(), &dir);
    let ids = |v: &Vec<Value>| v.iter().map(|x| x["token_ids"].clone()).collect::<Vec<_>>();
    assert_eq!(ids(&a), ids(&b));
    let c = ocr_json(
        &[
            "--temperature",
            "1.5",
            "--top-p",
            "0.95",
            "--seed",
            "8",
            "--ignore-eos",
        ],
        &dir,
    );
    assert_ne!(ids(&a), ids(&c), "another seed samples differently");
    let greedy = ocr_json(&["--ignore-eos"], &dir);
    assert_ne!(ids(&a), ids(&greedy), "temperature 1.5 is not greedy");
}

#[test]
fn a_folder_with_a_broken_file_reports_it_and_writes_the_rest() {
    let (d, dir) = image_dir();
    std::fs::write(dir.join("zz-broken.png"), b"\x89PNG\r\n\x1a\ntruncated").unwrap();
    let out = d.path().join("md");
    let model = exported();
    let o = ocrctl(&[
        "ocr",
        "--accept-length",
        "--temperature",
        "0",
        "--model",
        model.to_str().unwrap(),
        "--max-tokens",
        "16",
        "--batch-size",
        "2",
        "--out",
        out.to_str().unwrap(),
        dir.to_str().unwrap(),
    ]);
    assert!(!o.status.success(), "exit code reports the failure");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("zz-broken.png"), "{err}");
    // The failed file is listed in failures.jsonl beside the documents (issue 41.5).
    let failures = std::fs::read_to_string(out.join("failures.jsonl")).unwrap();
    assert!(failures.contains("zz-broken.png"), "{failures}");
    let written: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "failures.jsonl")
        .collect();
    let n_images = std::fs::read_dir(fixture().join("images")).unwrap().count();
    assert_eq!(written.len(), n_images, "{written:?}");
    assert!(written.iter().all(|w| w.ends_with(".md")));
    // --resume redoes only what is missing.
    std::fs::remove_file(dir.join("zz-broken.png")).unwrap();
    let redo = out.join(&written[0]);
    std::fs::remove_file(&redo).unwrap();
    let keep = out.join(&written[1]);
    std::fs::write(&keep, "kept").unwrap();
    let o = ocrctl(&[
        "ocr",
        "--accept-length",
        "--temperature",
        "0",
        "--model",
        model.to_str().unwrap(),
        "--max-tokens",
        "16",
        "--out",
        out.to_str().unwrap(),
        "--resume",
        dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(redo.exists(), "the missing page was redone");
    assert_eq!(
        std::fs::read_to_string(&keep).unwrap(),
        "kept",
        "finished pages are skipped"
    );
}

#[test]
fn unavailable_providers_fall_back_with_a_message_or_fail_when_strict() {
    let model = exported();
    let img = fixture().join("images").join(
        std::fs::read_dir(fixture().join("images"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .file_name(),
    );
    let o = ocrctl(&[
        "ocr",
        "--accept-length",
        "--temperature",
        "0",
        "--model",
        model.to_str().unwrap(),
        "--max-tokens",
        "2",
        "--providers",
        "tensorrt,cuda,cpu",
        img.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("tensorrt execution provider") && err.contains("falling back to"),
        "{err}"
    );
    let e = ocrctl_err(&[
        "ocr",
        "--accept-length",
        "--temperature",
        "0",
        "--model",
        model.to_str().unwrap(),
        "--providers",
        "cuda",
        "--strict-providers",
        img.to_str().unwrap(),
    ]);
    assert!(e.contains("cuda execution provider unavailable"), "{e}");
}

/// `doctor` names each GPU's compute capability and the 8-bit KV caches it decodes at full
/// speed (fp8 from 8.9, int8 from 8.0), from a stand-in `nvidia-smi` on PATH.
#[test]
fn doctor_names_each_gpus_fast_8bit_caches() {
    use std::os::unix::fs::PermissionsExt;
    let bin = tempfile::tempdir().unwrap();
    let smi = bin.path().join("nvidia-smi");
    std::fs::write(
        &smi,
        "#!/bin/sh\ncase \"$1\" in\n\
         --query-gpu=name,memory.total) printf 'NVIDIA RTX A5000, 24564\\nNVIDIA H200, 143771\\n' ;;\n\
         --query-gpu=compute_cap) printf '8.6\\n9.0\\n' ;;\n\
         esac\n",
    )
    .unwrap();
    std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap()
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ocrctl"))
        .arg("doctor")
        .env("PATH", path)
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains("NVIDIA RTX A5000, 24.0 GiB, compute capability 8.6 (8-bit KV caches: int8)"),
        "{s}"
    );
    assert!(
        s.contains("NVIDIA H200, 140.4 GiB, compute capability 9.0 (8-bit KV caches: fp8, int8)"),
        "{s}"
    );
}

#[test]
fn doctor_reports_the_runtime_and_names_a_missing_library() {
    let out = ocrctl_ok(&["doctor"]);
    assert!(
        out.contains("libonnxruntime.so") && out.contains("version 1.3"),
        "{out}"
    );
    assert!(out.contains("cpu       available"), "{out}");
    assert!(out.contains("pdfium") && out.contains("libpdfium"), "{out}");
    assert!(out.contains("profile        cpu"), "{out}");
    let o = ocrctl(&["doctor", "--ort-lib", "/nowhere/libonnxruntime.so.1.31.1"]);
    assert!(!o.status.success());
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(
        s.contains("NOT AVAILABLE") && s.contains("/nowhere/libonnxruntime.so.1.31.1"),
        "{s}"
    );
}

#[test]
fn bench_reports_its_phases_its_sweep_and_where_the_pixels_upload_from() {
    let model = exported();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let table = ocrctl_ok(&[
        "bench",
        "--model",
        model.to_str().unwrap(),
        "--providers",
        "cpu",
        "--sizes",
        "84x56",
        "--new-tokens",
        "3",
        "--runs",
        "1",
        "--batch-sizes",
        "2",
        "--json-out",
        json.to_str().unwrap(),
    ]);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["provider"], "cpu");
    // Pixels are staged in page-locked memory on CUDA only.
    assert_eq!(v["vision_pixels"], "lent");
    assert!(table.contains("lent pixels"), "{table}");
    let row = &v["results"][0];
    // 84×56 pixels: 3×2 merged patches of 28.
    assert_eq!(
        (row["size"].as_str(), row["image_tokens"].as_u64()),
        (Some("84x56"), Some(6))
    );
    assert!(row["vision_ms"].as_f64().unwrap() > 0.0, "{row}");
    let sweep = &v["batch_sweep"][0];
    assert_eq!(
        (sweep["batch"].as_u64(), sweep["size"].as_str()),
        (Some(2), Some("84x56"))
    );
    assert!(sweep["pages_per_s"].as_f64().unwrap() > 0.0, "{sweep}");
}

/// Without --profile and --providers, `ocr` takes the largest built-in profile the GPU's
/// memory holds (a stand-in `nvidia-smi` reports a 16 GB card) and says so; with
/// `--providers cpu`, or without a GPU, none.
#[test]
fn without_a_profile_the_gpus_memory_chooses_one() {
    use std::os::unix::fs::PermissionsExt;
    let bin = tempfile::tempdir().unwrap();
    let smi = bin.path().join("nvidia-smi");
    std::fs::write(
        &smi,
        "#!/bin/sh\ncase \"$1\" in\n\
         --query-gpu=memory.total,memory.used) printf '16376, 420\\n' ;;\n\
         esac\n",
    )
    .unwrap();
    std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap()
    );
    let img = fixture().join("images/aligned.png");
    let run = |extra: &[&str], path: &str| {
        let mut args = vec![
            "ocr",
            "--model",
            exported().to_str().unwrap(),
            "--temperature",
            "0",
            "--max-tokens",
            "16",
            "--accept-length",
        ];
        args.extend_from_slice(extra);
        args.push(img.to_str().unwrap());
        std::process::Command::new(env!("CARGO_BIN_EXE_ocrctl"))
            .args(&args)
            .env("PATH", path)
            .env_remove("OCRCTL_PROFILE")
            .env_remove("OCRCTL_PROVIDERS")
            .output()
            .unwrap()
    };
    let o = run(&[], &path);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("no --profile given; GPU 0 has 16.0 GiB: using the 16gb profile"),
        "{err}"
    );
    let o = run(&["--providers", "cpu"], &path);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && !err.contains("no --profile given"),
        "{err}"
    );
    let o = run(&[], "/usr/bin:/bin");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && !err.contains("no --profile given"),
        "{err}"
    );
}
