//! What a GQA decoder run brings back to the host, row by row.
//!
//! A step's rows need different things ([`RowNeed`]): greedy rows only the device's argmax
//! (`next_token`), sampling rows only the K largest logits (`top_logits`/`top_ids`), and rows
//! that report log-probabilities or apply penalties the full logits. [`Fetch`] decides which
//! outputs cross to the host for a step; [`rows_out`] hands each row its part; [`LastLogits`]
//! keeps the step's logits where they were computed, so that a sampling row whose candidates
//! did not decide the draw can still have its full row ([`crate::runtime::backend::Backend::step_logits`]).

use super::PART;
use crate::runtime::backend::{BackendError, RowNeed, StepLogits};
use ort::memory::Allocator;
use ort::value::Tensor;

/// Which outputs of a run are copied to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::runtime::ortmodel) struct Fetch {
    /// `logits [rows, 1, vocab]`.
    pub full: bool,
    /// `next_token [rows, 1]`.
    pub argmax: bool,
    /// `top_logits`, `top_ids [rows, 1, K]`.
    pub top: bool,
}

impl Fetch {
    /// The outputs `want` needs from a graph that has (or lacks) the argmax and candidate
    /// outputs; a row whose output the graph lacks gets the full logits.
    pub fn plan(want: &[(usize, RowNeed)], has_next: bool, has_top: bool) -> Fetch {
        let needs = |n: RowNeed| want.iter().any(|(_, w)| *w == n);
        Fetch {
            full: needs(RowNeed::Full)
                || (needs(RowNeed::Argmax) && !has_next)
                || (needs(RowNeed::Candidates) && !has_top),
            argmax: needs(RowNeed::Argmax) && has_next,
            top: needs(RowNeed::Candidates) && has_top,
        }
    }
}

/// A run's candidates on the host: values and ids (`[rows, K]` row-major), K, and the
/// rows' log-normalisers when the graph has them (`logsumexp`; empty otherwise).
pub(in crate::runtime::ortmodel) struct TopOut<'a> {
    pub values: &'a [f32],
    pub ids: &'a [i64],
    pub k: usize,
    pub lse: &'a [f32],
}

/// Each wanted row's part of a run's host outputs: `logits` (data, vocab) when fetched,
/// `next` (one id per row; empty when not fetched), `top` when fetched.
pub(in crate::runtime::ortmodel) fn rows_out(
    want: &[(usize, RowNeed)],
    logits: Option<(&[f32], usize)>,
    next: &[i64],
    top: Option<TopOut>,
    vocab: usize,
) -> Vec<StepLogits> {
    want.iter()
        .map(|&(r, need)| match (need, logits, &top) {
            (RowNeed::Argmax, _, _) if !next.is_empty() => StepLogits::Argmax(next[r] as u32),
            (RowNeed::Candidates, _, Some(t)) => StepLogits::Candidates {
                top: (r * t.k..(r + 1) * t.k)
                    .map(|i| (t.values[i], t.ids[i] as u32))
                    .collect(),
                vocab,
                lse: t.lse.get(r).map(|v| *v as f64),
            },
            (_, Some((d, vocab)), _) => StepLogits::Full(d[r * vocab..(r + 1) * vocab].to_vec()),
            // Fetch::plan fetches the logits whenever a row's own output is missing.
            _ => unreachable!("row {r} ({need:?}): no output fetched for it"),
        })
        .collect()
}

/// Where the last decode step left its logits, and the logits row of each of its sequences.
pub(in crate::runtime::ortmodel) struct LastLogits {
    pub at: LogitsAt,
    pub rows: Vec<usize>,
    pub vocab: usize,
    /// The host copy of all of them, made by the first row asked for (one copy per step).
    pub host: Option<Vec<f32>>,
}

impl LastLogits {
    /// The logits at `at` of a run whose rows were `want` (nothing copied yet).
    pub fn new(at: LogitsAt, want: &[(usize, RowNeed)], vocab: usize) -> LastLogits {
        LastLogits {
            at,
            rows: want.iter().map(|(r, _)| *r).collect(),
            vocab,
            host: None,
        }
    }
}

/// The tensor holding a step's logits `[rows, 1, vocab]`.
pub(in crate::runtime::ortmodel) enum LogitsAt {
    /// The output of an uncaptured run (device or host memory).
    Run(Tensor<f32>),
    /// The fixed logits buffer of CUDA-graph bucket `i`.
    Bucket(usize),
}

/// `logits [rows, 1, vocab]` copied to the host (as is when already there).
pub(in crate::runtime::ortmodel) fn to_host(
    logits: &Tensor<f32>,
) -> Result<Vec<f32>, BackendError> {
    let rt = |e: ort::Error| BackendError::runtime(PART, e);
    if logits.memory_info().is_cpu_accessible() {
        return Ok(logits.extract_tensor().1.to_vec());
    }
    let shape = logits.shape().to_vec();
    let mut t = Tensor::<f32>::new(&Allocator::default(), shape).map_err(rt)?;
    logits.copy_into(&mut t).map_err(rt)?;
    Ok(t.extract_tensor().1.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_row_gets_the_output_it_needs() {
        use RowNeed::*;
        let want = [(0, Argmax), (2, Candidates), (1, Full)];
        assert_eq!(
            Fetch::plan(&want, true, true),
            Fetch {
                full: true,
                argmax: true,
                top: true
            }
        );
        // A graph without candidate outputs: sampling rows get full logits.
        let f = Fetch::plan(&[(0, Candidates)], true, false);
        assert!(f.full && !f.top && !f.argmax);
        let logits: Vec<f32> = (0..12).map(|i| i as f32).collect(); // 3 rows x vocab 4
        let next = [3i64, 0, 1];
        let (tv, ti) = ([9.0f32, 8.0, 7.0, 6.0, 5.0, 4.0], [1i64, 2, 0, 3, 2, 1]); // K = 2
        let lse = [1.5f32, 2.5, 3.5];
        let top = |lse| TopOut {
            values: &tv,
            ids: &ti,
            k: 2,
            lse,
        };
        let out = rows_out(&want, Some((&logits, 4)), &next, Some(top(&lse)), 4);
        assert_eq!(out[0], StepLogits::Argmax(3));
        assert_eq!(
            out[1],
            StepLogits::Candidates {
                top: vec![(5.0, 2), (4.0, 1)],
                vocab: 4,
                lse: Some(3.5)
            }
        );
        // A graph without `logsumexp`: candidates without the normaliser.
        let out = rows_out(&want, Some((&logits, 4)), &next, Some(top(&[])), 4);
        assert!(matches!(out[1], StepLogits::Candidates { lse: None, .. }));
        assert_eq!(out[2], StepLogits::Full(vec![4.0, 5.0, 6.0, 7.0]));
    }
}
