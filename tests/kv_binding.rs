//! The decoder's KV cache kept in the execution provider's memory through IoBinding (CPU
//! memory here), repacked by the repack graph, gives exactly the logits of the host path
//! (`Session::run`, repacks on the host), over batched greedy steps where sequences join and
//! leave, shrink to one and grow again; and every sequence's logits equal those of running it
//! alone. An export with an 8-bit cache names, for other programs, the graph transformer to
//! leave out.

mod common;
use common::*;
use ocrctl::generation::generate::argmax_and_top_k;
use ocrctl::runtime::backend::Backend;
use ocrctl::runtime::ortmodel::{KvPath, KvStats, LoadOptions, OrtCache, OrtModel};
use ocrctl_exporters::export::{DecoderVariant, Precision};

/// One sequence being decoded: its prompt, the tokens chosen so far, the logits seen at each
/// step (prefill first) and its cache.
struct Seq {
    prompt: Vec<u32>,
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
    cache: Option<OrtCache>,
}

fn prefill(m: &mut OrtModel, prompt: Vec<u32>) -> Seq {
    let e = m.embed(&prompt).unwrap();
    let (l, c) = m.forward(e, None).unwrap();
    Seq {
        prompt,
        tokens: vec![argmax_and_top_k(&l, 0).0],
        logits: vec![l],
        cache: Some(c),
    }
}

/// One batched greedy step for `seqs[i]`, `i` in `which` (in that order).
fn step(m: &mut OrtModel, seqs: &mut [Seq], which: &[usize]) {
    let tokens: Vec<u32> = which
        .iter()
        .map(|i| *seqs[*i].tokens.last().unwrap())
        .collect();
    let caches = which
        .iter()
        .map(|i| seqs[*i].cache.take().unwrap())
        .collect();
    let (logits, caches) = m.decode_batch(&tokens, caches).unwrap();
    for ((i, l), c) in which.iter().zip(logits).zip(caches) {
        let s = &mut seqs[*i];
        s.tokens.push(argmax_and_top_k(&l, 0).0);
        s.logits.push(l);
        s.cache = Some(c);
    }
}

/// Prompts of different lengths (token ids below the fixture's vocabulary size).
fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 3 + (i * 7 + seed * 13) % 40)
        .collect()
}

/// A schedule with joins, leaves, a batch shrinking to one and growing again.
fn schedule(m: &mut OrtModel) -> Vec<Seq> {
    let mut s = vec![prefill(m, prompt(5, 0)), prefill(m, prompt(9, 1))];
    for _ in 0..3 {
        step(m, &mut s, &[0, 1]);
    }
    s.push(prefill(m, prompt(3, 2)));
    for _ in 0..3 {
        step(m, &mut s, &[0, 1, 2]); // C joined
    }
    for _ in 0..2 {
        step(m, &mut s, &[2, 0]); // B left, order changed
    }
    for _ in 0..2 {
        step(m, &mut s, &[2]); // alone: its row is cut out of the batch cache
    }
    s.push(prefill(m, prompt(12, 3)));
    for _ in 0..3 {
        step(m, &mut s, &[3, 2]); // D joined a sequence with its own cache
    }
    s.push(prefill(m, prompt(7, 4)));
    s.push(prefill(m, prompt(2, 5)));
    for _ in 0..2 {
        step(m, &mut s, &[4, 2, 5, 3]); // E and F joined: three sources
    }
    s
}

fn load(precision: Precision, path: KvPath) -> OrtModel {
    // The merged decoder's cache paths (the GQA decoder has its own tests in tests/gqa.rs).
    let opts = LoadOptions {
        decoder: Some(DecoderVariant::Merged),
        ..LoadOptions::new(precision)
    };
    let mut m = OrtModel::load(exported(), &opts).unwrap();
    assert_eq!(m.kv_path(), KvPath::Bound, "binding is the default");
    m.set_kv_path(path);
    m
}

#[test]
fn bound_kv_cache_gives_the_host_paths_logits_through_joins_and_leaves() {
    for precision in [Precision::Fp32, Precision::Fp16] {
        let mut bound = load(precision, KvPath::Bound);
        let mut host = load(precision, KvPath::Host);
        let a = schedule(&mut bound);
        let b = schedule(&mut host);

        let sb = bound.kv_stats().clone();
        assert_eq!(bound.kv_path(), KvPath::Bound, "no fallback: {sb:?}");
        // 6 prefills and 15 steps; repacked when the first batch formed, C joined, B left,
        // C went on alone (its rows cut out), D joined, E and F joined: on the bound path by
        // the repack graph, on the host path on the host.
        let runs = |s: &KvStats| (s.bound_runs, s.host_runs, s.repacks, s.device_repacks);
        assert_eq!(runs(&sb), (21, 0, 6, 6), "{sb:?}");
        assert_eq!(sb.kv_location.as_deref(), Some("Cpu:0"));
        assert_eq!(
            runs(host.kv_stats()),
            (0, 21, 6, 0),
            "{:?}",
            host.kv_stats()
        );

        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(x.tokens, y.tokens, "{precision:?} sequence {i}");
            assert_eq!(x.logits.len(), y.logits.len());
            for (k, (lx, ly)) in x.logits.iter().zip(&y.logits).enumerate() {
                assert_eq!(
                    max_abs_diff(lx, ly),
                    0.0,
                    "{precision:?} sequence {i} step {k}: bound and host logits differ"
                );
            }
        }

        // Every sequence alone (batch 1, no padding) sees the same logits.
        let tol = if precision == Precision::Fp32 {
            1e-4
        } else {
            2e-2
        };
        for (i, s) in a.iter().enumerate() {
            let e = bound.embed(&s.prompt).unwrap();
            let (mut l, mut c) = bound.forward(e, None).unwrap();
            for (k, t) in s.tokens.iter().enumerate() {
                let d = max_abs_diff(&l, &s.logits[k]);
                assert!(
                    d < tol,
                    "{precision:?} sequence {i} step {k}: batched logits differ by {d}"
                );
                if k + 1 < s.logits.len() {
                    let e = bound.embed(&[*t]).unwrap();
                    (l, c) = bound.forward(e, Some(c)).unwrap();
                }
            }
        }
    }
}

#[test]
fn a_cache_made_on_one_path_continues_on_the_other() {
    let mut m = load(Precision::Fp32, KvPath::Host);
    let mut s = vec![prefill(&mut m, prompt(4, 5)), prefill(&mut m, prompt(6, 6))];
    step(&mut m, &mut s, &[0, 1]);
    m.set_kv_path(KvPath::Bound);
    step(&mut m, &mut s, &[0, 1]);
    step(&mut m, &mut s, &[1]);
    m.set_kv_path(KvPath::Host);
    step(&mut m, &mut s, &[1]);

    let mut r = load(Precision::Fp32, KvPath::Bound);
    let mut t = vec![prefill(&mut r, prompt(4, 5)), prefill(&mut r, prompt(6, 6))];
    for which in [&[0, 1][..], &[0, 1], &[1], &[1]] {
        step(&mut r, &mut t, which);
    }
    for (x, y) in s.iter().zip(&t) {
        assert_eq!(x.tokens, y.tokens);
        for (lx, ly) in x.logits.iter().zip(&y.logits) {
            assert_eq!(max_abs_diff(lx, ly), 0.0);
        }
    }
}

/// An export with an 8-bit KV cache tells other ONNX Runtime programs, in its GQA graph's
/// metadata, which graph transformer to leave out (ocrctl's runtime leaves it out itself,
/// `contract::hint`); an export with the activation-type cache names none.
#[test]
fn an_8bit_cache_export_names_the_optimizer_to_leave_out() {
    use ocrctl_exporters::contract::hint;
    use ocrctl_exporters::export::{export, ExportOptions};
    use ocrctl_exporters::kv_cache::KvCache;
    let dir = tempfile::tempdir().unwrap();
    for (kv, want) in [
        (
            KvCache::Int8 { scale: 0.1 },
            Some(hint::KV8_DISABLED_OPTIMIZERS),
        ),
        (KvCache::Activation, None),
    ] {
        let out = dir.path().join(kv.name());
        let opts = ExportOptions {
            precisions: vec![Precision::Fp32],
            decoders: vec![DecoderVariant::Gqa],
            kv_cache: kv,
            ..ExportOptions::new(checkpoint().to_string_lossy().into(), out.clone())
        };
        export(&opts, &mut |_| {}).expect("export");
        let onnx = out.join("onnx/decoder_model_gqa.onnx");
        let got = graph_hint(&onnx, hint::DISABLE_OPTIMIZERS);
        assert_eq!(got.as_deref(), want, "{kv:?}");
    }
}
