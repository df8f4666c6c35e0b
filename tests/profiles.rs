//! Hardware profiles: the shipped YAML files, validation errors (file, field, reason), the
//! memory calculator against hand computations, the derived TensorRT shapes, and
//! `ocrctl profiles list|show|check` on fake and real exports.

mod common;

use ocrctl::profile::{
    self, budget, trt_shapes, weights_bytes, ModelDims, Profile, ProfileSource, BUILTIN,
};
use ocrctl_exporters::config::{ModelConfig, LIGHTONOCR_2_1B_CONFIG};
use ocrctl_exporters::export::{Manifest, Precision};
use ocrctl_exporters::graph::GraphInfo;
use ocrctl_exporters::layers::Target;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn ocrctl(args: &[&str], cwd: Option<&Path>, env: &[(&str, &Path)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ocrctl"));
    c.args(args).env_remove(profile::PROFILES_DIR_ENV);
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("ocrctl runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Sizes measured on `ocrctl export --checkpoint dummy:lightonocr-2-1b`: per part, the
/// `.onnx` file and its external data.
fn full_size_graphs(p: Precision) -> [(&'static str, u64, u64); 3] {
    match p {
        Precision::Fp32 => [
            ("decoder_model_merged", 360_597, 2_384_171_008),
            ("embed_tokens", 427, 622_329_856),
            ("vision_encoder", 196_122, 1_644_593_152),
        ],
        Precision::Fp16 => [
            ("decoder_model_merged", 376_756, 1_192_202_240),
            ("embed_tokens", 438, 311_164_928),
            ("vision_encoder", 212_116, 822_403_072),
        ],
        Precision::Int4 => [
            ("decoder_model_merged", 440_299, 372_723_712),
            ("embed_tokens", 476, 311_164_928),
            ("vision_encoder", 268_973, 264_404_992),
        ],
        Precision::Int4Fp16 => [
            ("decoder_model_merged", 456_659, 335_474_688),
            ("embed_tokens", 440, 311_164_928),
            ("vision_encoder", 285_068, 234_545_152),
        ],
    }
}

fn full_size_weights(p: Precision) -> u64 {
    full_size_graphs(p).iter().map(|(_, a, b)| a + b).sum()
}

fn full_size_config() -> ModelConfig {
    let v: serde_json::Value = serde_json::from_str(LIGHTONOCR_2_1B_CONFIG).unwrap();
    ModelConfig::from_json(&v, Path::new("config.json")).unwrap()
}

/// Writes an export directory holding `ocrctl.json` (full-size LightOnOCR-2-1B config) and
/// `.onnx` files of the measured sizes; the external data is only declared (`data_bytes`).
fn fake_export(dir: &Path, precisions: &[Precision], target: Target) {
    std::fs::create_dir_all(dir.join("onnx")).unwrap();
    let mut graphs = BTreeMap::new();
    for &p in precisions {
        let mut parts = BTreeMap::new();
        for (part, onnx_len, data) in full_size_graphs(p) {
            let file = format!("{part}{}.onnx", p.suffix());
            std::fs::write(dir.join("onnx").join(&file), vec![0u8; onnx_len as usize]).unwrap();
            let mut ops = BTreeMap::from([("MatMul".to_string(), 100usize)]);
            if part == "vision_encoder" && target == Target::Ort {
                ops.insert("com.microsoft.MultiHeadAttention".into(), 24);
            }
            parts.insert(
                part.to_string(),
                GraphInfo {
                    data_file: Some(format!("{file}_data")),
                    file,
                    data_bytes: data,
                    inputs: vec![],
                    outputs: vec![],
                    op_counts: ops,
                },
            );
        }
        graphs.insert(p, parts);
    }
    let m = Manifest {
        format: "ocrctl-export/1".into(),
        ocrctl_version: "test".into(),
        source: "fake:lightonocr-2-1b".into(),
        source_dtype: "bf16".into(),
        source_files: vec![],
        checkpoint_digest: "0".repeat(64),
        target,
        ir_version: 10,
        opset: 21,
        precisions: precisions.to_vec(),
        int4: None,
        awq: None,
        model: full_size_config(),
        graphs,
        files: vec![],
        kv_cache: Default::default(),
        kv_layer_scales: vec![],
        engines: Default::default(),
    };
    std::fs::write(
        dir.join("ocrctl.json"),
        serde_json::to_string_pretty(&m).unwrap(),
    )
    .unwrap();
}

fn builtin_profile(name: &str) -> Profile {
    Profile::parse(
        profile::builtin(name).unwrap(),
        ProfileSource::BuiltIn(name.into()),
    )
    .unwrap()
}

#[test]
fn every_shipped_profile_parses_validates_and_matches_its_file() {
    let names: Vec<&str> = BUILTIN.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["16gb", "24gb", "80gb", "cpu"]);
    for (name, text) in BUILTIN {
        let path = repo().join("profiles").join(format!("{name}.yaml"));
        let on_disk = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            &on_disk, text,
            "{name}: embedded copy differs from the file"
        );
        let p = Profile::load(path.to_str().unwrap()).unwrap();
        assert_eq!(p.name, *name);
        assert_eq!(p.source, ProfileSource::File(path.clone()));
        let by_name = Profile::load(name).unwrap();
        assert_eq!(by_name.source, ProfileSource::BuiltIn(name.to_string()));
        assert_eq!(by_name.max_batch_size, p.max_batch_size);
        // Every field of every shipped profile carries a comment line above it.
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            let t = l.trim_start();
            if t.is_empty() || t.starts_with('#') || t.ends_with(':') {
                continue;
            }
            assert!(
                i > 0 && lines[i - 1].trim_start().starts_with('#'),
                "{name}.yaml line {}: `{t}` has no comment above it",
                i + 1
            );
        }
    }
    let p16 = builtin_profile("16gb");
    assert_eq!(p16.precision, Precision::Int4Fp16);
    assert_eq!(p16.max_sequence_length, 8192);
    assert_eq!(builtin_profile("cpu").gpu_memory_gb, 0.0);
    assert!(builtin_profile("80gb").max_batch_size > builtin_profile("24gb").max_batch_size);
}

#[test]
fn every_shipped_profile_fits_the_full_size_model() {
    let d = ModelDims::lightonocr_2_1b();
    for (name, _) in BUILTIN {
        let p = builtin_profile(name);
        // The CPU profile is sized for a 16 GiB host.
        let cap = (!p.uses_gpu()).then_some(16 * GIB);
        let b = budget(&p, &d, full_size_weights(p.precision), cap);
        assert!(b.fits(), "{name} does not fit:\n{b}");
        assert!(b.advice().is_empty());
        assert!(b.kv_cache <= b.kv_budget, "{name}");
    }
}

#[test]
fn kv_cache_row_equals_the_hand_computation() {
    let d = ModelDims::lightonocr_2_1b();
    // 28 layers × (key + value) × 8 kv heads × 128 × 2 bytes = 112 KiB per token.
    let per_token: u64 = 28 * 2 * 8 * 128 * 2;
    assert_eq!(per_token, 112 * 1024);
    assert_eq!(d.kv_bytes_per_token(2), per_token);
    let p = builtin_profile("16gb");
    let b = budget(&p, &d, full_size_weights(p.precision), None);
    let kv = b.rows.iter().find(|r| r.item == "KV cache").unwrap();
    assert_eq!(kv.bytes, 6 * 8192 * per_token);
    assert_eq!(kv.bytes, 5376 * MIB);
    assert_eq!(b.kv_cache, 5376 * MIB);
    // The concat-based decoder holds past and present during a step.
    let copy = b.rows.iter().find(|r| r.item == "KV step copy").unwrap();
    assert_eq!(copy.bytes, kv.bytes);
    // float32 activations double it: the CPU profile at 4 × 6144 tokens.
    let c = builtin_profile("cpu");
    let b = budget(&c, &d, full_size_weights(c.precision), Some(16 * GIB));
    assert_eq!(b.kv_cache, 4 * 6144 * 224 * 1024);
    // The whole 16gb table: fixed rows by hand, total = sum.
    let p = builtin_profile("16gb");
    let b = budget(&p, &d, full_size_weights(p.precision), None);
    let row = |n: &str| b.rows.iter().find(|r| r.item == n).unwrap().bytes;
    assert_eq!(row("weights"), 881_926_935);
    assert_eq!(row("logits"), 6 * 151_936 * 4);
    assert_eq!(row("TensorRT workspace"), GIB);
    assert_eq!(row("runtime overhead"), 896 * MIB);
    assert_eq!(b.total, b.rows.iter().map(|r| r.bytes).sum::<u64>());
    assert_eq!(b.capacity, Some(16 * GIB));
}

#[test]
fn tensorrt_shapes_of_the_16gb_profile_are_exact() {
    let s = trt_shapes(&builtin_profile("16gb"), &ModelDims::lightonocr_2_1b());
    assert_eq!(s.vision_encoder.min, "pixel_values:1x3x28x28");
    assert_eq!(s.vision_encoder.opt, "pixel_values:1x3x1540x1092");
    assert_eq!(s.vision_encoder.max, "pixel_values:1x3x1540x1540");
    assert_eq!(s.embed_tokens.min, "input_ids:1x1");
    assert_eq!(s.embed_tokens.opt, "input_ids:6x1");
    assert_eq!(s.embed_tokens.max, "input_ids:6x8192");
    let expect = |head: &str, kv: &str| {
        let mut v = vec![head.to_string()];
        for i in 0..28 {
            v.push(format!("past_key_values.{i}.key:{kv}"));
            v.push(format!("past_key_values.{i}.value:{kv}"));
        }
        v.join(",")
    };
    assert_eq!(
        s.decoder.min,
        expect(
            "inputs_embeds:1x1x1024,attention_mask:1x1,position_ids:1x1",
            "1x8x0x128"
        )
    );
    assert_eq!(
        s.decoder.opt,
        expect(
            "inputs_embeds:6x1x1024,attention_mask:6x4097,position_ids:6x1",
            "6x8x4096x128"
        )
    );
    assert_eq!(
        s.decoder.max,
        expect(
            "inputs_embeds:6x8192x1024,attention_mask:6x16383,position_ids:6x8192",
            "6x8x8191x128"
        )
    );
    assert_eq!(s.decoder.max.split(',').count(), 3 + 2 * 28);
    assert!(s
        .decoder
        .max
        .ends_with(",past_key_values.27.value:6x8x8191x128"));
}

/// `(what to replace, replacement, text the error must contain)` on the 16gb profile.
const INVALID: &[(&str, &str, &str)] = &[
    (
        "queue_size: 64",
        "queue_size: 64\ncolour: blue",
        "unknown field `colour`",
    ),
    (
        "max_batch_size: 6",
        "max_batch_size: six",
        "max_batch_size: invalid type: string \"six\", expected u32",
    ),
    (
        "max_batch_size: 6",
        "max_batch_size: 0",
        "field `max_batch_size`: must be at least 1",
    ),
    (
        "max_image_side: 1540",
        "max_image_side: 1000",
        "field `max_image_side`: 1000 is not a multiple of 28 (patch 14 × merge 2); use 980 or 1008",
    ),
    (
        "max_image_side: 1540",
        "max_image_side: 1568",
        "field `max_image_side`: 1568 is outside 28..=1540",
    ),
    (
        "default_max_new_tokens: 4096",
        "default_max_new_tokens: 6000",
        "field `default_max_new_tokens`: 6000 is more than max_new_tokens_limit 5120",
    ),
    (
        "max_new_tokens_limit: 5120",
        "max_new_tokens_limit: 8192",
        "field `max_new_tokens_limit`: 8192 is not less than max_sequence_length 8192",
    ),
    (
        "max_sequence_length: 8192",
        "max_sequence_length: 6144",
        "field `max_sequence_length`: 6144 cannot hold a 1540×1540 page (3025 image + 16 template tokens) plus max_new_tokens_limit 5120: needs 8161",
    ),
    (
        "compute_capabilities: [sm86, sm89, sm120]",
        "compute_capabilities: [sm86, sm90]",
        "field `tensorrt_rtx.compute_capabilities`: `sm90` is not one TensorRT-RTX targets (sm86, sm89, sm120, sm121)",
    ),
    (
        "providers: [tensorrt-rtx, tensorrt, cuda, cpu]",
        "providers: []",
        "field `providers`: is empty",
    ),
    (
        "providers: [tensorrt-rtx, tensorrt, cuda, cpu]",
        "providers: [cuda, cpu, cuda]",
        "field `providers`: `cuda` is listed twice",
    ),
    (
        "providers: [tensorrt-rtx, tensorrt, cuda, cpu]",
        "providers: [tensorrt, rocm]",
        "providers[1]: unknown variant `rocm`, expected one of `tensorrt`, `tensorrt-rtx`, `cuda`, `cpu`",
    ),
    (
        "gpu_memory_gb: 16",
        "gpu_memory_gb: 0",
        "field `gpu_memory_gb`: is 0 but providers lists the GPU provider(s) tensorrt-rtx, tensorrt, cuda",
    ),
    (
        "precision: int4-fp16",
        "precision: int8",
        "precision: unknown variant `int8`, expected one of `fp32`, `fp16`, `int4`, `int4-fp16`",
    ),
    (
        "kv_cache_gb: 5.5",
        "kv_cache_gb: 20",
        "field `kv_cache_gb`: 20 is more than gpu_memory_gb 16",
    ),
    (
        "builder_optimization_level: 3",
        "builder_optimization_level: 7",
        "field `tensorrt.builder_optimization_level`: 7 is outside 0..=5",
    ),
    (
        "arena_extend_strategy: same_as_requested",
        "arena_extend_strategy: grow",
        "cuda.arena_extend_strategy: unknown variant `grow`",
    ),
    (
        "memory_limit_gb: 13.5",
        "memory_limit_gb: 17",
        "field `cuda.memory_limit_gb`: 17 is more than gpu_memory_gb 16",
    ),
    (
        "  workspace_gb: 1",
        "  workspace_gb: 1\n  workspace_mb: 1024",
        "tensorrt: unknown field `workspace_mb`",
    ),
    ("queue_size: 64\n", "", "missing field `queue_size`"),
    (
        "cuda_graphs: false",
        "cuda_graphs: \"no\"",
        "tensorrt_rtx.cuda_graphs: invalid type: string \"no\", expected a boolean",
    ),
];

#[test]
fn each_invalid_value_names_the_file_field_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let base = profile::builtin("16gb").unwrap();
    for (i, (from, to, want)) in INVALID.iter().enumerate() {
        assert!(base.contains(from), "case {i}: `{from}` not in 16gb.yaml");
        let path = dir.path().join(format!("bad{i}.yaml"));
        std::fs::write(&path, base.replacen(from, to, 1)).unwrap();
        let err = Profile::load(path.to_str().unwrap())
            .expect_err(&format!("case {i} ({to}) should be rejected"))
            .to_string();
        assert!(
            err.starts_with(&format!("{}: ", path.display())),
            "case {i}: error does not start with the file: {err}"
        );
        assert!(err.contains(want), "case {i}: `{err}` lacks `{want}`");
    }
}

#[test]
fn a_cpu_only_profile_may_state_gpu_memory_but_a_gpu_profile_needs_it() {
    let cpu = profile::builtin("cpu").unwrap();
    let p = Profile::parse(
        &cpu.replace("gpu_memory_gb: 0", "gpu_memory_gb: 8"),
        ProfileSource::Inline,
    )
    .unwrap();
    assert!(!p.uses_gpu());
    let err = Profile::parse(
        &cpu.replace("providers: [cpu]", "providers: [cuda, cpu]"),
        ProfileSource::Inline,
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "<inline profile>: field `gpu_memory_gb`: is 0 but providers lists the GPU provider(s) \
         cuda (give the GPU memory in GiB, or list only cpu)"
    );
    let err = Profile::parse(
        &cpu.replace("providers: [cpu]", "providers: [cpu, tensorrt]")
            .replace("gpu_memory_gb: 0", "gpu_memory_gb: 8"),
        ProfileSource::Inline,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("field `tensorrt`: is missing but providers lists tensorrt"),
        "{err}"
    );
}

#[test]
fn unknown_names_list_the_builtins_and_folders() {
    let err = Profile::load("a100").unwrap_err().to_string();
    assert!(
        err.starts_with(
            "profile `a100` not found: it is not a built-in (16gb, 24gb, 80gb, cpu) and no `a100.yaml` is in"
        ),
        "{err}"
    );
    assert!(
        err.contains(&repo().join("profiles").display().to_string()),
        "{err}"
    );
    let err = Profile::load("no/such/file.yaml").unwrap_err().to_string();
    assert!(
        err.starts_with("no/such/file.yaml: cannot read the profile:"),
        "{err}"
    );
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
    let out = ocrctl(
        &[
            "profiles",
            "check",
            "cpu",
            "--model",
            model.to_str().unwrap(),
            "--memory",
            "16",
        ],
        None,
        &[],
    );
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
    let out = ocrctl(
        &[
            "profiles",
            "check",
            "cpu",
            "--model",
            model2.to_str().unwrap(),
            "--memory",
            "16",
        ],
        None,
        &[],
    );
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
    let out = ocrctl(
        &[
            "profiles",
            "check",
            "cpu",
            "--model",
            model.to_str().unwrap(),
            "--memory",
            "16",
        ],
        None,
        &[],
    );
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
