//! CUDA graphs for the GQA decoder's decode steps (`--cuda-graphs on`, or a profile's
//! `cuda.cuda_graphs`).
//!
//! A batch-1 decode step launches about a thousand small kernels; on an H200 the launches,
//! not the GPU's work, set its ~5 ms. ONNX Runtime's CUDA provider can capture a run as a
//! CUDA graph and replay it with one launch (`enable_cuda_graph`, one graph per run-option
//! `gpu_graph_id`). A replay ignores the run's bindings: every input and output must stay at
//! the address it had when the graph was captured. So for each batch bucket (1, 2, 4, … up to
//! the slot count) this module keeps, for the life of the model:
//!
//! - one `IoBinding` of the decoder: the KV buffers' views of slots `0..rows` as past input and
//!   present output (the same memory as every other run), and fixed device tensors for
//!   `inputs_embeds [rows, 1, hidden]`, `seqlens_k [rows]`, `logits [rows, 1, vocab]` and
//!   `next_token [rows, 1]`;
//! - `total_sequence_length` fixed at the cache's `max_seq`. GroupQueryAttention reads it on
//!   the host, so its value is frozen at capture; with the past and present sharing one
//!   buffer it only sets how the FlashDecoding kernel splits the work, each row stopping at its
//!   own `seqlens_k` (onnxruntime `group_query_attention.cc`, `flash_api.cc`), and
//!   onnxruntime-genai feeds the same constant under CUDA graphs.
//!
//! A step writes the new token embeddings into the bucket's tensor (the embedding session's
//! output is bound to it) and copies `seqlens_k` in, replays the bucket's graph, and copies
//! `next_token` (and only when a row samples, the logits) back. Rows of the bucket that are
//! not in the step write a dummy position, as on the path without graphs.
//!
//! Every other run of the decoder session (prefills) passes `gpu_graph_id = -1`: with graphs
//! enabled, a run without an id would be captured as graph 0 on its third call. Buckets are
//! captured at load (ONNX Runtime runs a graph id twice, then captures the third run), before
//! any sequence exists, each run [`CAPTURE_RUNS`] times while no other thread of the process
//! touches the GPU (`super::super::capture`).

use super::outputs::{LastLogits, LogitsAt, StepOutputs};
use super::{bind_input_in_place, GqaCache, PART};
use crate::runtime::backend::{BackendError, RowNeed, StepLogits};
use half::f16;
use ocrctl_exporters::contract::tensor;
use ocrctl_exporters::graph::DType;
use ort::memory::Allocator;
use ort::session::{IoBinding, NoSelectedOutputs, RunOptions, Session};
use ort::value::{DynTensor, PrimitiveTensorElementType, Tensor, TensorRefMut};

/// Runs of each bucket at load: two regular runs, the capturing one, and one replay (ONNX
/// Runtime's CUDA provider captures a graph id once it has run `min_num_runs_before_
/// cuda_graph_capture_` = 2 times; the replay checks the captured graph runs).
const CAPTURE_RUNS: usize = 4;

/// The decode graphs of one model.
pub(in crate::runtime::ortmodel) struct DecodeGraphs {
    buckets: Vec<Bucket>,
    hidden: usize,
}

/// One batch size's graph and the buffers it was captured with.
struct Bucket {
    rows: usize,
    binding: IoBinding,
    opts: RunOptions<NoSelectedOutputs>,
    embeds: DynTensor,
    seqlens: Tensor<i32>,
    /// Logits, argmax and candidates, where the replay writes them.
    out: StepOutputs,
    /// The KV views bound as past inputs (bound by pointer: they must outlive the binding).
    _past: Vec<Box<dyn std::any::Any + Send>>,
}

impl DecodeGraphs {
    /// The fixed logits buffer of bucket `i`.
    pub fn bucket_logits(&self, i: usize) -> &Tensor<f32> {
        &self.buckets[i].out.logits
    }
}

/// Bucket sizes for `slots` sequences: powers of two below it, then `slots`.
pub fn bucket_sizes(slots: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut b = 1;
    while b < slots {
        v.push(b);
        b *= 2;
    }
    v.push(slots.max(1));
    v
}

impl GqaCache {
    /// Sets up and captures one decode graph per bucket (see the module documentation). The
    /// decoder session must have been created with CUDA graphs enabled.
    pub fn enable_graphs(
        &mut self,
        decoder: &mut Session,
        embed: &mut Session,
        hidden: usize,
        vocab: usize,
    ) -> Result<(), BackendError> {
        let rt = |e: ort::Error| BackendError::runtime(PART, e);
        // From now on every run without a bucket's graph says so, even if capturing fails
        // below (the decode steps then run uncaptured, correctly).
        let mut no_graph = RunOptions::new().map_err(rt)?;
        no_graph.set("gpu_graph_id", "-1").map_err(rt)?;
        self.no_graph = Some(no_graph);
        let alloc = Allocator::new(decoder, self.kv_mem.clone()).map_err(rt)?;
        let extras = super::outputs::Extras {
            next_token: self.has_next_token,
            top: self.has_top,
            lse: self.has_lse,
        };
        let act = crate::runtime::ortmodel::tensors::element_type(self.elem);
        let mut buckets = Vec::new();
        for (i, rows) in bucket_sizes(self.slots).into_iter().enumerate() {
            let mut opts = RunOptions::new().map_err(rt)?;
            opts.set("gpu_graph_id", (i + 1).to_string()).map_err(rt)?;
            let r = rows as i64;
            let mut b = Bucket {
                rows,
                binding: decoder.create_binding().map_err(rt)?,
                opts,
                embeds: DynTensor::new(&alloc, act, [r, 1, hidden as i64]).map_err(rt)?,
                seqlens: Tensor::new(&alloc, [rows]).map_err(rt)?,
                out: StepOutputs::new(&alloc, rows, vocab, extras, PART)?,
                _past: Vec::new(),
            };
            match self.elem {
                DType::F16 => self.bind_bucket::<f16>(&mut b, hidden)?,
                _ => self.bind_bucket::<f32>(&mut b, hidden)?,
            }
            buckets.push(b);
        }
        self.graphs = Some(DecodeGraphs { buckets, hidden });
        // Capture every bucket now: no sequence exists, so the dummy rows write nothing
        // anyone reads. ONNX Runtime counts the regular runs of each graph id and captures
        // the run after the second one; fewer runs here left the captures to the first
        // decode steps, racing the stages' threads (see `capture`). No other thread of the
        // process touches the GPU meanwhile.
        let _alone = crate::runtime::ortmodel::capture::exclusive();
        for i in 0..self.graphs.as_ref().map_or(0, |g| g.buckets.len()) {
            let rows = self.graphs.as_ref().expect("set above").buckets[i].rows;
            let t = std::time::Instant::now();
            for _ in 0..CAPTURE_RUNS {
                let step = self.graph_step(decoder, embed, &vec![0; rows], &vec![0; rows], &[]);
                if let Err(e) = step {
                    self.graphs = None;
                    return Err(e);
                }
            }
            tracing::debug!(
                "CUDA graph for {rows} sequence(s) captured in {:.0} ms",
                t.elapsed().as_secs_f64() * 1e3
            );
        }
        Ok(())
    }

    fn bind_bucket<T: PrimitiveTensorElementType + std::fmt::Debug + 'static>(
        &mut self,
        b: &mut Bucket,
        hidden: usize,
    ) -> Result<(), BackendError> {
        let rt = |e: ort::Error| BackendError::runtime(PART, e);
        // SAFETY: slots 0..rows lie inside the buffers (rows <= slots), which live as long as
        // the cache, and so as long as this binding.
        let views = unsafe { self.bind_slots(&mut b.binding, 0, b.rows) }?;
        b._past.extend(
            views
                .into_iter()
                .map(|v| Box::new(v) as Box<dyn std::any::Any + Send>),
        );
        let embeds = unsafe {
            TensorRefMut::<T>::from_raw(
                self.kv_mem.clone(),
                b.embeds.data_ptr_mut().cast(),
                vec![b.rows as i64, 1, hidden as i64].into(),
            )
        }
        .map_err(rt)?;
        let name = std::ffi::CString::new(tensor::INPUTS_EMBEDS).expect("no NUL");
        bind_input_in_place(&mut b.binding, &name, &embeds)?;
        b._past.push(Box::new(embeds));
        let seqlens = unsafe {
            TensorRefMut::<i32>::from_raw(
                self.kv_mem.clone(),
                b.seqlens.data_ptr_mut().cast(),
                vec![b.rows as i64].into(),
            )
        }
        .map_err(rt)?;
        let name = std::ffi::CString::new(tensor::SEQLENS_K).expect("no NUL");
        bind_input_in_place(&mut b.binding, &name, &seqlens)?;
        b._past.push(Box::new(seqlens));
        let total =
            Tensor::from_array((Vec::<i64>::new(), vec![self.max_seq as i32])).map_err(rt)?;
        b.binding
            .bind_input(tensor::TOTAL_SEQUENCE_LENGTH, &total)
            .map_err(rt)?;
        b.out.bind(&mut b.binding, &self.kv_mem, PART)?;
        Ok(())
    }

    /// Whether decode steps replay CUDA graphs.
    pub fn graphs_enabled(&self) -> bool {
        self.graphs.is_some()
    }

    /// A decode step (one new token per row) through the smallest bucket holding `lens.len()`
    /// rows: `ids[r]` follows row `r`'s `lens[r]` positions. Rows the bucket adds beyond
    /// `lens` write a dummy position. Returns what [`GqaCache::run`] returns.
    pub fn graph_step(
        &mut self,
        decoder: &mut Session,
        embed: &mut Session,
        ids: &[u32],
        lens: &[usize],
        want: &[(usize, RowNeed)],
    ) -> Result<(Vec<StepLogits>, u64, u64), BackendError> {
        match self.elem {
            DType::F16 => self.graph_step_typed::<f16>(decoder, embed, ids, lens, want),
            _ => self.graph_step_typed::<f32>(decoder, embed, ids, lens, want),
        }
    }

    fn graph_step_typed<T: PrimitiveTensorElementType + std::fmt::Debug + 'static>(
        &mut self,
        decoder: &mut Session,
        embed: &mut Session,
        ids: &[u32],
        lens: &[usize],
        want: &[(usize, RowNeed)],
    ) -> Result<(Vec<StepLogits>, u64, u64), BackendError> {
        let rt = |e: ort::Error| BackendError::runtime(PART, e);
        for l in lens {
            self.check_fits(l + 1)?;
        }
        let max_seq = self.max_seq;
        let extra: Vec<usize> = (lens.len()..self.slots)
            .map(|i| {
                if self.is_taken(i) {
                    self.lens[i].min(max_seq.saturating_sub(1))
                } else {
                    0
                }
            })
            .collect();
        let kv_mem = self.kv_mem.clone();
        let g = self.graphs.as_mut().expect("graphs are enabled");
        let hidden = g.hidden;
        let index = g
            .buckets
            .iter()
            .position(|b| b.rows >= lens.len())
            .ok_or_else(|| BackendError::runtime(PART, "more rows than KV cache slots"))?;
        let b = &mut g.buckets[index];
        let rows = b.rows;
        let mut all_lens = lens.to_vec();
        all_lens.extend_from_slice(&extra[..rows - lens.len()]);
        let mut all_ids: Vec<i64> = ids.iter().map(|t| *t as i64).collect();
        all_ids.resize(rows, 0);

        // The new tokens' embeddings into the bucket's tensor; then seqlens_k (each row's
        // length after the step, minus one).
        embed_into::<T>(embed, all_ids, &mut b.embeds, &kv_mem, hidden)?;
        let seqlens: Vec<i32> = all_lens.iter().map(|l| *l as i32).collect();
        let host_seqlens = Tensor::from_array(([rows], seqlens)).map_err(rt)?;
        host_seqlens.copy_into(&mut b.seqlens).map_err(rt)?;

        let t = std::time::Instant::now();
        drop(
            decoder
                .run_binding_with_options(&b.binding, &b.opts)
                .map_err(rt)?,
        );
        let run_ns = t.elapsed().as_nanos() as u64;

        let t = std::time::Instant::now();
        let out = b.out.read(want, PART)?;
        let vocab = b.out.logits.shape()[2] as usize;
        self.last = Some(LastLogits::new(LogitsAt::Bucket(index), want, vocab));
        Ok((out, run_ns, t.elapsed().as_nanos() as u64))
    }
}

/// Writes the embeddings of `ids` (one token per row) into `dst`, a bucket's
/// `rows × hidden` values of the activation type `T` in `mem`, with the embedding session.
pub(in crate::runtime::ortmodel) fn embed_into<T>(
    embed: &mut Session,
    ids: Vec<i64>,
    dst: &mut DynTensor,
    mem: &ort::memory::MemoryInfo<'static>,
    hidden: usize,
) -> Result<(), BackendError>
where
    T: PrimitiveTensorElementType + std::fmt::Debug + 'static,
{
    let rt = |e: ort::Error| BackendError::runtime(PART, e);
    let rows = ids.len();
    let ids_t = Tensor::from_array(([rows, 1], ids)).map_err(rt)?;
    let mut eb = embed.create_binding().map_err(rt)?;
    eb.bind_input(tensor::INPUT_IDS, &ids_t).map_err(rt)?;
    // SAFETY: `dst` holds `rows × hidden` values of `T` and outlives the run below.
    let view = unsafe {
        TensorRefMut::<T>::from_raw(
            mem.clone(),
            dst.data_ptr_mut().cast(),
            vec![rows as i64, 1, hidden as i64].into(),
        )
    }
    .map_err(rt)?;
    eb.bind_output(tensor::INPUTS_EMBEDS, view).map_err(rt)?;
    drop(embed.run_binding(&eb).map_err(rt)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_double_up_to_the_slot_count() {
        assert_eq!(bucket_sizes(1), [1]);
        assert_eq!(bucket_sizes(6), [1, 2, 4, 6]);
        assert_eq!(bucket_sizes(8), [1, 2, 4, 8]);
        assert_eq!(bucket_sizes(32), [1, 2, 4, 8, 16, 32]);
    }
}
