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
//! The parameters and their checks are in `params`, a caller's values over a model's defaults
//! in `overrides` ([`SamplingOverrides`]), the penalties in `penalties`, choosing from the
//! device's candidates in `candidates`.

use crate::generation::generate::TokenLogprob;
use std::sync::atomic::{AtomicU64, Ordering};

mod candidates;
mod loop_guard;
mod overrides;
mod params;
mod penalties;
pub use loop_guard::{detect_loop, find_loop, LoopGuard, LoopMatch};
pub use overrides::SamplingOverrides;
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
mod tests;
