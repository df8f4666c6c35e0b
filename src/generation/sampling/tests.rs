//! Unit tests of sampling (`src/generation/sampling.rs`).

use super::*;
use crate::generation::generate::argmax_and_top_k;

/// Deterministic pseudo-random logits in [-8, 8).
fn logits(n: usize, seed: u64) -> Vec<f32> {
    let mut r = Xoshiro256::from_seed(seed);
    (0..n).map(|_| (r.next_f64() * 16.0 - 8.0) as f32).collect()
}

/// A seeded sampler with these settings (shared with the candidates' tests).
pub(super) fn sampler(temperature: f32, top_p: f32, top_k: usize, seed: u64) -> Sampler {
    Sampler::new(SamplingParams {
        temperature,
        top_p,
        top_k,
        seed: Some(seed),
        ..SamplingParams::greedy()
    })
    .unwrap()
}

/// Draws `draws` tokens from fixed logits and counts them per id.
fn histogram(s: &mut Sampler, l: &[f32], draws: usize) -> Vec<usize> {
    let mut counts = vec![0; l.len()];
    for _ in 0..draws {
        counts[s.next(&mut l.to_vec(), &[]) as usize] += 1;
    }
    counts
}

fn softmax(l: &[f32], t: f64) -> Vec<f64> {
    let m = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let e: Vec<f64> = l.iter().map(|&v| ((v as f64 - m) / t).exp()).collect();
    let z: f64 = e.iter().sum();
    e.into_iter().map(|x| x / z).collect()
}

/// Each count within 5 standard deviations of its binomial expectation.
fn assert_matches(counts: &[usize], probs: &[f64], draws: usize) {
    for (i, (&c, &p)) in counts.iter().zip(probs).enumerate() {
        let mean = p * draws as f64;
        let sd = (draws as f64 * p * (1.0 - p)).sqrt();
        assert!(
            (c as f64 - mean).abs() <= 5.0 * sd + 1e-9,
            "token {i}: {c} draws, expected {mean:.1} ± {:.1} ({counts:?})",
            5.0 * sd
        );
    }
}

#[test]
fn xoshiro_matches_the_reference_sequence() {
    // State [1, 2, 3, 4]: the first outputs of the reference C implementation.
    let mut r = Xoshiro256 { s: [1, 2, 3, 4] };
    let got: Vec<u64> = (0..4).map(|_| r.next_u64()).collect();
    assert_eq!(got, vec![11520, 0, 1509978240, 1215971899390074240]);
    // splitmix64 from 0 (reference value of the first output).
    assert_eq!(splitmix64(&mut 0), 0xE220_A839_7B1D_CDAF);
}

#[test]
fn greedy_equals_argmax() {
    let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
    for seed in 0..20 {
        let l = logits(1000, seed);
        let want = argmax_and_top_k(&l, 0).0;
        assert_eq!(s.next(&mut l.clone(), &[]), want);
    }
    // First maximum on ties; NaN never wins.
    assert_eq!(s.next(&mut [1.0, 3.0, 3.0, -2.0], &[]), 1);
    assert_eq!(s.next(&mut [f32::NAN, 0.5, 2.0, 2.0], &[]), 2);
    let lp = s.next_with_logprob(&mut [0.0, 0.0, 0.0, 0.0], &[]);
    assert_eq!(lp.id, 0);
    assert!((lp.logprob - 0.25f32.ln()).abs() < 1e-6);
}

#[test]
fn fixed_seed_is_reproducible_and_seeds_differ() {
    let l = logits(5000, 7);
    let run = |seed: u64| {
        let mut s = sampler(1.0, 0.95, 0, seed);
        (0..200)
            .map(|_| s.next(&mut l.clone(), &[]))
            .collect::<Vec<u32>>()
    };
    let a = run(42);
    assert_eq!(a, run(42));
    let b = run(43);
    assert_ne!(a, b);
    // Not a degenerate distribution: many distinct tokens were drawn.
    let mut distinct = a.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() > 50, "{}", distinct.len());
    // Without a seed, two samplers get different seeds.
    let p = SamplingParams {
        temperature: 1.0,
        ..SamplingParams::greedy()
    };
    let s1 = Sampler::new(p.clone()).unwrap();
    let s2 = Sampler::new(p).unwrap();
    assert_ne!(s1.seed(), s2.seed());
}

#[test]
fn top_k_one_and_tiny_top_p_equal_greedy() {
    for seed in 0..30 {
        let l = logits(2000, 100 + seed);
        let want = argmax_and_top_k(&l, 0).0;
        let mut k1 = sampler(10.0, 1.0, 1, seed);
        let mut p0 = sampler(1.5, 1e-6, 0, seed);
        for _ in 0..20 {
            assert_eq!(k1.next(&mut l.clone(), &[]), want);
            assert_eq!(p0.next(&mut l.clone(), &[]), want);
        }
    }
}

#[test]
fn top_p_keeps_exactly_the_nucleus() {
    // Probabilities 0.1, 0.4, 0.2, 0.3 at ids 0..4.
    let l: Vec<f32> = [0.1f32, 0.4, 0.2, 0.3].iter().map(|p| p.ln()).collect();
    let draws = 10_000;
    // top_p 0.65: 0.4 < 0.65 <= 0.4 + 0.3 → nucleus {1, 3}, renormalised 4/7, 3/7.
    let c = histogram(&mut sampler(1.0, 0.65, 0, 1), &l, draws);
    assert_eq!((c[0], c[2]), (0, 0), "{c:?}");
    assert_matches(&c, &[0.0, 4.0 / 7.0, 0.0, 3.0 / 7.0], draws);
    // top_p 0.75 → {1, 3, 2}: 4/9, 3/9, 2/9.
    let c = histogram(&mut sampler(1.0, 0.75, 0, 2), &l, draws);
    assert_eq!(c[0], 0, "{c:?}");
    assert_matches(&c, &[0.0, 4.0 / 9.0, 2.0 / 9.0, 3.0 / 9.0], draws);
    // top_p 0.3 → only the most likely token.
    let c = histogram(&mut sampler(1.0, 0.3, 0, 3), &l, draws);
    assert_eq!(c, vec![0, draws, 0, 0]);
    // The processed logits mark the removed tokens and the logprob is renormalised.
    let mut s = sampler(1.0, 0.65, 0, 4);
    let mut x = l.clone();
    let t = s.next_with_logprob(&mut x, &[]);
    assert_eq!(x[0], f32::NEG_INFINITY);
    assert_eq!(x[2], f32::NEG_INFINITY);
    assert!((x[1] - l[1]).abs() < 1e-7 && (x[3] - l[3]).abs() < 1e-7);
    let want = if t.id == 1 { 4.0f32 / 7.0 } else { 3.0 / 7.0 };
    assert!((t.logprob - want.ln()).abs() < 1e-6, "{t:?}");
}

#[test]
fn top_p_on_a_large_vocabulary_matches_a_full_sort() {
    // The nucleus search grows a sorted prefix; check it against sorting everything.
    let l = logits(20_000, 9);
    for &top_p in &[0.01f32, 0.3, 0.9, 0.999] {
        let probs = softmax(&l, 0.7);
        let mut order: Vec<usize> = (0..l.len()).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        let mut acc = 0.0;
        let mut want = 0;
        for &i in &order {
            if want > 0 && acc >= top_p as f64 {
                break;
            }
            acc += probs[i];
            want += 1;
        }
        let mut x = l.clone();
        sampler(0.7, top_p, 0, 5).next(&mut x, &[]);
        let kept = x.iter().filter(|v| v.is_finite()).count();
        assert_eq!(kept, want, "top_p {top_p}");
        assert!(order[..want].iter().all(|&i| x[i].is_finite()));
    }
}

#[test]
fn top_k_keeps_the_k_largest_and_ties_at_the_boundary() {
    let l = [1.0f32, 3.0, 2.0, 0.0, 2.0, -1.0];
    let mut x = l.to_vec();
    sampler(2.0, 1.0, 2, 0).next(&mut x, &[]);
    // k = 2: 3.0 and both 2.0s stay (transformers keeps ties), divided by T = 2.
    let inf = f32::NEG_INFINITY;
    assert_eq!(x, vec![inf, 1.5, 1.0, inf, 1.0, inf]);
    let draws = 20_000;
    let c = histogram(&mut sampler(1.0, 1.0, 3, 6), &l, draws);
    let e = [3.0f64.exp(), 2.0f64.exp(), 2.0f64.exp()];
    let z: f64 = e.iter().sum();
    assert_matches(&c, &[0.0, e[0] / z, e[1] / z, 0.0, e[2] / z, 0.0], draws);
}

#[test]
fn temperature_sampling_matches_softmax() {
    let l = [1.0f32, 2.0, 0.5, -1.0, 3.0, 2.0];
    let draws = 100_000;
    for (t, seed) in [(1.0f32, 11u64), (0.5, 12), (2.0, 13)] {
        let c = histogram(&mut sampler(t, 1.0, 0, seed), &l, draws);
        assert_matches(&c, &softmax(&l, t as f64), draws);
    }
}

#[test]
fn repetition_penalty_touches_seen_ids_only() {
    let mut x = vec![2.0f32, -1.0, 0.5, -3.0, 4.0, 0.0];
    // Duplicates are penalised once; ids outside the vocabulary are ignored.
    let rep = |r| SamplingParams {
        repetition_penalty: r,
        ..SamplingParams::greedy()
    };
    apply_penalties(&mut x, &[0, 1, 0, 3, 5, 99], &rep(2.0));
    assert_eq!(x, vec![1.0, -2.0, 0.5, -6.0, 4.0, 0.0]);
    let mut y = vec![2.0f32, -1.0];
    apply_penalties(&mut y, &[0, 1], &rep(1.0));
    assert_eq!(y, vec![2.0, -1.0]);
    // In greedy mode it changes the choice: 3.0 / 1.1 < 2.9.
    let mut s = Sampler::new(SamplingParams {
        repetition_penalty: 1.1,
        ..SamplingParams::greedy()
    })
    .unwrap();
    assert_eq!(s.next(&mut [3.0, 2.9], &[]), 0);
    assert_eq!(s.next(&mut [3.0, 2.9], &[0]), 1);
}

#[test]
fn logit_bias_is_added_before_the_penalties_and_checked() {
    let with = |bias: &[(u32, f32)], r: f32| SamplingParams {
        repetition_penalty: r,
        logit_bias: logit_bias(bias.iter().copied()),
        ..SamplingParams::greedy()
    };
    // Sorted by id, the last bias given for an id wins.
    assert_eq!(
        logit_bias([(7, 1.0), (2, -3.0), (7, 4.0)]),
        vec![(2, -3.0), (7, 4.0)]
    );
    // Bias first, then the repetition penalty: (2 + 2) / 2 = 2, not 2 / 2 + 2 = 3.
    let mut x = vec![2.0f32, 0.0, f32::NEG_INFINITY];
    let p = with(&[(0, 2.0), (2, 50.0), (9, 1.0)], 2.0);
    apply_logit_bias(&mut x, &p.logit_bias);
    apply_penalties(&mut x, &[0], &p);
    assert_eq!(x, vec![2.0, 0.0, f32::NEG_INFINITY]);
    // Greedy: -100 bans the best id, +100 makes a poor one win; an impossible id stays so.
    let mut s = Sampler::new(with(&[(0, -100.0)], 1.0)).unwrap();
    assert_eq!(s.next(&mut [9.0, 2.0, 3.0], &[]), 2);
    let mut s = Sampler::new(with(&[(1, 100.0), (2, 100.0)], 1.0)).unwrap();
    assert_eq!(s.next(&mut [9.0, 2.0, f32::NEG_INFINITY], &[]), 1);
    // Sampling at temperature 1: a banned id is never drawn.
    let mut s = Sampler::new(SamplingParams {
        temperature: 1.0,
        seed: Some(3),
        ..with(&[(0, -100.0)], 1.0)
    })
    .unwrap();
    assert!((0..200).all(|_| s.next(&mut [1.0, 1.0, 1.0], &[]) != 0));
    // Ranges: [-100, 100], NaN refused; ids must be inside the vocabulary. The errors
    // name logit_bias and the id.
    for b in [100.5, -101.0, f32::NAN] {
        let e = with(&[(4, b)], 1.0).validate().unwrap_err();
        assert_eq!(e.param(), "logit_bias");
        assert!(e.to_string().contains("token 4"), "{e}");
    }
    let p = with(&[(3, 1.0), (10, 1.0)], 1.0);
    assert!(p.validate().is_ok() && p.check_vocab(11).is_ok());
    let e = p.check_vocab(10).unwrap_err();
    assert_eq!(e.param(), "logit_bias");
    assert!(
        e.to_string().contains("token 10") && e.to_string().contains("10 ids"),
        "{e}"
    );
    assert!(p.modifies_logits() && !p.penalises());
}

#[test]
fn frequency_and_presence_penalties_count_occurrences_after_the_repetition_penalty() {
    let params = |r, p, f| SamplingParams {
        repetition_penalty: r,
        presence_penalty: p,
        frequency_penalty: f,
        ..SamplingParams::greedy()
    };
    // Id 0 seen twice, 1 once, 3 three times; 2 and 4 never; 99 outside.
    let history = [0, 1, 3, 0, 3, 3, 99];
    let mut x = vec![2.0f32, -1.0, 0.5, -3.0, 4.0];
    apply_penalties(&mut x, &history, &params(1.0, 0.5, 0.25));
    assert_eq!(
        x,
        vec![
            2.0 - 0.5 - 0.5,
            -1.0 - 0.25 - 0.5,
            0.5,
            -3.0 - 0.75 - 0.5,
            4.0
        ]
    );
    // Negative values reward what was seen; the repetition penalty comes first.
    let mut x = vec![2.0f32, -1.0, 0.5, -3.0, 4.0];
    apply_penalties(&mut x, &history, &params(2.0, -1.0, -0.5));
    assert_eq!(
        x,
        vec![
            1.0 + 1.0 + 1.0,
            -2.0 + 0.5 + 1.0,
            0.5,
            -6.0 + 1.5 + 1.0,
            4.0
        ]
    );
    // An impossible token stays impossible.
    let mut x = vec![f32::NEG_INFINITY, 0.0];
    apply_penalties(&mut x, &[0, 0], &params(1.0, -2.0, -2.0));
    assert_eq!(x[0], f32::NEG_INFINITY);
    // Greedy: a frequency penalty turns the choice after the second occurrence.
    let mut s = Sampler::new(params(1.0, 0.0, 0.3)).unwrap();
    assert_eq!(s.next(&mut [3.0, 2.5], &[0]), 0);
    assert_eq!(s.next(&mut [3.0, 2.5], &[0, 0]), 1);
    // Ranges: [-2, 2], NaN refused, each error naming its parameter.
    for (p, f, param) in [
        (2.5, 0.0, "presence_penalty"),
        (f32::NAN, 0.0, "presence_penalty"),
        (0.0, -2.01, "frequency_penalty"),
        (0.0, f32::INFINITY, "frequency_penalty"),
    ] {
        let e = params(1.0, p, f).validate().unwrap_err();
        assert_eq!(e.param(), param, "{e}");
        assert!(e.to_string().contains("[-2, 2]"), "{e}");
    }
    assert!(params(1.0, -2.0, 2.0).validate().is_ok());
}

#[test]
fn degenerate_logits_do_not_panic() {
    let mut s = sampler(1.0, 0.9, 0, 0);
    assert_eq!(s.next(&mut [f32::NEG_INFINITY; 3], &[]), 0);
    assert_eq!(s.next(&mut [f32::NAN, 1.0, f32::NAN], &[]), 1);
    // A tiny temperature would overflow l / T in f32: the largest still wins.
    let mut s = sampler(1e-38, 1.0, 0, 0);
    assert_eq!(s.next(&mut [1.0, 5.0, 4.0], &[]), 1);
}

/// Issue 10.1: a repetition penalty near 0 divided positive logits to +inf, every
/// weight became NaN and the candidate list was empty: the engine thread panicked.
#[test]
fn repetition_penalty_at_its_extremes_never_breaks_sampling() {
    for penalty in [
        1e-45f32,
        1e-38,
        f32::MIN_POSITIVE,
        1e-3,
        1e3,
        1e38,
        f32::MAX,
    ] {
        for temperature in [0.0f32, 0.2, 1.0] {
            let mut s = Sampler::new(SamplingParams {
                temperature,
                top_p: 0.9,
                top_k: 50,
                repetition_penalty: penalty,
                seed: Some(3),
                ..SamplingParams::greedy()
            })
            .unwrap();
            let mut l = logits(300, 11);
            let history: Vec<u32> = (0..300).step_by(3).collect();
            let t = s.next_with_logprob(&mut l, &history);
            assert!((t.id as usize) < 300, "penalty {penalty} t {temperature}");
            assert!(
                t.logprob.is_finite() && t.logprob <= 0.0,
                "{penalty}: {t:?}"
            );
            assert!(l.iter().all(|v| !v.is_nan()), "processed logits hold NaN");
        }
    }
}

/// Logits of an fp16 decoder can overflow to ±inf: they are sampled like huge values.
#[test]
fn infinite_logits_are_sampled_safely() {
    for temperature in [0.0f32, 0.2, 1.0] {
        let mut s = sampler(temperature, 0.95, 0, 1);
        let mut l = [1.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 2.0];
        let t = s.next_with_logprob(&mut l, &[]);
        assert_eq!(t.id, 1, "t {temperature}");
        assert!(t.logprob.is_finite(), "{t:?}");
        // Two overflowed logits share the mass; neither NaN nor a panic.
        let mut l = [f32::INFINITY, f32::INFINITY, 0.0];
        let t = s.next_with_logprob(&mut l, &[0, 1]);
        assert!(t.id < 2 && t.logprob.is_finite(), "{t:?}");
    }
}

/// Property: no combination of parameters that `validate` accepts, on logits holding
/// any mix of ordinary, huge, infinite and NaN values, makes the sampler panic, choose
/// an id outside the vocabulary or report a NaN log-probability. (A seeded generator
/// instead of the proptest crate: one more compile-heavy test dependency for one loop.)
#[test]
fn no_valid_parameters_make_the_sampler_panic_or_emit_nan() {
    let mut r = Xoshiro256::from_seed(2026);
    let pick = |r: &mut Xoshiro256, xs: &[f32]| xs[(r.next_u64() % xs.len() as u64) as usize];
    let specials = [
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MAX,
        f32::MIN,
        65504.0,
        -65504.0,
        0.0,
        1e-45,
    ];
    for case in 0..4000 {
        let n = 1 + (r.next_u64() % 64) as usize;
        let temperature = pick(
            &mut r,
            &[0.0, 1e-38, 1e-3, 0.01, 0.2, 1.0, 7.5, 1e30, f32::MAX],
        );
        let top_p = pick(&mut r, &[1e-38, 1e-6, 0.5, 0.9, 0.999_999, 1.0]);
        let top_k = (r.next_u64() % (n as u64 + 3)) as usize;
        let repetition_penalty = pick(
            &mut r,
            &[1e-45, 1e-38, 1e-6, 0.5, 1.0, 1.3, 1e6, 1e38, f32::MAX],
        );
        let presence_penalty = pick(&mut r, &[-2.0, -0.5, 0.0, 1.0, 2.0]);
        let frequency_penalty = pick(&mut r, &[-2.0, -1e-6, 0.0, 0.7, 2.0]);
        let biases: Vec<(u32, f32)> = (0..(r.next_u64() % 4))
            .map(|_| {
                let id = (r.next_u64() % (n as u64 + 2)) as u32;
                (id, pick(&mut r, &[-100.0, -1.0, 0.0, 0.5, 100.0]))
            })
            .collect();
        let params = SamplingParams {
            logit_bias: logit_bias(biases),
            temperature,
            top_p,
            top_k,
            repetition_penalty,
            presence_penalty,
            frequency_penalty,
            seed: Some(case),
            loop_guard: None,
        };
        params.validate().expect("generated within the bounds");
        let mut s = Sampler::new(params.clone()).unwrap();
        let mut l: Vec<f32> = (0..n)
            .map(|_| {
                if r.next_u64().is_multiple_of(4) {
                    pick(&mut r, &specials)
                } else {
                    (r.next_f64() * 40.0 - 20.0) as f32
                }
            })
            .collect();
        let history: Vec<u32> = (0..(r.next_u64() % 8))
            .map(|_| (r.next_u64() % (n as u64 + 2)) as u32)
            .collect();
        let t = s.next_with_logprob(&mut l, &history);
        assert!((t.id as usize) < n, "case {case} {params:?}");
        assert!(!t.logprob.is_nan(), "case {case} {params:?}: {t:?}");
        assert!(l.iter().all(|v| !v.is_nan()), "case {case} {params:?}");
    }
}
