//! Sampling from the device's candidates: the K largest logits of a step
//! ([`ocrctl_exporters::contract::tensor::TOP_LOGITS`]) instead of the whole vocabulary, when
//! they decide the choice exactly.
//!
//! A sampling step at batch 128 would otherwise move 128 × 151 936 float32 logits (78 MiB) to
//! the host and compute ~19 million exponentials there; with the candidates it moves 96 KiB and
//! computes a few hundred. Exactness is a property test below: the same id as the full path
//! for the same generator state, or `None` and nothing drawn.

use super::{biased, draw, penalised_all, Sampler, SamplingParams, MIN_TEMPERATURE};
use std::borrow::Cow;
use std::collections::HashMap;

/// How often each id of a growing history occurs, extended step by step: a penalised step
/// then looks up its K candidates instead of counting the whole history again.
#[derive(Debug, Clone, Default)]
pub(super) struct Seen {
    ids: HashMap<u32, u32>,
    /// How much of the history `ids` holds, and its last id.
    len: usize,
    last: Option<u32>,
}

impl Seen {
    /// Each distinct id of `history` and its count: extended when it continues the history
    /// of the last call (as the generated tokens of a request do), rebuilt otherwise.
    fn of(&mut self, history: &[u32]) -> &HashMap<u32, u32> {
        let continues = history.len() >= self.len
            && (self.len == 0 || history.get(self.len - 1).copied() == self.last);
        if !continues {
            self.ids.clear();
            self.len = 0;
        }
        for id in &history[self.len..] {
            *self.ids.entry(*id).or_insert(0) += 1;
        }
        self.len = history.len();
        self.last = history.last().copied();
        &self.ids
    }
}

impl Sampler {
    /// [`Sampler::next`] from the `K` largest logits only (`cands`: logit and id, as the
    /// device's TopK returns them, largest first, the lower id first among equal values),
    /// for a vocabulary of `vocab` ids; `None` when those cannot decide the choice exactly,
    /// and then nothing was drawn (the generator is untouched: call [`Sampler::next`] with
    /// the full logits).
    ///
    /// Exact means the same id as [`Sampler::next`] on the full logits with the same
    /// generator state. The logit bias and the penalties are applied to the candidates as the
    /// full path applies them; every other token's processed logit is at most the *tail
    /// bound*: the K-th raw logit plus the largest positive bias of an id outside the
    /// candidates, or, when a penalty can raise logits (repetition below 1, negative
    /// presence or frequency), the largest penalised value of that over the history's counts
    /// (bias and penalties are non-decreasing in the logit). Greedy: decided when the
    /// best processed candidate is above the bound. Sampling: decided when the kept tokens
    /// are decided by the candidates alone: top-k keeps only candidates (its threshold above
    /// the bound), or top-p's nucleus ends at a candidate above the bound whatever the other
    /// `vocab - K` tokens weigh (each weighs at most the bound's weight, so their sum is
    /// bounded; the nucleus must end at the same place for any sum up to that bound). The
    /// weights and the draw are computed as in the full path, in the same order, so the
    /// choice is the same number, not an approximation. At temperature 0.2 and top-p 0.9
    /// (LightOnOCR's defaults) a confident model's next token is decided by 64 candidates.
    pub fn next_from_candidates(
        &mut self,
        cands: &[(f32, u32)],
        vocab: usize,
        history: &[u32],
    ) -> Option<u32> {
        let k = cands.len();
        if k == 0 || cands.iter().any(|(v, _)| !v.is_finite()) {
            return None;
        }
        let (cands, floor) = self.processed(cands, history);
        let p = &self.params;
        let outside = vocab > k;
        if p.is_greedy() {
            // The first id among the largest: no token outside may reach it.
            return (!outside || cands[0].0 > floor).then_some(cands[0].1);
        }
        // top-k: tokens at or above the top_k-th logit. Inside the candidates only when that
        // threshold is above the bound (a tie with it may continue outside).
        let top_k = p.top_k;
        let (threshold, tail) = if top_k > 0 && top_k < k.min(vocab) {
            let t = cands[top_k - 1].0;
            if t <= floor {
                return None;
            }
            (t, false)
        } else {
            (f32::NEG_INFINITY, outside)
        };
        let top_p = p.top_p as f64;
        if tail && (top_p >= 1.0 || cands[0].0 <= floor) {
            // Every token with a positive weight is kept and can be drawn, or the largest
            // logit (which every weight is relative to) may lie outside.
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
            // What the tokens outside the candidates weigh at most, together and each.
            let outside_weight = match tail {
                true => ((vocab - k) as f64 * weight(floor), Some(weight(floor))),
                false => (0.0, None),
            };
            nucleus_end(&kept, top_p, outside_weight)?
        } else {
            // No nucleus: every kept token is drawn from, in id order as the full path does.
            kept.sort_unstable_by_key(|c| c.1);
            kept.len()
        };
        // The same draw as the full path's, over the same candidates in the same order.
        draw(&mut self.rng, &kept[..n]).map(|((_, id), _)| id)
    }
}

impl Sampler {
    /// The candidates as the full path sees them after the logit bias and the penalties
    /// (re-sorted), and the bound on every other token's processed logit (see
    /// [`Sampler::next_from_candidates`]).
    fn processed<'c>(
        &mut self,
        cands: &'c [(f32, u32)],
        history: &[u32],
    ) -> (Cow<'c, [(f32, u32)]>, f32) {
        let raw_floor = cands[cands.len() - 1].0;
        let penalise = self.params.penalises() && !history.is_empty();
        let bias = &self.params.logit_bias;
        if !penalise && bias.is_empty() {
            return (Cow::Borrowed(cands), raw_floor);
        }
        let seen = penalise.then(|| self.seen.of(history));
        let p = &self.params;
        let bias_of = |id: u32| {
            bias.binary_search_by_key(&id, |b| b.0)
                .map_or(0.0, |i| bias[i].1)
        };
        let mut pc: Vec<(f32, u32)> = cands
            .iter()
            .map(|&(v, id)| {
                let v = biased(v, bias_of(id));
                match seen.as_ref().and_then(|s| s.get(&id)) {
                    Some(&c) => (penalised_all(v, c as usize, p), id),
                    None => (v, id),
                }
            })
            .collect();
        pc.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        // Before the penalties, a token outside has at most the K-th raw logit plus the
        // largest positive bias of an id that is not a candidate.
        let lift = bias
            .iter()
            .filter(|(id, b)| *b > 0.0 && !cands.iter().any(|c| c.1 == *id))
            .fold(0.0f32, |m, b| m.max(b.1));
        let floor = biased(raw_floor, lift);
        let floor = match seen {
            Some(seen) if raises(p) => seen
                .values()
                .fold(floor, |m, &c| m.max(penalised_all(floor, c as usize, p))),
            _ => floor,
        };
        (Cow::Owned(pc), floor)
    }
}

/// How many of `kept` (weights, largest first) top-p's nucleus takes, when the candidates
/// decide it whatever the tokens outside them weigh: `outside` is the most they weigh
/// together, and the most one of them weighs (`None`: there are none).
fn nucleus_end(kept: &[(f64, u32)], top_p: f64, outside: (f64, Option<f64>)) -> Option<usize> {
    let (bound, each) = outside;
    let sum: f64 = kept.iter().map(|c| c.0).sum();
    // The full path's total lies in [sum, sum + bound] (and differs from `sum` by
    // rounding, since it adds in id order): the nucleus must end at the same token
    // for every total in that range, widened by a relative 1e-12.
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
    // more than the bound (so that no token outside the candidates ties with it).
    if acc < hi || each.is_some_and(|w| kept[end - 1].0 <= w) {
        return None;
    }
    Some(end)
}

/// Whether a penalty of `p` can raise a logit: a repetition penalty below 1, or a negative
/// presence or frequency penalty (otherwise every penalised logit is at most the raw one).
fn raises(p: &SamplingParams) -> bool {
    p.repetition_penalty < 1.0 || p.presence_penalty < 0.0 || p.frequency_penalty < 0.0
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
    fn broken_logits_and_open_tails_take_the_full_path() {
        let l = logits(0, 100, 1);
        let cands = top(&l, 16);
        // Greedy is decided by the first candidate (ahead of the 16th).
        assert_eq!(
            sampler(0.0, 1.0, 0, 1).next_from_candidates(&cands, 100, &[]),
            Some(cands[0].1)
        );
        let mut nan = cands.clone();
        nan[3].0 = f32::NAN;
        assert_eq!(
            sampler(0.2, 0.9, 0, 1).next_from_candidates(&nan, 100, &[]),
            None
        );
        assert_eq!(
            sampler(0.0, 1.0, 0, 1).next_from_candidates(&nan, 100, &[]),
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
        // Greedy with every candidate penalised below the 16th raw logit: a token outside
        // may be the largest now.
        let flat: Vec<(f32, u32)> = (0..16).map(|i| (5.0, i)).collect();
        let mut g = Sampler::new(SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::greedy()
        })
        .unwrap();
        assert_eq!(g.next_from_candidates(&flat, 100, &[0, 1, 2]), None);
    }

    /// Seeded parameters: temperature `t`, top-p `p`, top-k `tk`, the repetition, presence
    /// and frequency penalties `pen`, and `bias`.
    fn seeded(
        t: f32,
        p: f32,
        tk: usize,
        pen: (f32, f32, f32),
        bias: &[(u32, f32)],
        seed: u64,
    ) -> SamplingParams {
        SamplingParams {
            temperature: t,
            top_p: p,
            top_k: tk,
            repetition_penalty: pen.0,
            presence_penalty: pen.1,
            frequency_penalty: pen.2,
            logit_bias: super::super::logit_bias(bias.iter().copied()),
            seed: Some(seed),
            ..SamplingParams::greedy()
        }
    }

    #[test]
    fn penalised_and_greedy_steps_choose_what_the_full_logits_choose() {
        let (n, k) = (500, 16);
        // Decided steps with penalties that only lower logits, ones that can raise them, and
        // greedy ones: repetition penalties above and below 1, presence and frequency
        // penalties of both signs up to the range's ends, and mixes.
        let (mut lowering, mut raising, mut greedy, mut counted, mut cases) = (0, 0, 0, 0, 0);
        for kind in 0..3u64 {
            for seed in 0..30u64 {
                let l = logits(kind, n, 7000 + 1000 * kind + seed);
                let order = top(&l, n);
                let cands = &order[..k];
                // The best candidate, a middle one, the last, the two just outside (a penalty
                // below 1 may lift them past the K-th) and a random id; each kept or not.
                let mut r = Xoshiro256::from_seed(seed);
                let mut history: Vec<u32> = [0, k / 2, k - 1, k, k + 1]
                    .iter()
                    .map(|&i| order[i].1)
                    .chain([(r.next_u64() % n as u64) as u32])
                    .collect();
                history.retain(|_| !r.next_u64().is_multiple_of(3));
                // Repeats, for the frequency penalty to count.
                let again: Vec<u32> = history.iter().take(2).copied().collect();
                history.extend(again.iter().chain(&again[..again.len().min(1)]));
                for (pen, pres, freq) in [
                    (1.0f32, 0.0f32, 0.0f32),
                    (1.05, 0.0, 0.0),
                    (1.3, 0.0, 0.0),
                    (3.0, 0.0, 0.0),
                    (0.9, 0.0, 0.0),
                    (0.5, 0.0, 0.0),
                    (1.0, 0.5, 0.0),
                    (1.0, 0.0, 0.3),
                    (1.0, 2.0, 2.0),
                    (1.0, -0.5, 0.0),
                    (1.0, 0.0, -0.4),
                    (1.0, -2.0, -2.0),
                    (1.2, 1.0, 0.5),
                    (0.8, -1.0, 0.3),
                ] {
                    for t in [0.0f32, 0.2, 1.0] {
                        for p in [0.9f32, 1.0] {
                            for tk in [0usize, 5, 40] {
                                let params = seeded(t, p, tk, (pen, pres, freq), &[], seed);
                                let mut a = Sampler::new(params.clone()).unwrap();
                                let mut b = Sampler::new(params).unwrap();
                                let ctx = format!(
                                    "kind {kind} seed {seed} penalties {pen}/{pres}/{freq} T {t} \
                                     top_p {p} \
                                     top_k {tk} history {history:?}"
                                );
                                cases += 1;
                                // Twice: the second call reuses the history's ids.
                                for _ in 0..2 {
                                    let full = b.next(&mut l.clone(), &history);
                                    match a.next_from_candidates(cands, n, &history) {
                                        Some(id) => {
                                            assert_eq!(id, full, "{ctx}");
                                            match (t == 0.0, raises(a.params())) {
                                                (true, _) => greedy += 1,
                                                (false, false) => lowering += 1,
                                                (false, true) => raising += 1,
                                            }
                                            if pres != 0.0 || freq != 0.0 {
                                                counted += 1;
                                            }
                                        }
                                        None => {
                                            let x = a.next(&mut l.clone(), &history);
                                            assert_eq!(x, full, "{ctx}");
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        // Most greedy steps are decided (two calls per case, a third of them greedy), and
        // sampled ones under each kind of penalty, presence and frequency among them.
        assert!(
            greedy * 3 >= cases && lowering > 0 && raising > 0 && counted > cases / 10,
            "{greedy} {lowering} {raising} {counted} of {cases}"
        );
    }

    #[test]
    fn biased_steps_choose_what_the_full_logits_choose() {
        let (n, k) = (500, 16);
        let (mut decided, mut undecided, mut cases) = (0, 0, 0);
        for kind in 0..3u64 {
            for seed in 0..20u64 {
                let l = logits(kind, n, 9000 + 1000 * kind + seed);
                let order = top(&l, n);
                let cands = &order[..k];
                let id = |i: usize| order[i].1;
                let history = [id(1), id(k / 2), id(k), id(k / 2)];
                // Bans of the best candidates, a raise inside, raises of ids just outside
                // and far outside (+100), lowerings, every candidate banned, and a third
                // of the vocabulary lowered.
                let sets: Vec<Vec<(u32, f32)>> = vec![
                    vec![(id(0), -100.0)],
                    vec![(id(0), -100.0), (id(1), -100.0), (id(k / 2), 0.5)],
                    vec![(id(k), 0.3)],
                    vec![(id(n - 1), 100.0)],
                    vec![(id(k - 1), 3.0), (id(k + 1), -2.0)],
                    (0..k).map(|i| (id(i), -100.0)).collect(),
                    (0..n as u32).step_by(3).map(|j| (j, -5.0)).collect(),
                ];
                for bias in &sets {
                    for (pen, pres, freq) in
                        [(1.0f32, 0.0f32, 0.0f32), (1.3, 0.5, 0.0), (0.8, -0.5, 0.2)]
                    {
                        for t in [0.0f32, 0.2, 1.0] {
                            for (p, tk) in [(0.9f32, 0usize), (1.0, 0), (1.0, 5)] {
                                let params = seeded(t, p, tk, (pen, pres, freq), bias, seed);
                                let mut a = Sampler::new(params.clone()).unwrap();
                                let mut b = Sampler::new(params).unwrap();
                                let ctx = format!(
                                    "kind {kind} seed {seed} bias {bias:?} penalties \
                                     {pen}/{pres}/{freq} T {t} top_p {p} top_k {tk}"
                                );
                                cases += 1;
                                for h in [&[][..], &history[..]] {
                                    let full = b.next(&mut l.clone(), h);
                                    match a.next_from_candidates(cands, n, h) {
                                        Some(x) => {
                                            assert_eq!(x, full, "{ctx} history {h:?}");
                                            decided += 1;
                                        }
                                        None => {
                                            let x = a.next(&mut l.clone(), h);
                                            assert_eq!(x, full, "{ctx} history {h:?}");
                                            undecided += 1;
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(
            decided > cases / 2 && undecided > cases / 10,
            "{decided} decided, {undecided} not, of {cases} cases"
        );
    }

    #[test]
    fn the_history_ids_follow_a_growing_history_and_rebuild_otherwise() {
        let sorted = |s: &HashMap<u32, u32>| {
            let mut v: Vec<(u32, u32)> = s.iter().map(|(k, v)| (*k, *v)).collect();
            v.sort();
            v
        };
        let mut s = Seen::default();
        assert_eq!(sorted(s.of(&[1, 2, 2])), [(1, 1), (2, 2)]);
        assert_eq!(sorted(s.of(&[1, 2, 2, 7, 1])), [(1, 2), (2, 2), (7, 1)]);
        // Shorter, or the same length with another last id: rebuilt.
        assert_eq!(sorted(s.of(&[5])), [(5, 1)]);
        assert_eq!(sorted(s.of(&[6])), [(6, 1)]);
        assert_eq!(sorted(s.of(&[3, 4, 9, 3])), [(3, 2), (4, 1), (9, 1)]);
    }
}
