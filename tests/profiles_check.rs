//! `ocrctl profiles check|list|show` on fake and real exports: a profile too big for its GPU,
//! weights read from the manifest, contrib-op notes, an unfused vision encoder's scores on
//! the CPU, position limits, the prefill stage's memory, and the profiles-directory override.

mod common;
mod profiles_support;

use ocrctl::profile::{self, budget, weights_bytes, ModelDims};
use ocrctl_exporters::export::{Manifest, Precision};
use ocrctl_exporters::layers::Target;
use profiles_support::*;

/// `ocrctl profiles check cpu --model MODEL --memory 16`.
fn check_cpu_16(model: &std::path::Path) -> std::process::Output {
    let model = model.to_str().unwrap();
    ocrctl(
        &[
            "profiles", "check", "cpu", "--model", model, "--memory", "16",
        ],
        None,
        &[],
    )
}

#[test]
fn a_profile_too_big_for_the_gpu_fails_check_with_advice_on_the_batch() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    fake_export(&model, &[Precision::Fp16], Target::TensorRt);
    let m = model.to_str().unwrap();

    // 24gb at 24 GiB fits.
    let out = ocrctl(&["profiles", "check", "24gb", "--model", m], None, &[]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("verdict: fits"));

    // On 16 GiB it does not: 2.17 GiB weights + 0.43 vision + 1.23 prefill + 2 workspace
    // + 0.875 runtime leave 8.5 of the 15.2 usable GiB, i.e. 4 sequences of 1.75 GiB
    // (KV cache and its step copy at 8192 tokens).
    let out = ocrctl(
        &[
            "profiles",
            "check",
            "24gb",
            "--model",
            m,
            "--gpu-memory",
            "16",
        ],
        None,
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("verdict: does NOT fit"), "{text}");
    assert!(text.contains("GPU memory (--gpu-memory)"), "{text}");
    assert!(
        text.contains("set `max_batch_size` to 4 (now 8); KV cache 3.50 GiB at 4 sequences"),
        "{text}"
    );
    assert!(text.contains("`max_sequence_length`"), "{text}");

    // The library agrees.
    let p = builtin_profile("24gb");
    let b = budget(
        &p,
        &ModelDims::lightonocr_2_1b(),
        full_size_weights(Precision::Fp16),
        Some(16 * GIB),
    );
    assert!(!b.fits());
    let adv = b.advice();
    assert_eq!(adv[0].field, "max_batch_size");
    assert_eq!(adv[0].suggested.as_deref(), Some("4"));
    let mut q = p.clone();
    q.max_batch_size = 4;
    assert!(budget(
        &q,
        &ModelDims::lightonocr_2_1b(),
        full_size_weights(Precision::Fp16),
        Some(16 * GIB)
    )
    .fits());
    q.max_batch_size = 5;
    assert!(!budget(
        &q,
        &ModelDims::lightonocr_2_1b(),
        full_size_weights(Precision::Fp16),
        Some(16 * GIB)
    )
    .fits());
}

#[test]
fn check_reads_weights_from_the_manifest_and_notes_contrib_ops() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    fake_export(&model, &[Precision::Int4Fp16], Target::Ort);
    let manifest = Manifest::load(&model).unwrap();
    assert_eq!(
        weights_bytes(&model, &manifest, Precision::Int4Fp16).unwrap(),
        full_size_weights(Precision::Int4Fp16)
    );
    let err = weights_bytes(&model, &manifest, Precision::Fp16)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!(
            "{}: precision `fp16` was not exported (this export has: int4-fp16)",
            model.join("ocrctl.json").display()
        )),
        "{err}"
    );

    let out = ocrctl(
        &[
            "profiles",
            "check",
            "16gb",
            "--model",
            model.to_str().unwrap(),
        ],
        None,
        &[],
    );
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    // 881,926,935 bytes = 841.1 MiB.
    assert!(
        text.contains(
            "weights                          841.1     0.821  int4-fp16 graphs of the export"
        ),
        "{text}"
    );
    assert!(
        text.contains("com.microsoft nodes, which TensorRT cannot parse"),
        "{text}"
    );

    let out = ocrctl(
        &[
            "profiles",
            "check",
            "24gb",
            "--model",
            model.to_str().unwrap(),
        ],
        None,
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("precision `fp16` was not exported"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn an_unfused_vision_encoder_on_the_cpu_counts_its_scores() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    fake_export(&model, &[Precision::Int4], Target::TensorRt);
    let out = check_cpu_16(model.as_path());
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    // 16 heads × 12100² patches × 8 B (float32 scores and softmax).
    assert!(
        text.contains("UNFUSED attention: scores 17.45 GiB per layer"),
        "{text}"
    );
    assert!(text.contains("set `max_image_side` to"), "{text}");

    // The same graphs exported for ONNX Runtime (fused attention) fit a 16 GiB host.
    let model2 = dir.path().join("m2");
    fake_export(&model2, &[Precision::Int4], Target::Ort);
    let out = check_cpu_16(model2.as_path());
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(stdout(&out).contains("host memory"));
}

#[test]
fn check_on_a_real_tiny_export_flags_positions_beyond_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny");
    let out = ocrctl(
        &[
            "export",
            "--checkpoint",
            "dummy:tiny",
            "--out",
            model.to_str().unwrap(),
            "--precision",
            "int4",
            "--block-size",
            "16",
        ],
        None,
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let manifest = Manifest::load(&model).unwrap();
    let files: u64 = manifest.graphs[&Precision::Int4]
        .values()
        .map(|g| {
            std::fs::metadata(model.join("onnx").join(&g.file))
                .unwrap()
                .len()
                + std::fs::metadata(model.join("onnx").join(g.data_file.as_ref().unwrap()))
                    .unwrap()
                    .len()
        })
        .sum();
    assert_eq!(
        weights_bytes(&model, &manifest, Precision::Int4).unwrap(),
        files
    );
    // The tiny model has 4096 positions; the cpu profile asks for 6144.
    let out = check_cpu_16(model.as_path());
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(
            "max_sequence_length 6144 exceeds the decoder's max_position_embeddings 4096"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "set `max_sequence_length` to 4096 (now 6144); max_new_tokens_limit then at most 1055"
        ),
        "{text}"
    );
}

#[test]
fn list_show_and_the_profiles_dir_override() {
    let dir = tempfile::tempdir().unwrap();
    // Built-ins by name from any directory.
    let out = ocrctl(&["profiles", "list"], Some(dir.path()), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let rows: Vec<&str> = text.lines().collect();
    assert!(rows[0].starts_with("name  gpu memory  providers"), "{text}");
    assert!(
        rows[1].starts_with("16gb  16 GiB      tensorrt-rtx,tensorrt,cuda,cpu  int4-fp16  6 "),
        "{text}"
    );
    assert!(
        rows.iter()
            .any(|r| r
                .starts_with("cpu   -           cpu                             int4       4 ")),
        "{text}"
    );

    let out = ocrctl(&["profiles", "show", "cpu"], Some(dir.path()), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("# built-in profiles/cpu.yaml\n"), "{text}");
    assert!(text.contains("kv_cache_per_token_kib: 224.0"), "{text}");
    assert!(!text.contains("tensorrt_shapes"), "{text}");
    let out = ocrctl(&["profiles", "show", "16gb"], Some(dir.path()), &[]);
    let text = stdout(&out);
    assert!(
        text.contains("    opt: pixel_values:1x3x1540x1092\n"),
        "{text}"
    );
    assert!(text.contains("max_prompt_tokens: 3041"), "{text}");
    // `show` output (file + derived section) is itself YAML.
    let v: serde_json::Value = yaml_serde::from_str(text.split_once('\n').unwrap().1).unwrap();
    assert_eq!(v["derived"]["kv_cache_at_max_gb"], 5.25);
    assert_eq!(v["max_batch_size"], 6);
    // … and a profile that `check` loads (issue 41 item 3: `show cpu > my.yaml` did not).
    let shown = dir.path().join("shown-16gb.yaml");
    std::fs::write(&shown, &text).unwrap();
    let p = profile::Profile::load(shown.to_str().unwrap()).unwrap();
    assert_eq!(p.max_batch_size, 6);

    // $OCRCTL_PROFILES_DIR overrides a built-in name and adds new names.
    let pdir = dir.path().join("p");
    std::fs::create_dir(&pdir).unwrap();
    let base = profile::builtin("16gb").unwrap();
    std::fs::write(
        pdir.join("16gb.yaml"),
        base.replace("max_batch_size: 6", "max_batch_size: 2"),
    )
    .unwrap();
    std::fs::write(
        pdir.join("a4000.yaml"),
        base.replace("name: 16gb", "name: a4000"),
    )
    .unwrap();
    std::fs::write(pdir.join("broken.yaml"), "name: [").unwrap();
    let env = [(profile::PROFILES_DIR_ENV, pdir.as_path())];
    let out = ocrctl(&["profiles", "show", "16gb"], None, &env);
    assert!(stdout(&out).starts_with(&format!("# {}\n", pdir.join("16gb.yaml").display())));
    assert!(stdout(&out).contains("max_batch_size: 2"));
    let out = ocrctl(&["profiles", "list"], None, &env);
    let text = stdout(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a broken profile makes list fail: {text}"
    );
    assert!(text.contains("a4000 "), "{text}");
    assert!(text.contains("broken  ?"), "{text}");
    assert!(
        text.contains(&format!("INVALID: {}:", pdir.join("broken.yaml").display())),
        "{text}"
    );
}

/// A small model whose `max_position_embeddings` is below the profile's
/// `max_sequence_length` fits in memory: the verdict says the model's limit is at fault, and
/// the advice is the length to use, not memory savings that cannot help (issue 12.4).
#[test]
fn a_models_position_limit_is_not_a_memory_verdict() {
    let d = tempfile::tempdir().unwrap();
    let out_dir = d.path().join("m");
    common::export_fixture(&out_dir, &["--precision", "int4"]);
    let m = out_dir.to_str().unwrap();
    let out = ocrctl(&["profiles", "check", "cpu", "--model", m], None, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("verdict: fits in memory, but the model cannot take these limits"),
        "{text}"
    );
    assert!(text.contains("max_position_embeddings 4096"), "{text}");
    assert!(text.contains("set `max_sequence_length` to 4096"), "{text}");
    assert!(
        !text.contains("cannot fix it") && !text.contains("does NOT fit"),
        "{text}"
    );
}

/// `profiles check` on an export with the GQA decoder says what `--prefill-stage on` would add
/// on a GPU profile (the stage loads the decoder and embeddings again), and not on the CPU.
#[test]
fn check_notes_the_prefill_stages_memory_on_a_gpu_profile() {
    let m = common::exported().to_str().unwrap();
    let note = "--prefill-stage on loads the GQA decoder and embeddings a second time";
    let gpu = stdout(&ocrctl(
        &["profiles", "check", "24gb", "--model", m],
        None,
        &[],
    ));
    let line = gpu
        .lines()
        .find(|l| l.contains(note))
        .unwrap_or_else(|| panic!("{gpu}"));
    assert!(line.ends_with("MiB more"), "{line}");
    // The CPU profile at the export's fp32 (the built-in one is int4).
    let dir = tempfile::tempdir().unwrap();
    let yaml = stdout(&ocrctl(&["profiles", "show", "cpu"], None, &[]));
    let cpu_yaml = dir.path().join("cpu-fp32.yaml");
    let yaml = yaml.split("\n# Derived").next().unwrap();
    std::fs::write(
        &cpu_yaml,
        yaml.replace("precision: int4", "precision: fp32"),
    )
    .unwrap();
    let cpu = ocrctl(
        &[
            "profiles",
            "check",
            cpu_yaml.to_str().unwrap(),
            "--model",
            m,
        ],
        None,
        &[],
    );
    let text = stdout(&cpu);
    assert!(text.contains("verdict"), "{text}{}", stderr(&cpu));
    assert!(!text.contains(note), "{text}");
}
