//! What each request of a decode step needs from the backend, and choosing its token (and
//! its log-probabilities) from the device's candidates (see [`RowNeed`]).

use super::GenRequest;
use crate::generation::generate::TokenLogprob;
use crate::generation::sampling::Sampler;
use crate::runtime::backend::{Backend, BackendError, RowNeed};
use ocrctl_exporters::contract::tensor::SAMPLING_CANDIDATES;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Whether the argmax of a request's logits is all its next token needs: greedy, no
/// penalty or logit bias, no log-probabilities.
pub(super) fn argmax_is_enough(req: &GenRequest) -> bool {
    req.params.is_greedy()
        && !req.params.modifies_logits()
        && !req.logprobs
        && req.top_logprobs == 0
}

/// What a request needs of its next decoder step: the greedy choice when that is all it
/// needs, otherwise the device's candidates (its token, log-probabilities and penalties come
/// from them when they decide; [`from_candidates`] falls back to the full logits), or the
/// full logits when it asks for more top log-probabilities than there are candidates.
pub(super) fn row_need(req: &GenRequest) -> RowNeed {
    if argmax_is_enough(req) {
        RowNeed::Argmax
    } else if req.top_logprobs <= SAMPLING_CANDIDATES {
        RowNeed::Candidates
    } else {
        RowNeed::Full
    }
}

/// A token chosen from the candidates, with what its request reports of the step: the
/// chosen token's log-probability and the `top_logprobs` most likely tokens (raw
/// log-probabilities, as the full path reports them).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Chosen {
    pub id: u32,
    pub logprob: Option<f32>,
    pub top: Vec<TokenLogprob>,
}

/// The next token of step row `row` from its candidates (`cands`, largest first; `lse` the
/// row's log-normaliser when the backend gave it), drawn now (the request's generator moves
/// on), or the row's full logits from `backend` when the candidates cannot decide it or
/// cannot give the log-probabilities asked for (nothing drawn yet). A panic in the sampler
/// counts as undecided: the full path then fails that request alone, as any sampling panic
/// does.
#[allow(clippy::too_many_arguments)]
pub(super) fn from_candidates<B: Backend>(
    backend: &mut B,
    req: &GenRequest,
    sampler: &mut Sampler,
    cands: &[(f32, u32)],
    vocab: usize,
    lse: Option<f64>,
    history: &[u32],
    row: usize,
) -> Result<(Vec<f32>, Option<Chosen>), BackendError> {
    let scored = req.logprobs || req.top_logprobs > 0;
    let lse = match lse {
        Some(l) if l.is_finite() => Some(l),
        _ => None,
    };
    if scored && (lse.is_none() || req.top_logprobs > cands.len()) {
        return Ok((backend.step_logits(row)?, None));
    }
    let drawn = catch_unwind(AssertUnwindSafe(|| {
        sampler.next_from_candidates(cands, vocab, history)
    }));
    let Ok(Some(id)) = drawn else {
        return Ok((backend.step_logits(row)?, None));
    };
    let logprob = |v: f32| (v as f64 - lse.unwrap_or(0.0)) as f32;
    let chosen = Chosen {
        id,
        // A decided token is always a candidate.
        logprob: scored
            .then(|| cands.iter().find(|c| c.1 == id).map(|c| logprob(c.0)))
            .flatten(),
        top: cands[..req.top_logprobs.min(cands.len())]
            .iter()
            .map(|&(v, id)| TokenLogprob {
                id,
                logprob: logprob(v),
            })
            .collect(),
    };
    Ok((Vec::new(), Some(chosen)))
}
