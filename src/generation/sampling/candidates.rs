//! Sampling from the device's candidates: the K largest logits of a step
//! ([`ocrctl_exporters::contract::tensor::TOP_LOGITS`]) instead of the whole vocabulary, when
//! they decide the draw exactly.
//!
//! A sampling step at batch 128 would otherwise move 128 × 151 936 float32 logits (78 MiB) to
//! the host and compute ~19 million exponentials there; with the candidates it moves 96 KiB and
//! computes a few hundred. Exactness is a property test below: the same id as the full path
//! for the same generator state, or `None` and nothing drawn.

use super::{draw, Sampler, MIN_TEMPERATURE};

impl Sampler {
    /// [`Sampler::next`] from the `K` largest logits only (`cands`: logit and id, as the
    /// device's TopK returns them, largest first), for a vocabulary of `vocab` ids; `None`
    /// when those cannot decide the draw exactly, and then nothing was drawn (the generator
    /// is untouched: call [`Sampler::next`] with the full logits).
    ///
    /// Exact means the same id as [`Sampler::next`] on the full logits with the same
    /// generator state. It holds when the request samples (temperature > 0) without a
    /// repetition penalty, and the kept tokens are decided by the candidates alone: top-k
    /// keeps only candidates (`top_k < K`, its threshold above the K-th logit), or top-p's
    /// nucleus ends at a candidate above the K-th logit whatever the other `vocab - K` tokens
    /// weigh (each weighs at most the K-th candidate's weight, so their sum is bounded; the
    /// nucleus must end at the same place for any sum up to that bound). The weights and the
    /// draw are computed as in the full path, in the same order, so the choice is the same
    /// number, not an approximation. At temperature 0.2 and top-p 0.9 (LightOnOCR's
    /// defaults) a confident model's next token is decided by 64 candidates.
    pub fn next_from_candidates(
        &mut self,
        cands: &[(f32, u32)],
        vocab: usize,
        history: &[u32],
    ) -> Option<u32> {
        let p = &self.params;
        if p.is_greedy() || (p.repetition_penalty != 1.0 && !history.is_empty()) {
            return None;
        }
        let k = cands.len();
        if k == 0 || cands.iter().any(|(v, _)| !v.is_finite()) {
            return None;
        }
        let floor = cands[k - 1].0;
        // top-k: tokens at or above the top_k-th logit. Inside the candidates only when that
        // threshold is above the K-th logit (a tie with it may continue outside).
        let top_k = p.top_k;
        let (threshold, tail) = if top_k > 0 && top_k < k.min(vocab) {
            let t = cands[top_k - 1].0;
            if t <= floor {
                return None;
            }
            (t, false)
        } else {
            (f32::NEG_INFINITY, vocab > k)
        };
        let top_p = p.top_p as f64;
        if tail && top_p >= 1.0 {
            // Every token with a positive weight is kept and can be drawn.
            return None;
        }
        let t = (p.temperature as f64).max(MIN_TEMPERATURE);
        let max64 = cands[0].0 as f64;
        let weight = |v: f32| ((v as f64 - max64) / t).exp();
        let mut kept: Vec<(f64, u32)> = cands
            .iter()
            .filter(|(v, _)| *v >= threshold)
            .map(|&(v, id)| (weight(v), id))
            .filter(|(w, _)| *w > 0.0)
            .collect();
        let order = |a: &(f64, u32), b: &(f64, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        kept.sort_unstable_by(order);
        let n = if top_p < 1.0 {
            let sum: f64 = kept.iter().map(|c| c.0).sum();
            // The full path's total lies in [sum, sum + bound] (and differs from `sum` by
            // rounding, since it adds in id order): the nucleus must end at the same token
            // for every total in that range, widened by a relative 1e-12.
            let bound = if tail {
                (vocab - k) as f64 * weight(floor)
            } else {
                0.0
            };
            let lo = top_p * sum * (1.0 - 1e-12);
            let hi = top_p * (sum + bound) * (1.0 + 1e-12);
            let mut acc = 0.0;
            let mut end = None;
            for (i, c) in kept.iter().enumerate() {
                if i > 0 && acc >= lo {
                    end = Some(i);
                    break;
                }
                acc += c.0;
            }
            let end = end?;
            // The same end for the largest total, and the last kept token weighing strictly
            // more than the K-th (so that no token outside the candidates ties with it).
            if acc < hi || (tail && kept[end - 1].0 <= weight(floor)) {
                return None;
            }
            end
        } else {
            // No nucleus: every kept token is drawn from, in id order as the full path does.
            kept.sort_unstable_by_key(|c| c.1);
            kept.len()
        };
        // The same draw as the full path's, over the same candidates in the same order.
        draw(&mut self.rng, &kept[..n]).map(|((_, id), _)| id)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::sampler;
    use super::super::{SamplingParams, Xoshiro256};
    use super::*;

    /// What the device's TopK gives: the `k` largest logits, largest first, lower id first
    /// among equal values.
    fn top(l: &[f32], k: usize) -> Vec<(f32, u32)> {
        let mut c: Vec<(f32, u32)> = l.iter().enumerate().map(|(i, v)| (*v, i as u32)).collect();
        c.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        c.truncate(k);
        c
    }

    /// Logits of three kinds: a confident model's (one token far ahead, a few plausible),
    /// flat ones, and coarse ones full of ties.
    fn logits(kind: u64, n: usize, seed: u64) -> Vec<f32> {
        let mut r = Xoshiro256::from_seed(seed);
        let mut l: Vec<f32> = (0..n).map(|_| (r.next_f64() * 6.0 - 3.0) as f32).collect();
        match kind {
            0 => {
                let best = (r.next_u64() % n as u64) as usize;
                l[best] += 12.0 + (r.next_f64() * 4.0) as f32;
                for _ in 0..3 {
                    let i = (r.next_u64() % n as u64) as usize;
                    l[i] += 9.0 + (r.next_f64() * 3.0) as f32;
                }
            }
            1 => {}
            _ => l
                .iter_mut()
                .for_each(|v| *v = (*v * 2.0).round() / 2.0 + 8.0),
        }
        l
    }

    #[test]
    fn candidates_choose_what_the_full_logits_choose() {
        let (n, k) = (500, 16);
        let mut decided = [0usize; 3];
        let mut cases = [0usize; 3];
        for kind in 0..3u64 {
            for seed in 0..40u64 {
                let l = logits(kind, n, 1000 * kind + seed);
                let cands = top(&l, k);
                for t in [0.005f32, 0.2, 0.7, 1.0, 1.5] {
                    for p in [0.5f32, 0.9, 0.95, 1.0] {
                        for tk in [0usize, 1, 5, 15, 16, 40] {
                            cases[kind as usize] += 2;
                            let mut a = sampler(t, p, tk, seed);
                            let mut b = sampler(t, p, tk, seed);
                            let ctx = format!("kind {kind} seed {seed} T {t} top_p {p} top_k {tk}");
                            // Twice, each draw followed by a full one: decided or not, the
                            // two generators stay in step.
                            for _ in 0..2 {
                                match a.next_from_candidates(&cands, n, &[]) {
                                    Some(id) => {
                                        decided[kind as usize] += 1;
                                        assert_eq!(id, b.next(&mut l.clone(), &[]), "{ctx}");
                                    }
                                    None => {
                                        let x = a.next(&mut l.clone(), &[]);
                                        assert_eq!(x, b.next(&mut l.clone(), &[]), "{ctx}");
                                    }
                                }
                                let x = a.next(&mut l.clone(), &[]);
                                assert_eq!(x, b.next(&mut l.clone(), &[]), "{ctx}: out of step");
                            }
                        }
                    }
                }
            }
        }
        // A confident model's steps are mostly decided by 16 candidates; flat logits only
        // where top-k keeps fewer than the candidates (and ties at the edge fall back).
        assert!(decided[0] * 10 >= cases[0] * 7, "{decided:?} of {cases:?}");
        assert!(decided[1] > 0 && decided[2] > 0, "{decided:?} of {cases:?}");
    }

    #[test]
    fn lightonocrs_defaults_on_a_confident_step_need_no_full_logits() {
        // Temperature 0.2, top-p 0.9, top-k off, 151 936 ids: decided by 64 candidates.
        let n = 151_936;
        for seed in 0..20 {
            let l = logits(0, n, seed);
            let mut a = sampler(0.2, 0.9, 0, seed);
            let mut b = sampler(0.2, 0.9, 0, seed);
            let id = a.next_from_candidates(&top(&l, 64), n, &[]);
            assert_eq!(id, Some(b.next(&mut l.clone(), &[])), "seed {seed}");
        }
    }

    #[test]
    fn penalties_greedy_and_broken_logits_take_the_full_path() {
        let l = logits(0, 100, 1);
        let cands = top(&l, 16);
        assert_eq!(
            sampler(0.0, 1.0, 0, 1).next_from_candidates(&cands, 100, &[]),
            None
        );
        let mut s = Sampler::new(SamplingParams {
            temperature: 0.2,
            top_p: 0.9,
            repetition_penalty: 1.2,
            seed: Some(1),
            ..SamplingParams::greedy()
        })
        .unwrap();
        assert_eq!(s.next_from_candidates(&cands, 100, &[3]), None);
        assert!(
            s.next_from_candidates(&cands, 100, &[]).is_some(),
            "no history: no penalty"
        );
        let mut nan = cands.clone();
        nan[3].0 = f32::NAN;
        assert_eq!(
            sampler(0.2, 0.9, 0, 1).next_from_candidates(&nan, 100, &[]),
            None
        );
        assert_eq!(
            sampler(0.2, 0.9, 0, 1).next_from_candidates(&[], 100, &[]),
            None
        );
        // top-p off and no top-k: every token can be drawn, so the candidates cannot decide.
        assert_eq!(
            sampler(0.2, 1.0, 0, 1).next_from_candidates(&cands, 100, &[]),
            None
        );
    }
}
