//! What each request of a decode step needs from the backend, and drawing its token from
//! the device's sampling candidates (see [`RowNeed`]).

use super::GenRequest;
use crate::generation::sampling::Sampler;
use crate::runtime::backend::{Backend, BackendError, RowNeed};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Whether the argmax of a request's logits is all its next token needs: greedy, no
/// repetition penalty, no log-probabilities.
pub(super) fn argmax_is_enough(req: &GenRequest) -> bool {
    req.params.is_greedy()
        && req.params.repetition_penalty == 1.0
        && !req.logprobs
        && req.top_logprobs == 0
}

/// What a request needs of its next decoder step: the greedy choice, the sampling
/// candidates (sampling without log-probabilities; the sampler falls back to the full logits
/// when they do not decide the draw), or the full logits.
pub(super) fn row_need(req: &GenRequest) -> RowNeed {
    if argmax_is_enough(req) {
        RowNeed::Argmax
    } else if !req.params.is_greedy() && !req.logprobs && req.top_logprobs == 0 {
        RowNeed::Candidates
    } else {
        RowNeed::Full
    }
}

/// The next token of step row `row` from its sampling candidates, drawn now (the request's
/// generator moves on), or the row's full logits from `backend` when the candidates do not
/// decide the draw (nothing drawn yet). A panic in the sampler counts as undecided: the full
/// path then fails that request alone, as any sampling panic does.
pub(super) fn sample_candidates<B: Backend>(
    backend: &mut B,
    sampler: &mut Sampler,
    cands: &[(f32, u32)],
    vocab: usize,
    history: &[u32],
    row: usize,
) -> Result<(Vec<f32>, Option<u32>), BackendError> {
    let drawn = catch_unwind(AssertUnwindSafe(|| {
        sampler.next_from_candidates(cands, vocab, history)
    }));
    match drawn {
        Ok(Some(id)) => Ok((Vec::new(), Some(id))),
        _ => Ok((backend.step_logits(row)?, None)),
    }
}
