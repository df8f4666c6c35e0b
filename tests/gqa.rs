//! The GQA decoder (`ocrctl export --decoder gqa`: GroupQueryAttention over a KV cache that
//! the model allocates once and updates in place) against the transformers goldens on the
//! CPU, alone and through the continuous-batching engine with sequences joining and leaving.

mod common;
use common::golden::{check_top5, golden, ids};
use common::*;
use ocrctl::generation::engine::{Engine, EngineError, GenRequest};
use ocrctl::generation::generate::Generation;
use ocrctl::generation::sampling::SamplingParams;
use ocrctl::model::preprocess::{self, PreprocessConfig};
use ocrctl::model::prompt::Prompter;
use ocrctl::runtime::backend::Backend;
use ocrctl::runtime::ortmodel::{LoadOptions, OrtModel};
use ocrctl_exporters::export::{DecoderVariant, ExportOptions, Precision};
use ocrctl_exporters::kv_cache::KvCache;
use ocrctl_exporters::manifest::Manifest;
use std::path::Path;

/// Same tolerances as `tests/parity.rs`.
const FP32_LOGPROB_TOL: f32 = 1e-3;
const FP16_LOGPROB_TOL: f32 = 0.05;

/// The fixture export (fp32, fp16), which has both decoders by default.
fn export() -> &'static Path {
    exported()
}

fn load(precision: Precision, slots: usize, max_seq: usize) -> OrtModel {
    load_staged(precision, slots, max_seq, false)
}

fn load_from(dir: &Path, precision: Precision, slots: usize, max_seq: usize) -> OrtModel {
    let opts = LoadOptions {
        decoder: Some(DecoderVariant::Gqa),
        kv_slots: slots,
        max_sequence_length: max_seq,
        ..LoadOptions::new(precision)
    };
    OrtModel::load(dir, &opts).expect("model loads")
}

/// With `staged`, the vision and prefill stages run on the CPU too (they are GPU-only
/// otherwise): pages are encoded and prefilled on the stage's thread, with its own decoder
/// session, while the engine's thread runs decode steps over the same KV buffers.
fn load_staged(precision: Precision, slots: usize, max_seq: usize, staged: bool) -> OrtModel {
    let opts = LoadOptions {
        decoder: Some(DecoderVariant::Gqa),
        kv_slots: slots,
        max_sequence_length: max_seq,
        stages_on_cpu: staged,
        prefill_stage: staged,
        ..LoadOptions::new(precision)
    };
    let m = OrtModel::load(export(), &opts).expect("model loads");
    assert_eq!(m.decoder_variant(), DecoderVariant::Gqa);
    m
}

/// 40 greedy steps per fixture image through the engine (`Engine::run`: prefill, then B = 1
/// decode runs in the sequence's slot): ids exact, top-5 log-probabilities within `tol`.
fn check_generation(precision: Precision, tol: f32) {
    check_generation_in(export(), precision, tol);
}

/// [`check_generation`] on the export in `dir`.
fn check_generation_in(dir: &Path, precision: Precision, tol: f32) {
    let g = golden();
    let image_token = g.json["image_token_id"].as_u64().unwrap() as u32;
    let mut engine = Engine::new(load_from(dir, precision, 1, 0), 1, image_token);
    let prompter = Prompter::from_model_dir(export(), image_token).unwrap();
    let cfg = PreprocessConfig::from_model_dir(export(), 14, 2).unwrap();
    let mut worst = 0f32;
    for im in g.images() {
        let stem = im["stem"].as_str().unwrap();
        let want = ids(&im["greedy_ids"]);
        let p = preprocess::preprocess(&g.reference_image(im), &cfg);
        let prompt = prompter.encode(&[p.num_image_tokens], None).unwrap();
        // One slot only: each image's cache must be freed for the next to get it.
        let out = engine_greedy(&mut engine, prompt, p.pixel_values, want.len());
        assert_eq!(out.token_ids, want, "{stem} ({precision:?}): greedy ids");
        worst = worst.max(check_top5(stem, &out.top_logprobs, &im["top5"], tol));
    }
    eprintln!("GQA {precision:?}: max top-5 logprob difference {worst}");
}

#[test]
fn fp32_gqa_greedy_generation_matches_the_reference() {
    check_generation(Precision::Fp32, FP32_LOGPROB_TOL);
}

#[test]
fn fp16_gqa_greedy_generation_matches_the_reference() {
    check_generation(Precision::Fp16, FP16_LOGPROB_TOL);
}

/// The fixture exported fp32 with the GQA decoder only and `kv`/`pad` (see
/// `ExportOptions::kv_cache`, `ExportOptions::pad_query_heads`), in a temporary directory.
fn export_kv(kv: KvCache, pad: bool) -> (tempfile::TempDir, std::path::PathBuf, Manifest) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("kv");
    let opts = ExportOptions {
        precisions: vec![Precision::Fp32],
        decoders: vec![DecoderVariant::Gqa],
        kv_cache: kv,
        pad_query_heads: pad,
        ..ExportOptions::new(checkpoint().to_string_lossy().into(), out.clone())
    };
    let m = ocrctl_exporters::export::export(&opts, &mut |_| {}).expect("export");
    assert_eq!(m.kv_cache, kv);
    (dir, out, m)
}

/// The query heads padded as for an 8-bit cache (zero rows in q_proj, zero columns in
/// o_proj: 4 query heads per KV head instead of the fixture's 2) over the exact fp32 cache:
/// the reference's ids and log-probabilities, so the padding by itself changes nothing.
#[test]
fn padded_query_heads_change_nothing() {
    let (_dir, out, m) = export_kv(KvCache::Activation, true);
    // Layer 0's packed q/k/v weight: 4 query heads per KV head, then the keys and values.
    let t = &m.model.text;
    let graph = std::fs::read(out.join("onnx/decoder_model_gqa.onnx")).unwrap();
    let (_, inits) = ocrctl_exporters::proto::read::summarize(&graph).unwrap();
    let qkv = inits
        .iter()
        .find(|i| i.name.contains("layers.0.self_attn.qkv_proj"))
        .expect("packed q/k/v weight");
    let rows = (4 + 2) * t.num_kv_heads * t.head_dim;
    assert_eq!(qkv.elements as usize, rows * t.hidden_size);
    check_generation_in(&out, Precision::Fp32, FP32_LOGPROB_TOL);
}

/// An int8 KV cache on the CPU (ONNX Runtime's CPU kernel takes int8; fp8 runs on CUDA only,
/// checked by scripts/gpu/gpu_kv_cache.sh): the cache is allocated at one byte per element, a
/// quarter of the fp32 cache, and the first 16 greedy ids of every fixture image are the
/// reference's. Not all 40: this tiny model's top logits lie close, and one scale per tensor
/// (0.1 here) moves a few of them past each other late in some pages.
#[test]
fn an_int8_cache_holds_a_byte_per_element_and_keeps_the_reference_ids() {
    let (_dir, out, m) = export_kv(KvCache::Int8 { scale: 0.1 }, false);
    check_int8_cache(&out, &m);
}

/// `export --kv-cache int8 --calibrate DIR` without `--kv-scale`: the fp32 graphs run on the
/// folder's pages first and the scale is the largest |key| or |value| they put in the cache
/// ÷ 127 (nothing clipped). The manifest records it, the export says the measured range, and
/// the cache keeps the reference's ids as a hand-picked scale does.
#[test]
fn an_int8_cache_scaled_by_calibration_keeps_the_reference_ids() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("calibrated");
    let images = fixture().join("images");
    let log = export_fixture(
        &out,
        &[
            "--precision",
            "fp32",
            "--decoder",
            "gqa",
            "--kv-cache",
            "int8",
            "--calibrate",
            images.to_str().unwrap(),
        ],
    );
    let m = Manifest::load(&out).unwrap();
    let KvCache::Int8 { scale } = m.kv_cache else {
        panic!("calibrated export records {:?}", m.kv_cache)
    };
    let absmax: f32 = log
        .split("generated tokens: ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no measured range in:\n{log}"));
    // Generated tokens counted too: at least one per page, at most the limit per page.
    let generated: usize = log
        .split("prompts and ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no generated-token count in:\n{log}"));
    let pages = ocrctl::quality::calibrate::image_files(&images)
        .unwrap()
        .len();
    assert!(
        (pages..=pages * ocrctl::quality::calibrate::KV_DECODE_TOKENS).contains(&generated),
        "{generated} tokens for {pages} pages"
    );
    assert!(
        absmax > 0.0 && (scale * 127.0 - absmax).abs() <= 1e-5 * absmax,
        "{scale} {absmax}"
    );
    // One scale per layer, the largest being the cache's, each in its own graph tensor.
    let per_layer = &m.kv_layer_scales;
    assert_eq!(per_layer.len(), m.model.text.num_layers);
    assert!(
        per_layer.iter().all(|s| *s > 0.0 && *s <= scale),
        "{per_layer:?}"
    );
    assert!(per_layer.contains(&scale), "{per_layer:?} {scale}");
    let graph = std::fs::read(out.join("onnx/decoder_model_gqa.onnx")).unwrap();
    let (_, inits) = ocrctl_exporters::proto::read::summarize(&graph).unwrap();
    for i in 0..per_layer.len() {
        let name = format!("decoder_kv_cache_scale.{i}");
        assert!(inits.iter().any(|t| t.name == name), "{name}");
    }
    check_int8_cache(&out, &m);
}

/// An int8 cache export `out` (manifest `m`): one byte per element in the graph and in the
/// memory the model allocates, and the first 16 greedy ids of every fixture image.
fn check_int8_cache(out: &Path, m: &Manifest) {
    let cache_input = m.graphs[&Precision::Fp32]["decoder_gqa"]
        .inputs
        .iter()
        .find(|i| i.name == "past_key_values.0.key")
        .expect("cache input");
    assert_eq!(cache_input.dtype, "int8");
    let (slots, max_seq) = (2, 512);
    let exact = load(Precision::Fp32, slots, max_seq)
        .kv_cache_bytes()
        .unwrap();
    let model = load_from(out, Precision::Fp32, slots, max_seq);
    assert_eq!(model.kv_cache_bytes().unwrap() * 4, exact);
    let g = golden();
    let image_token = g.json["image_token_id"].as_u64().unwrap() as u32;
    let mut engine = Engine::new(model, 1, image_token);
    let prompter = Prompter::from_model_dir(out, image_token).unwrap();
    let cfg = PreprocessConfig::from_model_dir(out, 14, 2).unwrap();
    for im in g.images() {
        let want = ids(&im["greedy_ids"]);
        let p = preprocess::preprocess(&g.reference_image(im), &cfg);
        let prompt = prompter.encode(&[p.num_image_tokens], None).unwrap();
        let out = engine_greedy(&mut engine, prompt, p.pixel_values, want.len());
        assert_eq!(out.token_ids[..16], want[..16], "{}", im["stem"]);
    }
}

/// Six requests with different lengths through the engine at batch 3 (3 slots): slots are
/// taken, freed and reused as requests finish at different steps, decode steps mix
/// sequences of different lengths in one run, and every request gets the reference's ids.
/// Also with the stages: pages prefilled on the stage's thread into reserved slots while
/// the engine's decode steps run over the same buffers.
#[test]
fn batched_gqa_with_joins_and_leaves_equals_the_reference() {
    let g = golden();
    let image_token = g.json["image_token_id"].as_u64().unwrap() as u32;
    let prompter = Prompter::from_model_dir(export(), image_token).unwrap();
    let cfg = PreprocessConfig::from_model_dir(export(), 14, 2).unwrap();
    let cases = [Precision::Fp32, Precision::Fp16]
        .into_iter()
        .flat_map(|p| [(p, false), (p, true)]);
    for (precision, staged) in cases {
        let mut engine = Engine::new(load_staged(precision, 3, 0, staged), 3, image_token);
        let stage = engine.vision.as_ref().map(|v| v.prefills());
        assert_eq!(stage, staged.then_some(true), "{precision:?}: stages");
        let images = g.images();
        let lens = [40, 17, 40, 9, 28, 33];
        let mut wants = Vec::new();
        let reqs: Vec<GenRequest> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let im = &images[i % images.len()];
                wants.push(ids(&im["greedy_ids"])[..n].to_vec());
                let p = preprocess::preprocess(&g.reference_image(im), &cfg);
                GenRequest {
                    prompt_ids: prompter.encode(&[p.num_image_tokens], None).unwrap(),
                    images: vec![p.pixel_values],
                    params: SamplingParams::greedy(),
                    max_new_tokens: n,
                    stop_ids: vec![],
                    ignore_eos: true,
                    // One request wants log-probabilities: its rows bring the logits to the
                    // host while the others take the device's argmax, in the same steps.
                    logprobs: i == 2,
                    top_logprobs: 0,
                }
            })
            .collect();
        // Twice: the second run finds every slot free again.
        for round in 0..2 {
            let out = engine.run(reqs.clone(), &mut |_| {});
            for (i, (o, want)) in out.iter().zip(&wants).enumerate() {
                let o = o.as_ref().unwrap_or_else(|e| panic!("request {i}: {e}"));
                assert_eq!(
                    &o.token_ids, want,
                    "{precision:?} staged {staged} round {round} request {i}"
                );
            }
        }
        let staged_runs = engine.backend.prefill_stage_runs();
        assert_eq!(
            staged_runs,
            staged.then_some(2 * lens.len()),
            "{precision:?}"
        );
        assert_eq!(engine.backend.kv_capacity().free(), Some(3));
    }
}

/// The cache holds `max_sequence_length` positions per sequence: a longer prompt is refused
/// with the reason, and the slot it took is free again.
#[test]
fn a_sequence_longer_than_the_cache_is_refused() {
    let mut m = load(Precision::Fp32, 1, 64);
    assert_eq!(m.kv_slots(), Some((1, 64)));
    let e = m.embed(&[5; 70]).unwrap();
    let err = match m.forward(e, None) {
        Ok(_) => panic!("a 70-token prompt fit a 64-position cache"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("70 positions") && err.contains("max_sequence_length"),
        "{err}"
    );
    let e = m.embed(&[5; 10]).unwrap();
    assert!(m.forward(e, None).is_ok(), "the slot was given back");
}

/// Asking for a decoder the export lacks, or a GQA graph for TensorRT, says what to do.
#[test]
fn decoder_choice_errors_name_the_fix() {
    let d = tempfile::tempdir().unwrap();
    let merged_only = d.path().join("merged");
    export_fixture(&merged_only, &["--decoder", "merged"]);
    let out = ocrctl(&[
        "ocr",
        "--temperature",
        "0",
        "--model",
        merged_only.to_str().unwrap(),
        "--decoder",
        "gqa",
        fixture().join("images/aligned.png").to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--decoder gqa"), "{err}");
    let err = ocrctl_err(&[
        "export",
        "--checkpoint",
        checkpoint().to_str().unwrap(),
        "--out",
        d.path().join("x").to_str().unwrap(),
        "--target",
        "tensorrt",
        "--decoder",
        "gqa",
    ]);
    assert!(err.contains("--target ort"), "{err}");
}

/// More requests than cache slots (batch 4 over 2 slots): the engine waits for a slot
/// instead of failing a request, and every request still gets the reference's ids.
#[test]
fn a_full_cache_makes_requests_wait() {
    let g = golden();
    let image_token = g.json["image_token_id"].as_u64().unwrap() as u32;
    let prompter = Prompter::from_model_dir(export(), image_token).unwrap();
    let cfg = PreprocessConfig::from_model_dir(export(), 14, 2).unwrap();
    let mut engine = Engine::new(load(Precision::Fp32, 2, 0), 4, image_token);
    let mut wants = Vec::new();
    let reqs: Vec<GenRequest> = g
        .images()
        .iter()
        .map(|im| {
            wants.push(ids(&im["greedy_ids"])[..12].to_vec());
            let p = preprocess::preprocess(&g.reference_image(im), &cfg);
            let mut r = GenRequest::text(prompter.encode(&[p.num_image_tokens], None).unwrap(), 12);
            r.images = vec![p.pixel_values];
            r.ignore_eos = true;
            r
        })
        .collect();
    let out = engine.run(reqs, &mut |_| {});
    for (i, (o, want)) in out.iter().zip(&wants).enumerate() {
        assert_eq!(&o.as_ref().unwrap().token_ids, want, "request {i}");
    }
    assert_eq!(engine.backend.kv_capacity().free(), Some(2));
}

/// 10 000 random events (joins, steps, cancels by the client) on a 3-slot cache: no slot
/// is ever lost, and the engine never fails a request for want of one.
#[test]
fn slots_never_leak_under_random_joins_leaves_and_cancels() {
    use ocrctl::generation::engine::{Batch, Event, Flow};
    let mut engine = Engine::new(load(Precision::Fp32, 3, 256), 3, u32::MAX);
    let mut batch = Batch::new();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rand = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let (mut next, mut done, mut failed) = (0usize, 0usize, Vec::new());
    for _ in 0..10_000 {
        if rand(3) == 0 && engine.has_room(&batch) {
            let prompt: Vec<u32> = (0..1 + rand(20)).map(|_| 3 + rand(300) as u32).collect();
            let req = GenRequest::text(prompt, 1 + rand(30) as usize);
            engine.admit(&mut batch, next, req, &mut |ev| {
                if let Event::Done { result: Err(e), .. } = ev {
                    failed.push(e.clone());
                }
                Flow::Continue
            });
            next += 1;
        } else if !batch.is_empty() {
            let cancel = rand(40) == 0;
            engine.step(&mut batch, &mut |ev| match ev {
                Event::Done { result, .. } => {
                    if let Err(e) = result {
                        if *e != EngineError::Cancelled {
                            failed.push(e.clone());
                        }
                    }
                    done += 1;
                    Flow::Continue
                }
                _ if cancel => Flow::Cancel,
                _ => Flow::Continue,
            });
        }
        let free = engine.backend.kv_capacity().free().unwrap();
        assert_eq!(free + batch.len(), 3, "slots taken = sequences decoding");
    }
    assert!(failed.is_empty(), "{failed:?}");
    assert!(next > 1000 && done > 1000, "{next} admitted, {done} done");
    drop(batch);
    assert_eq!(engine.backend.kv_capacity().free(), Some(3));
}

/// A request that would outgrow its slot fails at admission, alone; the request decoding
/// beside it is not disturbed.
#[test]
fn a_request_too_long_for_the_cache_fails_alone() {
    let mut engine = Engine::new(load(Precision::Fp32, 2, 64), 2, u32::MAX);
    let mut ok = GenRequest::text((3..23).collect(), 30);
    ok.ignore_eos = true;
    let mut long = GenRequest::text((3..23).collect(), 60);
    long.ignore_eos = true;
    let out = engine.run(vec![ok, long], &mut |_| {});
    assert_eq!(out[0].as_ref().unwrap().token_ids.len(), 30);
    let err = out[1].as_ref().unwrap_err();
    assert_eq!(
        *err,
        EngineError::TooLong {
            prompt: 20,
            max_new: 60,
            need: 79,
            cap: 64
        }
    );
    assert!(err.to_string().contains("holds 64"), "{err}");
    assert_eq!(engine.backend.kv_capacity().free(), Some(2));
}

/// The `--target ort` graphs that the parity tests above check carry ONNX Runtime's fused
/// kernels: the vision encoder's 2-D RoPE as `RotaryEmbedding` (no Split/Neg/Concat rotation
/// left), and every residual sum with the RMSNorm after it as one
/// `SkipSimplifiedLayerNormalization`, in the vision encoder and the GQA decoder alike; the
/// decoders multiply Q/K/V and gate/up as one matrix each.
#[test]
fn ort_graphs_fuse_rotary_and_residual_norms_and_pack_projections() {
    let m = ocrctl_exporters::export::Manifest::load(export()).unwrap();
    let (vl, tl) = (m.model.vision.num_layers, m.model.text.num_layers);
    for precision in [Precision::Fp32, Precision::Fp16] {
        let graphs = &m.graphs[&precision];
        let count = |part: &str, op: &str| graphs[part].op_counts.get(op).copied().unwrap_or(0);
        let vision = "vision_encoder";
        assert_eq!(
            count(vision, "com.microsoft.RotaryEmbedding"),
            2 * vl,
            "{precision:?}"
        );
        assert_eq!(
            count(vision, "Neg"),
            0,
            "{precision:?}: explicit rotation left"
        );
        // Two per layer, the second layer's first one adding the previous MLP output; the
        // projector's norm adds the last one.
        let skip = "com.microsoft.SkipSimplifiedLayerNormalization";
        assert_eq!(count(vision, skip), 2 * vl, "{precision:?}");
        assert_eq!(count("decoder_gqa", skip), 2 * tl, "{precision:?}");
        assert_eq!(
            count("decoder_gqa", "com.microsoft.GroupQueryAttention"),
            tl
        );
        // Q/K/V and gate/up packed (`layers::linears_packed`): per layer one MatMul each for
        // QKV, o_proj, gate/up and down_proj (the merged decoder two more, for its scores
        // and their weighted sum), one Split for QKV and one for gate/up (the merged decoder
        // two more, for its explicit RoPE's halves); plus the lm_head. The vision encoder's
        // many patches keep one MatMul per Linear.
        for (decoder, matmuls, splits) in [("decoder_gqa", 4, 2), ("decoder_model_merged", 6, 4)] {
            let what = format!("{precision:?} {decoder}");
            assert_eq!(count(decoder, "MatMul"), matmuls * tl + 1, "{what}");
            assert_eq!(count(decoder, "Split"), splits * tl, "{what}");
        }
        assert_eq!(count(vision, "Split"), 0, "{precision:?}");
    }
}

/// Seeded sampling at batch 3 (five requests through three slots): choosing from the
/// decoder's `top_logits`/`top_ids` candidates (and `logsumexp` for log-probabilities) gives
/// the same tokens as from the full logits, and the same log-probabilities within float32
/// rounding. The full-logits baseline asks for 65 top log-probabilities, more than the 64
/// candidates. At LightOnOCR's defaults (temperature 0.2, top-p 0.9) the trained fixture's
/// steps are mostly decided by the candidates alone; at temperature 1.5, top-p 0.99 many are
/// not, and those rows take the step's full logits afterwards (`step_logits`), still giving
/// the same tokens.
#[test]
fn sampling_from_the_decoders_candidates_equals_sampling_from_full_logits() {
    let g = golden();
    let image_token = g.json["image_token_id"].as_u64().unwrap() as u32;
    let prompter = Prompter::from_model_dir(export(), image_token).unwrap();
    let cfg = PreprocessConfig::from_model_dir(export(), 14, 2).unwrap();
    let reqs = |top_logprobs: usize, temperature: f32, top_p: f32| -> Vec<GenRequest> {
        g.images()
            .iter()
            .enumerate()
            .map(|(i, im)| {
                let p = preprocess::preprocess(&g.reference_image(im), &cfg);
                GenRequest {
                    prompt_ids: prompter.encode(&[p.num_image_tokens], None).unwrap(),
                    images: vec![p.pixel_values],
                    params: SamplingParams {
                        temperature,
                        top_p,
                        seed: Some(7 + i as u64),
                        ..SamplingParams::greedy()
                    },
                    max_new_tokens: 30,
                    stop_ids: vec![],
                    ignore_eos: true,
                    logprobs: top_logprobs > 0,
                    top_logprobs,
                }
            })
            .collect()
    };
    for precision in [Precision::Fp32, Precision::Fp16] {
        for (t, p) in [(0.2, 0.9), (1.5, 0.99)] {
            let run = |top_logprobs: usize| {
                let mut engine = Engine::new(load(precision, 3, 0), 3, image_token);
                let out: Vec<Generation> = engine
                    .run(reqs(top_logprobs, t, p), &mut |_| {})
                    .into_iter()
                    .map(|r| r.expect("generation succeeds"))
                    .collect();
                (
                    out,
                    engine.backend.kv_stats().step_logits_fallbacks as usize,
                )
            };
            let ids = |o: &[Generation]| o.iter().map(|g| g.token_ids.clone()).collect::<Vec<_>>();
            let ctx = format!("{precision:?}, temperature {t}, top-p {p}");
            let (full, no_fallbacks) = run(65);
            assert_eq!(
                no_fallbacks, 0,
                "{ctx}: 65 top log-probabilities fetch full logits"
            );
            let (cands, fallbacks) = run(0);
            assert_eq!(ids(&cands), ids(&full), "{ctx}");
            let steps: usize = cands.iter().map(|c| c.token_ids.len() - 1).sum();
            eprintln!("{ctx}: {fallbacks} of {steps} sampling steps needed the full logits");
            if t < 1.0 {
                assert!(fallbacks * 4 < steps, "{ctx}: {fallbacks} of {steps}");
            } else {
                assert!(fallbacks > 0, "{ctx}: the fallback was not exercised");
            }
            // Log-probabilities from the candidates and the device's log-normaliser.
            let (scored, scored_fallbacks) = run(5);
            assert_eq!(ids(&scored), ids(&full), "{ctx}: with log-probabilities");
            assert_eq!(
                scored_fallbacks, fallbacks,
                "{ctx}: the same steps undecided"
            );
            let mut worst = 0f32;
            for (a, b) in scored.iter().zip(&full) {
                for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
                    worst = worst.max((x - y).abs());
                }
                for (x, y) in a.top_logprobs.iter().zip(&b.top_logprobs) {
                    assert_eq!(x.len(), 5);
                    for (u, v) in x.iter().zip(y) {
                        assert_eq!(u.id, v.id, "{ctx}: top-5 ids");
                        worst = worst.max((u.logprob - v.logprob).abs());
                    }
                }
                assert_eq!(a.logprobs.len(), a.token_ids.len());
            }
            eprintln!("{ctx}: log-probabilities from candidates within {worst:e}");
            assert!(worst < 1e-4, "{ctx}: {worst}");
        }
    }
}
