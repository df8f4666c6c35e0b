//! Tests of profiles: schema, validation, shapes and budgets.

use super::*;

fn yaml_16gb() -> &'static str {
    builtin("16gb").unwrap()
}

fn parse(text: &str) -> Result<Profile, ProfileError> {
    Profile::parse(text, ProfileSource::File("t/p.yaml".into()))
}

/// Replaces the line starting with `key:` (first occurrence) by `key: value`.
fn with(text: &str, key: &str, value: &str) -> String {
    let mut done = false;
    text.lines()
        .map(|l| {
            if !done && l.trim_start().starts_with(&format!("{key}:")) {
                done = true;
                let indent = &l[..l.len() - l.trim_start().len()];
                format!("{indent}{key}: {value}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn dims_of_the_embedded_config_are_lightonocr_2_1b() {
    let d = ModelDims::lightonocr_2_1b();
    // The published model card's figures: 28 decoder layers of width 1024 with 16 query and
    // 8 key/value heads of 128, a 24-layer Pixtral encoder of width 1024, 1540 px images.
    assert_eq!(
        (
            d.text_layers,
            d.text_hidden,
            d.text_heads,
            d.text_kv_heads,
            d.text_head_dim
        ),
        (28, 1024, 16, 8, 128)
    );
    assert_eq!(
        (d.vision_layers, d.vision_hidden, d.patch, d.merge),
        (24, 1024, 14, 2)
    );
    assert_eq!(
        (d.image_size, d.vocab, d.max_positions),
        (1540, 151936, 16384)
    );
}

#[test]
fn kv_per_token_is_112_kib_in_16_bit() {
    let d = ModelDims::lightonocr_2_1b();
    assert_eq!(d.kv_bytes_per_token(2), 28 * 2 * 8 * 128 * 2);
    assert_eq!(d.kv_bytes_per_token(2), 112 * 1024);
    assert_eq!(d.kv_bytes_per_token(4), 224 * 1024);
    assert_eq!(d.image_tokens(1540, 1540), 3025);
    assert_eq!(d.image_tokens(1540, 1092), 2145);
    assert_eq!(d.patches(1540, 1540), 12100);
}

#[test]
fn a4_page_at_1540_is_1540_by_1092() {
    assert_eq!(a4_page(1540, 28), (1540, 1092));
    assert_eq!(a4_page(1120, 28), (1120, 812));
    assert_eq!(a4_page(28, 28), (28, 28));
}

#[test]
fn wrong_type_names_file_and_field() {
    let e = parse(&with(yaml_16gb(), "max_batch_size", "\"lots\""))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("t/p.yaml: "), "{e}");
    assert!(e.contains("max_batch_size"), "{e}");
    assert!(e.contains("invalid type"), "{e}");
}

#[test]
fn nested_unknown_field_is_named() {
    let t = yaml_16gb().replace("  cuda_graphs:", "  cuda_graph_typo: false\n  cuda_graphs:");
    let e = parse(&t).unwrap_err().to_string();
    assert!(e.contains("t/p.yaml"), "{e}");
    assert!(e.contains("unknown field `cuda_graph_typo`"), "{e}");
}

#[test]
fn gb_fields_reject_nan_and_negative() {
    let e = parse(&with(yaml_16gb(), "kv_cache_gb", ".nan"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("field `kv_cache_gb`") && e.contains("finite"),
        "{e}"
    );
    let e = parse(&with(yaml_16gb(), "workspace_gb", "-1"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("field `tensorrt.workspace_gb`: -1 is negative"),
        "{e}"
    );
}

#[test]
fn missing_provider_section_is_named() {
    let t: String = yaml_16gb().split("\ncuda:").next().unwrap().to_string();
    // Everything from the cuda section on is gone (cuda and cpu sections).
    let e = parse(&t).unwrap_err().to_string();
    assert!(
        e.contains("field `cuda`: is missing but providers lists cuda"),
        "{e}"
    );
}

#[test]
fn decoder_shapes_at_min_opt_max() {
    let d = ModelDims {
        text_layers: 2,
        ..ModelDims::lightonocr_2_1b()
    };
    assert_eq!(
        decoder_shapes(&d, 1, 1, 0, 1),
        "inputs_embeds:1x1x1024,attention_mask:1x1,position_ids:1x1,\
         past_key_values.0.key:1x8x0x128,past_key_values.0.value:1x8x0x128,\
         past_key_values.1.key:1x8x0x128,past_key_values.1.value:1x8x0x128"
    );
    assert!(decoder_shapes(&d, 4, 1, 100, 101).starts_with(
        "inputs_embeds:4x1x1024,attention_mask:4x101,position_ids:4x1,past_key_values.0.key:4x8x100x128"
    ));
    assert!(decoder_shapes(&d, 4, 512, 511, 512)
        .starts_with("inputs_embeds:4x512x1024,attention_mask:4x512,position_ids:4x512"));
}

#[test]
fn names_and_paths_are_told_apart() {
    assert!(looks_like_path("./16gb.yaml"));
    assert!(looks_like_path("16gb.yml"));
    assert!(looks_like_path("dir/16gb"));
    assert!(!looks_like_path("16gb"));
    assert!(valid_name("a100-40gb_v2.1"));
    assert!(!valid_name(".hidden"));
    assert!(!valid_name("a b"));
    assert!(!valid_name(""));
    let e = Profile::load("bad name").unwrap_err().to_string();
    assert!(e.starts_with("profile `bad name` not found"), "{e}");
}

#[test]
fn an_fp32_profile_is_advised_to_16_bit_activations() {
    // The cpu profile (int4, float32 activations) on a 12 GiB host: fp16 activations
    // halve the KV cache (2 × 5.25 → 2 × 2.625 GiB) and fit, and so does a smaller batch.
    let p = Profile::parse(
        builtin("cpu").unwrap(),
        ProfileSource::BuiltIn("cpu".into()),
    )
    .unwrap();
    let d = ModelDims::lightonocr_2_1b();
    let b = budget(&p, &d, 949 * MIB, Some(12 * GIB));
    assert!(!b.fits());
    assert_eq!(
        b.problems,
        vec![Problem::Memory {
            total: b.total,
            usable: (12.0 * GIB as f64 * 0.95) as u64
        }]
    );
    let adv = b.advice();
    let prec = adv.iter().find(|a| a.field == "precision").unwrap();
    assert_eq!(prec.suggested.as_deref(), Some("fp16"));
    let batch = adv.iter().find(|a| a.field == "max_batch_size").unwrap();
    // 11.4 usable GiB − 3.39 GiB of weights, activations and runtime = 8.0 GiB for
    // sequences of 2 × 6144 × 224 KiB = 2.625 GiB each: 3.
    assert_eq!(batch.suggested.as_deref(), Some("3"));
    assert_eq!(
        batch.to_string(),
        "set `max_batch_size` to 3 (now 4); KV cache 3.94 GiB at 3 sequences"
    );
}

#[test]
fn kv_budget_and_arena_limits_are_checked() {
    let t = with(yaml_16gb(), "kv_cache_gb", "4");
    let p = parse(&with(&t, "memory_limit_gb", "10")).unwrap();
    let b = budget(&p, &ModelDims::lightonocr_2_1b(), 900 * MIB, None);
    assert!(!b.fits());
    assert!(b.problems.contains(&Problem::KvBudget {
        need: 5376 * MIB,
        budget: 4 * GIB
    }));
    assert!(matches!(b.problems.last(), Some(Problem::Arena { limit, .. }) if *limit == 10 * GIB));
    let adv: Vec<String> = b.advice().iter().map(|a| a.to_string()).collect();
    assert!(
        adv.iter()
            .any(|a| a.starts_with("set `kv_cache_gb` to 5.25 (now 4)")),
        "{adv:?}"
    );
    assert!(
        adv.iter()
            .any(|a| a.starts_with("set `cuda.memory_limit_gb` to")),
        "{adv:?}"
    );
    // Batch 4: KV 3.5 GiB within 4, arena within 10 GiB.
    assert_eq!(b.advice()[0].suggested.as_deref(), Some("4"));
}

#[test]
fn budget_rows_for_a_small_profile_by_hand() {
    let p = parse(
        &with(
            &with(
                &with(yaml_16gb(), "max_batch_size", "2"),
                "max_sequence_length",
                "4096",
            ),
            "max_new_tokens_limit",
            "1024",
        )
        .replace(
            "default_max_new_tokens: 4096",
            "default_max_new_tokens: 1024",
        ),
    )
    .unwrap();
    let d = ModelDims::lightonocr_2_1b();
    let b = budget(&p, &d, 1000 * MIB, Some(16 * GIB));
    let row = |n: &str| b.rows.iter().find(|r| r.item == n).unwrap().bytes;
    assert_eq!(row("KV cache"), 2 * 4096 * 112 * 1024);
    assert_eq!(row("KV step copy"), 2 * 4096 * 112 * 1024);
    assert_eq!(row("logits"), 2 * 151936 * 4);
    assert_eq!(row("weights"), 1000 * MIB);
    // 12100 patches × (6·1024 + 3·4096) × 2 B + pixel values 3 × 1540² × 2 B.
    assert_eq!(
        row("vision activations"),
        12100 * (6 * 1024 + 3 * 4096) * 2 + 3 * 1540 * 1540 * 2
    );
    // 3041 tokens × (6·1024 + 3·16·128 + 3·3072) × 2 B + 16 × 3041² × 8 B + 3041² B.
    assert_eq!(
        row("decoder prefill"),
        3041 * (6 * 1024 + 3 * 16 * 128 + 3 * 3072) * 2 + 16 * 3041 * 3041 * 8 + 3041 * 3041
    );
    assert_eq!(b.total, b.rows.iter().map(|r| r.bytes).sum::<u64>());
    assert!(b.fits(), "{b}");
    assert!(b.advice().is_empty());
}

#[test]
fn a_prefill_stage_adds_its_second_copy_of_the_decoder() {
    let p = parse(yaml_16gb()).unwrap();
    let d = ModelDims::lightonocr_2_1b();
    let plain = budget(&p, &d, 1000 * MIB, Some(16 * GIB));
    assert!(plain.rows.iter().all(|r| r.item != "prefill stage weights"));
    let opts = BudgetOptions {
        stage_weights_bytes: 300 * MIB,
        ..BudgetOptions::default()
    };
    let staged = budget_with(&p, &d, 1000 * MIB, Some(16 * GIB), opts);
    let row = staged
        .rows
        .iter()
        .find(|r| r.item == "prefill stage weights")
        .expect("a row for the stage");
    assert_eq!(row.bytes, 300 * MIB);
    assert!(row.detail.contains("--prefill-stage on"), "{}", row.detail);
    assert_eq!(staged.total, plain.total + 300 * MIB);
}

#[test]
fn an_8bit_kv_cache_halves_the_kv_row_of_a_16bit_profile() {
    let p = parse(yaml_16gb()).unwrap();
    let d = ModelDims::lightonocr_2_1b();
    let plain = budget(&p, &d, 1000 * MIB, Some(16 * GIB));
    let opts = BudgetOptions {
        kv_element_bytes: Some(1),
        ..BudgetOptions::default()
    };
    let small = budget_with(&p, &d, 1000 * MIB, Some(16 * GIB), opts);
    assert_eq!(small.kv_cache * 2, plain.kv_cache);
    let row = small.rows.iter().find(|r| r.item == "KV cache").unwrap();
    assert!(row.detail.ends_with("× 1 B)"), "{}", row.detail);
}
