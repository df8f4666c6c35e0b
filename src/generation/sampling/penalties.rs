//! What changes a request's raw logits before temperature, top-k and top-p: OpenAI's logit
//! bias, then the penalties on the ids a request has already generated (the repetition
//! penalty, then OpenAI's frequency and presence penalties; see the parent module's docs for
//! the rules).

use super::{clamp_finite, SamplingParams};

/// Adds each `(id, bias)` of `bias` to that id's logit in place (ids outside `logits` are
/// ignored; [`SamplingParams::check_vocab`] refuses them earlier).
pub fn apply_logit_bias(logits: &mut [f32], bias: &[(u32, f32)]) {
    for &(id, b) in bias {
        if let Some(v) = logits.get_mut(id as usize) {
            *v = biased(*v, b);
        }
    }
}

/// One logit plus its bias, as both the full path and the candidates compute it: in f64,
/// clamped into f32's finite range; `-inf` stays `-inf`. Non-decreasing in `v`.
pub(super) fn biased(v: f32, bias: f32) -> f32 {
    if v == f32::NEG_INFINITY || bias == 0.0 {
        return v;
    }
    clamp_finite(v as f64 + bias as f64)
}

/// Applies every penalty of `params` in place to the ids of `history` (the module docs give
/// the order): the repetition penalty to each distinct id, then `count × frequency_penalty +
/// presence_penalty` subtracted. Ids outside `logits` are ignored.
pub fn apply_penalties(logits: &mut [f32], history: &[u32], params: &SamplingParams) {
    if !params.penalises() || history.is_empty() {
        return;
    }
    let mut ids = history.to_vec();
    ids.sort_unstable();
    for run in ids.chunk_by(|a, b| a == b) {
        if let Some(v) = logits.get_mut(run[0] as usize) {
            *v = penalised_all(*v, run.len(), params);
        }
    }
}

/// One logit of an id seen `count` times under every penalty of `params`. Non-decreasing
/// in `v` ([`Sampler::next_from_candidates`](super::Sampler::next_from_candidates) relies on it); `-inf` stays `-inf`.
pub(super) fn penalised_all(v: f32, count: usize, params: &SamplingParams) -> f32 {
    if v == f32::NEG_INFINITY {
        return v;
    }
    let v = match params.repetition_penalty {
        1.0 => v,
        r => penalised(v, r),
    };
    let (f, p) = (params.frequency_penalty, params.presence_penalty);
    if f == 0.0 && p == 0.0 {
        return v;
    }
    clamp_finite(v as f64 - count as f64 * f as f64 - p as f64)
}

/// One logit under the repetition `penalty`: divided by it when positive, multiplied
/// otherwise. In f64, then clamped into f32's finite range: a penalty near 0 (or near
/// f32::MAX) must not turn a logit into ±inf, which would make every weight NaN downstream.
/// Non-decreasing in `v`, which [`Sampler::next_from_candidates`](super::Sampler::next_from_candidates) relies on.
fn penalised(v: f32, penalty: f32) -> f32 {
    let x = v as f64;
    let y = if x > 0.0 {
        x / penalty as f64
    } else {
        x * penalty as f64
    };
    clamp_finite(y)
}
