//! Per-request token selection: greedy, temperature, top-k, top-p (nucleus), logit bias,
//! penalties, a seeded random generator and a guard against runaway repetition loops.
//!
//! The semantics follow what users know from transformers and vLLM:
//!
//! 0. **Logit bias** (OpenAI's `logit_bias`): each listed id's bias, in `[-100, 100]`, is
//!    added to its raw logit, before the penalties as vLLM does; -100 bans an id in practice,
//!    +100 all but forces it.
//! 1. **Repetition penalty** (transformers' `RepetitionPenaltyLogitsProcessor`, the CTRL
//!    paper's rule): for every *distinct* token id of `history`, a positive logit is divided
//!    by the penalty and a negative one multiplied by it. `1.0` is off. It applies in greedy
//!    mode too, as in transformers. Then OpenAI's **frequency and presence penalties** (as
//!    vLLM applies them, after the repetition penalty): an id seen `c` times in `history`
//!    loses `c × frequency_penalty + presence_penalty`; both `0` = off, each in `[-2, 2]`.
//! 2. **Temperature** `0` selects the largest logit (the first one on ties, as
//!    `torch.argmax` and [`crate::generation::generate::argmax_and_top_k`]); otherwise the logits are
//!    divided by the temperature.
//! 3. **Top-k** (`0` = off) keeps every token whose logit is at least the k-th largest one
//!    (transformers' `TopKLogitsWarper`: ties at the boundary are kept).
//! 4. **Top-p** keeps the smallest set of most likely tokens whose cumulative probability
//!    reaches `top_p`, always at least one (transformers' `TopPLogitsWarper`, vLLM). It is
//!    computed on the distribution left by top-k.
//! 5. The kept tokens are renormalised and one is drawn by inverse CDF in `f64` with the
//!    request's own generator (xoshiro256** seeded through splitmix64).
//!
//! # Which tokens are penalised
//!
//! [`Sampler::next`] penalises the ids of the `history` slice it is given, and the engine
//! passes **the generated tokens only**, not the prompt. transformers and vLLM penalise the
//! prompt as well, but a LightOnOCR prompt is a few chat-template tokens plus thousands of
//! image placeholder ids: the placeholders are never generated, so penalising them does
//! nothing, while penalising the template's tokens (`\n`, `user`, `assistant`, ...) would push
//! newlines and common words out of the transcription. Penalising what the model already
//! wrote is what stops it from writing the same line again. A caller that wants llama.cpp's
//! "last N tokens" behaviour passes `&generated[generated.len().saturating_sub(n)..]`.
//!
//! # Determinism
//!
//! For a fixed `seed` and bit-identical logits the tokens are identical run after run: each
//! sampled step draws exactly one number, greedy steps draw none. Logits that change in the
//! last bit (another execution provider, another batch shape) can change a sampled token.
//!
//! # Loop guard
//!
//! [`detect_loop`] / [`find_loop`] report when the end of the generated sequence is one block
//! of tokens repeated back to back; see [`LoopGuard`] for the rule and its defaults.
//!
//! The parameters and their checks are in `params`, the penalties in `penalties`, choosing
//! from the device's candidates in `candidates`.

use crate::generation::generate::TokenLogprob;
use std::sync::atomic::{AtomicU64, Ordering};

mod candidates;
mod loop_guard;
mod params;
mod penalties;
pub use loop_guard::{detect_loop, find_loop, LoopGuard, LoopMatch};
pub use params::{logit_bias, SamplingError, SamplingParams};
pub use penalties::{apply_logit_bias, apply_penalties};
use penalties::{biased, penalised_all};

/// Temperatures in `(0, MIN_TEMPERATURE)` sample as if they were `MIN_TEMPERATURE` (vLLM's
/// floor, its `_MAX_TEMP`): the distribution is already greedy in practice, and smaller
/// divisors only push logits towards overflow.
pub const MIN_TEMPERATURE: f64 = 0.01;

/// `x` as an `f32` in the finite range: ±inf (or anything beyond f32) becomes ±`f32::MAX`,
/// NaN becomes `-inf` (the token is impossible).
fn clamp_finite(x: f64) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else {
        x.clamp(f32::MIN as f64, f32::MAX as f64) as f32
    }
}

/// Makes logits safe to sample from: NaN → `-inf` (impossible), `+inf` (an fp16 overflow
/// in the decoder's output, say) → `f32::MAX`. `-inf` stays: it already means impossible.
fn sanitize(logits: &mut [f32]) {
    for v in logits.iter_mut() {
        if v.is_nan() {
            *v = f32::NEG_INFINITY;
        } else if *v == f32::INFINITY {
            *v = f32::MAX;
        }
    }
}

/// Index of the largest logit, the first one on ties; NaN counts as `-inf`. Equals
/// [`crate::generation::generate::argmax_and_top_k`]'s choice on NaN-free logits.
fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best
}

/// xoshiro256** (Blackman and Vigna), its state filled by splitmix64 from a 64-bit seed.
#[derive(Debug, Clone)]
struct Xoshiro256 {
    s: [u64; 4],
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Xoshiro256 {
    fn from_seed(seed: u64) -> Self {
        let mut st = seed;
        let s = [
            splitmix64(&mut st),
            splitmix64(&mut st),
            splitmix64(&mut st),
            splitmix64(&mut st),
        ];
        Xoshiro256 { s }
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Distinct seeds for requests without one: time, process id and a process-wide counter.
fn fresh_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut counter = count;
    let mut st = nanos ^ ((std::process::id() as u64) << 32) ^ splitmix64(&mut counter);
    splitmix64(&mut st)
}

/// Chooses the tokens of one request; create one per request with [`Sampler::new`].
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    rng: Xoshiro256,
    /// Scratch: logits for the top-k threshold.
    values: Vec<f32>,
    /// Scratch: (unnormalised probability, id) of the tokens still in play.
    cands: Vec<(f64, u32)>,
    /// The distinct ids of the history last given to [`Sampler::next_from_candidates`].
    seen: candidates::Seen,
}

impl Sampler {
    /// A sampler for `params` (validated), its generator seeded from `params.seed` or, when
    /// that is `None`, from a fresh seed that [`Sampler::seed`] reports.
    pub fn new(params: SamplingParams) -> Result<Self, SamplingError> {
        params.validate()?;
        let seed = params.seed.unwrap_or_else(fresh_seed);
        Ok(Sampler {
            params,
            seed,
            rng: Xoshiro256::from_seed(seed),
            values: Vec::new(),
            cands: Vec::new(),
            seen: Default::default(),
        })
    }

    /// The parameters this sampler was built with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The seed actually used (the given one, or the fresh one), to reproduce a request.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Whether `generated` ends in a loop under this request's guard (false without one).
    pub fn loop_detected(&self, generated: &[u32]) -> bool {
        self.params
            .loop_guard
            .is_some_and(|g| detect_loop(generated, &g))
    }

    /// Chooses the next token from one position's `logits` (the whole vocabulary),
    /// penalising the ids in `history` (the generated tokens; see the module docs).
    ///
    /// `logits` is processed in place and afterwards holds the distribution the token was
    /// drawn from, as logits: penalised; for temperature > 0 also divided by the temperature,
    /// with tokens removed by top-k/top-p (and NaN) set to `-inf`. Take raw log-probabilities
    /// (what vLLM reports by default) from the logits *before* this call, processed ones from
    /// them *after* (e.g. with [`crate::generation::generate::argmax_and_top_k`]).
    ///
    /// # Panics
    /// When `logits` is empty.
    pub fn next(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.choose(logits, history).0
    }

    /// [`Sampler::next`], also returning the log-probability of the chosen token under the
    /// distribution it was drawn from (greedy: the log-softmax of the penalised logits).
    pub fn next_with_logprob(&mut self, logits: &mut [f32], history: &[u32]) -> TokenLogprob {
        let (id, logprob) = self.choose(logits, history);
        let logprob = match logprob {
            Some(lp) => lp,
            None => log_softmax_at(logits, id as usize),
        };
        TokenLogprob {
            id,
            logprob: logprob as f32,
        }
    }

    /// The chosen id, and its log-probability when sampling computed it anyway.
    fn choose(&mut self, logits: &mut [f32], history: &[u32]) -> (u32, Option<f64>) {
        assert!(!logits.is_empty(), "Sampler::next: empty logits");
        sanitize(logits);
        apply_logit_bias(logits, &self.params.logit_bias);
        apply_penalties(logits, history, &self.params);
        if self.params.is_greedy() {
            return (argmax(logits) as u32, None);
        }
        let (id, lp) = self.sample(logits);
        (id, Some(lp))
    }

    /// Temperature, top-k, top-p and one draw; returns the id and its log-probability.
    fn sample(&mut self, logits: &mut [f32]) -> (u32, f64) {
        let n = logits.len();
        let k = self.params.top_k;
        if k > 0 && k < n {
            // Dividing by a positive temperature keeps the order, so top-k can run first.
            self.values.clear();
            self.values.extend_from_slice(logits);
            let (_, kth, _) = self
                .values
                .select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
            let threshold = *kth;
            for v in logits.iter_mut() {
                if *v < threshold {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
        let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        if max == f32::NEG_INFINITY {
            // Nothing is possible (all logits -inf or NaN): fall back to the first id.
            return (0, 0.0);
        }
        // exp((l - max) / T) in f64: no overflow however small the temperature.
        // vLLM's floor: below 0.01 the distribution is greedy for any practical purpose and
        // dividing by the temperature only risks overflow.
        let t = (self.params.temperature as f64).max(MIN_TEMPERATURE);
        let max64 = max as f64;
        let weight = |v: f32| ((v as f64 - max64) / t).exp();
        self.cands.clear();
        self.cands.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &v)| (weight(v), i as u32))
                .filter(|(w, _)| *w > 0.0),
        );
        let total: f64 = self.cands.iter().map(|(w, _)| w).sum();
        let top_p = self.params.top_p as f64;
        let kept = if top_p < 1.0 {
            let kept = nucleus_len(&mut self.cands, total, top_p);
            for &(_, id) in &self.cands[kept..] {
                logits[id as usize] = f32::NEG_INFINITY;
            }
            kept
        } else {
            self.cands.len()
        };
        for v in logits.iter_mut() {
            if *v != f32::NEG_INFINITY {
                *v = clamp_finite(*v as f64 / t);
            }
        }
        // The largest logit has weight exp(0) = 1 and finite logits (see `sanitize`) give
        // finite weights, so the candidates are never empty and their mass is finite and
        // >= 1; the argmax fallback only guards that reasoning.
        match draw(&mut self.rng, &self.cands[..kept]) {
            Some(((w, id), mass)) => (id, (w / mass).ln()),
            None => (argmax(logits) as u32, 0.0),
        }
    }
}

/// One draw from `cands` (weight, id) in their order, by inverse CDF with one number of `rng`:
/// the chosen candidate and the total mass. `None`, with nothing drawn, when there is no
/// candidate or the mass is not a finite positive number.
fn draw(rng: &mut Xoshiro256, cands: &[(f64, u32)]) -> Option<((f64, u32), f64)> {
    let mass: f64 = cands.iter().map(|(w, _)| w).sum();
    let &last = cands.last().filter(|_| mass.is_finite() && mass > 0.0)?;
    let u = rng.next_f64() * mass;
    let mut acc = 0.0;
    for &c in cands {
        acc += c.0;
        if u < acc {
            return Some((c, mass));
        }
    }
    Some((last, mass))
}

/// Sorts the front of `cands` by decreasing weight (ties: lower id first) far enough to
/// return the nucleus size: the fewest leading tokens whose weight reaches `top_p · total`,
/// at least one. Only a growing prefix is selected and sorted, not the whole vocabulary.
fn nucleus_len(cands: &mut [(f64, u32)], total: f64, top_p: f64) -> usize {
    let order = |a: &(f64, u32), b: &(f64, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    let target = top_p * total;
    let n = cands.len();
    let mut k = n.min(64);
    loop {
        if k < n {
            cands.select_nth_unstable_by(k - 1, order);
        }
        cands[..k].sort_unstable_by(order);
        let mut acc = 0.0;
        for (i, (w, _)) in cands[..k].iter().enumerate() {
            if i > 0 && acc >= target {
                return i;
            }
            acc += w;
        }
        if acc >= target || k == n {
            return k;
        }
        k = n.min(k * 8);
    }
}

/// `log_softmax(logits)[i]` in `f64`, NaN counting as `-inf`.
fn log_softmax_at(logits: &[f32], i: usize) -> f64 {
    let max = logits
        .iter()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    if !max.is_finite() {
        return 0.0;
    }
    let sum: f64 = logits
        .iter()
        .filter(|v| !v.is_nan())
        .map(|&v| (v as f64 - max).exp())
        .sum();
    logits[i] as f64 - max - sum.ln()
}

#[cfg(test)]
mod tests {
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
}
