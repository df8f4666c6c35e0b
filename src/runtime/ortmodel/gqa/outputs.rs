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
use ocrctl_exporters::contract::tensor;
use ort::memory::{Allocator, MemoryInfo};
use ort::session::{IoBinding, RunOptions, Session};
use ort::value::Tensor;

/// The optional outputs a decoder graph has beside `logits` (exports before 2026-12-03
/// lack `logsumexp`; the merged decoder has none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::runtime::ortmodel) struct Extras {
    /// `next_token`, the device's argmax.
    pub next_token: bool,
    /// `top_logits` and `top_ids`, the sampling candidates.
    pub top: bool,
    /// `logsumexp`, the rows' log-normalisers.
    pub lse: bool,
}

impl Extras {
    /// The outputs `decoder` has.
    pub fn of(decoder: &Session) -> Extras {
        let has = |name: &str| decoder.outputs().iter().any(|o| o.name() == name);
        Extras {
            next_token: has(tensor::NEXT_TOKEN),
            top: has(tensor::TOP_LOGITS),
            lse: has(tensor::LOGSUMEXP),
        }
    }
}

/// What [`run_and_read`] returns: each wanted row's output, where the run left its logits,
/// and the nanoseconds of the run and of reading its results.
pub(in crate::runtime::ortmodel) type RunRead = (Vec<StepLogits>, LastLogits, u64, u64);

/// Binds the outputs of `b` beside the caller's inputs (those this run reads to `host`
/// memory, the rest to `device` memory, where they stay), runs it (with `opts` when given)
/// and reads each row of `want` (index into the run's rows, what it needs). The logits stay
/// where the run left them for [`LastLogits`]. `part` names the graph in errors.
#[allow(clippy::too_many_arguments)]
pub(in crate::runtime::ortmodel) fn run_and_read(
    decoder: &mut Session,
    b: &mut IoBinding,
    extras: Extras,
    host: &MemoryInfo<'static>,
    device: &MemoryInfo<'static>,
    want: &[(usize, RowNeed)],
    opts: Option<&RunOptions>,
    part: &str,
) -> Result<RunRead, BackendError> {
    let rt = |e: ort::Error| BackendError::runtime(part, e);
    let fetch = Fetch::plan(want, extras.next_token, extras.top);
    let logits_mem = if fetch.full { host } else { device };
    b.bind_output_to_device(tensor::LOGITS, logits_mem)
        .map_err(rt)?;
    // Outputs the graph has must be bound even when this run does not read them.
    let out_mem = |fetched: bool| if fetched { host } else { device };
    if extras.next_token {
        b.bind_output_to_device(tensor::NEXT_TOKEN, out_mem(fetch.argmax))
            .map_err(rt)?;
    }
    if extras.top {
        for name in [tensor::TOP_LOGITS, tensor::TOP_IDS] {
            b.bind_output_to_device(name, out_mem(fetch.top))
                .map_err(rt)?;
        }
    }
    if extras.lse {
        b.bind_output_to_device(tensor::LOGSUMEXP, out_mem(fetch.top))
            .map_err(rt)?;
    }
    b.synchronize_inputs().map_err(rt)?;
    let t = std::time::Instant::now();
    let mut out = match opts {
        Some(o) => decoder.run_binding_with_options(b, o),
        None => decoder.run_binding(b),
    }
    .map_err(rt)?;
    let run_ns = t.elapsed().as_nanos() as u64;
    let t = std::time::Instant::now();
    let next = match out.remove(tensor::NEXT_TOKEN) {
        Some(v) if fetch.argmax => v.try_extract_tensor::<i64>().map_err(rt)?.1.to_vec(),
        _ => Vec::new(),
    };
    let (top_v, top_i) = match (out.remove(tensor::TOP_LOGITS), out.remove(tensor::TOP_IDS)) {
        (Some(v), Some(i)) if fetch.top => {
            let (shape, v) = v.try_extract_tensor::<f32>().map_err(rt)?;
            let k = shape[shape.len() - 1] as usize;
            let i = i.try_extract_tensor::<i64>().map_err(rt)?.1.to_vec();
            (v.to_vec(), (i, k))
        }
        _ => (Vec::new(), (Vec::new(), 0)),
    };
    let lse = match out.remove(tensor::LOGSUMEXP) {
        Some(v) if fetch.top => v.try_extract_tensor::<f32>().map_err(rt)?.1.to_vec(),
        _ => Vec::new(),
    };
    let logits = out
        .remove(tensor::LOGITS)
        .ok_or_else(|| BackendError::runtime(part, "no logits output"))?
        .downcast::<ort::value::TensorValueType<f32>>()
        .map_err(rt)?;
    let vocab = logits.shape()[2] as usize;
    let data = fetch.full.then(|| (logits.extract_tensor().1, vocab));
    let top = fetch.top.then_some(TopOut {
        values: &top_v,
        ids: &top_i.0,
        k: top_i.1,
        lse: &lse,
    });
    let rows = rows_out(want, data, &next, top, vocab);
    let last = LastLogits::new(LogitsAt::Run(logits), want, vocab);
    Ok((rows, last, run_ns, t.elapsed().as_nanos() as u64))
}

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

/// Row `row` of the last step's logits in `last` (copied to the host once per step; a
/// CUDA-graph bucket's logits are `bucket(i)`, `None` without graphs).
pub(in crate::runtime::ortmodel) fn last_row<'a>(
    last: Option<&mut LastLogits>,
    row: usize,
    bucket: impl FnOnce(usize) -> Option<&'a Tensor<f32>>,
) -> Result<Vec<f32>, BackendError> {
    let last = last.ok_or_else(|| BackendError::Invalid("no decode step has run".into()))?;
    let r = *last
        .rows
        .get(row)
        .ok_or_else(|| BackendError::Invalid(format!("the last decode step had no row {row}")))?;
    if last.host.is_none() {
        last.host = Some(match &last.at {
            LogitsAt::Run(t) => to_host(t)?,
            LogitsAt::Bucket(i) => to_host(bucket(*i).ok_or_else(|| {
                BackendError::Invalid("CUDA graphs are off: no bucket logits".into())
            })?)?,
        });
    }
    let host = last.host.as_deref().expect("copied above");
    let vocab = last.vocab;
    host.get(r * vocab..(r + 1) * vocab)
        .map(<[f32]>::to_vec)
        .ok_or_else(|| BackendError::Invalid(format!("no logits row {r}")))
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

/// The fixed output buffers of a CUDA-graph bucket of `rows` (a replay writes where the
/// capture did) and their host copies: `logits`, and `next_token`, the candidates and
/// `logsumexp` when the graph has them.
pub(in crate::runtime::ortmodel) struct StepOutputs {
    pub logits: Tensor<f32>,
    host_logits: Tensor<f32>,
    next: Option<(Tensor<i64>, Tensor<i64>)>,
    top: Option<Candidates>,
}

/// A bucket's `top_logits`/`top_ids` (and `logsumexp`) buffers and their host copies.
struct Candidates {
    values: (Tensor<f32>, Tensor<f32>),
    ids: (Tensor<i64>, Tensor<i64>),
    lse: Option<(Tensor<f32>, Tensor<f32>)>,
}

impl StepOutputs {
    /// Buffers for `rows` rows of `vocab` logits in `alloc`'s memory, host copies beside.
    pub fn new(
        alloc: &Allocator,
        rows: usize,
        vocab: usize,
        extras: Extras,
        part: &str,
    ) -> Result<StepOutputs, BackendError> {
        let rt = |e: ort::Error| BackendError::runtime(part, e);
        let host = Allocator::default();
        let r = rows as i64;
        let pair_f = |shape: Vec<i64>| -> Result<(Tensor<f32>, Tensor<f32>), BackendError> {
            Ok((
                Tensor::new(alloc, shape.clone()).map_err(rt)?,
                Tensor::new(&host, shape).map_err(rt)?,
            ))
        };
        let pair_i = |shape: Vec<i64>| -> Result<(Tensor<i64>, Tensor<i64>), BackendError> {
            Ok((
                Tensor::new(alloc, shape.clone()).map_err(rt)?,
                Tensor::new(&host, shape).map_err(rt)?,
            ))
        };
        let (logits, host_logits) = pair_f(vec![r, 1, vocab as i64])?;
        let k = tensor::SAMPLING_CANDIDATES.min(vocab) as i64;
        Ok(StepOutputs {
            logits,
            host_logits,
            next: extras.next_token.then(|| pair_i(vec![r, 1])).transpose()?,
            top: match extras.top {
                true => Some(Candidates {
                    values: pair_f(vec![r, 1, k])?,
                    ids: pair_i(vec![r, 1, k])?,
                    lse: extras.lse.then(|| pair_f(vec![r, 1])).transpose()?,
                }),
                false => None,
            },
        })
    }

    /// Binds the device buffers (in `mem`) as the outputs of `b`.
    pub fn bind(
        &mut self,
        b: &mut IoBinding,
        mem: &MemoryInfo<'static>,
        part: &str,
    ) -> Result<(), BackendError> {
        let rt = |e: ort::Error| BackendError::runtime(part, e);
        b.bind_output(tensor::LOGITS, view(&mut self.logits, mem, part)?)
            .map_err(rt)?;
        if let Some((dev, _)) = self.next.as_mut() {
            b.bind_output(tensor::NEXT_TOKEN, view(dev, mem, part)?)
                .map_err(rt)?;
        }
        if let Some(top) = self.top.as_mut() {
            b.bind_output(tensor::TOP_LOGITS, view(&mut top.values.0, mem, part)?)
                .map_err(rt)?;
            b.bind_output(tensor::TOP_IDS, view(&mut top.ids.0, mem, part)?)
                .map_err(rt)?;
            if let Some((dev, _)) = top.lse.as_mut() {
                b.bind_output(tensor::LOGSUMEXP, view(dev, mem, part)?)
                    .map_err(rt)?;
            }
        }
        Ok(())
    }

    /// Copies what `want` needs of the last replay to the host and hands each row its part.
    pub fn read(
        &mut self,
        want: &[(usize, RowNeed)],
        part: &str,
    ) -> Result<Vec<StepLogits>, BackendError> {
        let rt = |e: ort::Error| BackendError::runtime(part, e);
        let fetch = Fetch::plan(want, self.next.is_some(), self.top.is_some());
        if fetch.full {
            self.logits.copy_into(&mut self.host_logits).map_err(rt)?;
        }
        let next: Vec<i64> = match self.next.as_mut() {
            Some((dev, host)) if fetch.argmax => {
                dev.copy_into(&mut *host).map_err(rt)?;
                host.extract_tensor().1.to_vec()
            }
            _ => Vec::new(),
        };
        if let Some(top) = self.top.as_mut().filter(|_| fetch.top) {
            top.values.0.copy_into(&mut top.values.1).map_err(rt)?;
            top.ids.0.copy_into(&mut top.ids.1).map_err(rt)?;
            if let Some((dev, host)) = top.lse.as_mut() {
                dev.copy_into(host).map_err(rt)?;
            }
        }
        let top = self.top.as_ref().filter(|_| fetch.top).map(|c| {
            let (shape, values) = c.values.1.extract_tensor();
            TopOut {
                values,
                ids: c.ids.1.extract_tensor().1,
                k: shape[2] as usize,
                lse: c
                    .lse
                    .as_ref()
                    .map_or(&[][..], |(_, h)| h.extract_tensor().1),
            }
        });
        let (shape, data) = self.host_logits.extract_tensor();
        let vocab = shape[2] as usize;
        Ok(rows_out(
            want,
            fetch.full.then_some((data, vocab)),
            &next,
            top,
            vocab,
        ))
    }
}

/// A view of `t`'s memory (in `mem`) to bind as an output: a replay writes into `t` itself.
fn view<T: ort::value::PrimitiveTensorElementType + std::fmt::Debug>(
    t: &mut Tensor<T>,
    mem: &MemoryInfo<'static>,
    part: &str,
) -> Result<ort::value::TensorRefMut<'static, T>, BackendError> {
    // SAFETY: `t` lives in its bucket as long as the binding this view is bound to.
    unsafe {
        ort::value::TensorRefMut::<T>::from_raw(
            mem.clone(),
            t.data_ptr_mut().cast(),
            t.shape().to_vec().into(),
        )
    }
    .map_err(|e| BackendError::runtime(part, e))
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
