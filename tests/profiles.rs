//! Hardware profiles: the shipped YAML files, validation errors (file, field, reason), the
//! memory calculator against hand computations and the derived TensorRT shapes.
//! `ocrctl profiles check|list|show` on fake and real exports: `tests/profiles_check.rs`.

mod common;
mod profiles_support;

use ocrctl::profile::{self, budget, trt_shapes, ModelDims, Profile, ProfileSource, BUILTIN};
use ocrctl_exporters::export::Precision;
use profiles_support::*;

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
