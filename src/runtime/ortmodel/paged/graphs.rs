//! CUDA graphs for the paged decoder's decode steps, as the GQA path has them
//! (`gqa::graphs`, which says why and how ONNX Runtime captures): one graph per batch bucket,
//! captured at load. A bucket of `rows` keeps, for the life of the model, one `IoBinding` of
//! the whole pool as past input and present output and fixed device tensors for
//! `inputs_embeds [1, rows, hidden]`, `cumulative_sequence_length` (0..=rows, written once),
//! `past_seqlens [rows]` and `block_table [rows, width]`, `width` the blocks of the longest
//! sequence allowed; and `attention_metadata` = [1, max_sequence_length] in host memory.
//! PagedAttention reads those bounds on the host to choose its kernel, so they are frozen at
//! capture; they hold for every later decode step (one new token each, at most
//! `max_sequence_length` positions), and the GPU check replayed a graph captured so after
//! the sequences grew (docs/benchmarks/2026-12-05-h200 §1).
//!
//! A step writes the tokens' embeddings, the lengths and the block tables into the bucket's
//! tensors, replays, and reads what the rows need. Rows of the bucket beyond the step have
//! length 0 and a table of block 0: they write block 0's first position, which no sequence
//! owns.

use super::{PagedDecoder, PART};
use crate::runtime::backend::{BackendError, RowNeed, StepLogits};
use crate::runtime::ortmodel::gqa::bind_input_in_place;
use crate::runtime::ortmodel::gqa::graphs::{bucket_sizes, embed_into};
use crate::runtime::ortmodel::gqa::outputs::{LastLogits, LogitsAt, StepOutputs};
use half::f16;
use ocrctl_exporters::config::TextConfig;
use ocrctl_exporters::contract::tensor;
use ort::memory::{Allocator, MemoryInfo};
use ort::session::{IoBinding, NoSelectedOutputs, RunOptions, Session};
use ort::value::{DynTensor, Tensor, TensorElementType, TensorRefMut};

/// Runs of each bucket at load (see `gqa::graphs`: two regular runs, the capture, a replay).
const CAPTURE_RUNS: usize = 4;

/// The decode graphs of one model.
pub(super) struct DecodeGraphs {
    buckets: Vec<Bucket>,
    hidden: usize,
    /// Columns of every bucket's block table.
    width: usize,
}

/// One batch size's graph and the buffers it was captured with.
struct Bucket {
    rows: usize,
    binding: IoBinding,
    opts: RunOptions<NoSelectedOutputs>,
    embeds: DynTensor,
    past: Tensor<i32>,
    table: Tensor<i32>,
    out: StepOutputs,
    /// Views and host inputs bound by pointer: they must outlive the binding.
    _keep: Vec<Box<dyn std::any::Any + Send>>,
}

impl DecodeGraphs {
    /// The fixed logits buffer of bucket `i`.
    pub fn bucket_logits(&self, i: usize) -> &Tensor<f32> {
        &self.buckets[i].out.logits
    }

    /// The most rows a bucket holds.
    pub fn rows(&self) -> usize {
        self.buckets.last().map_or(0, |b| b.rows)
    }
}

impl PagedDecoder {
    /// The most rows a captured decode step holds (0 without graphs).
    pub(super) fn graph_rows(&self) -> usize {
        self.graphs.as_ref().map_or(0, DecodeGraphs::rows)
    }

    /// Sets up and captures one decode graph per bucket of up to `max_rows` rows. The decoder
    /// session must have been created with CUDA graphs enabled.
    pub(super) fn enable_graphs(
        &mut self,
        embed: &mut Session,
        text: &TextConfig,
        max_rows: usize,
    ) -> Result<(), BackendError> {
        let rt = |e: ort::Error| BackendError::runtime(PART, e);
        // Every run without a bucket's graph says so from now on, even if capturing fails.
        let mut no_graph = RunOptions::new().map_err(rt)?;
        no_graph.set("gpu_graph_id", "-1").map_err(rt)?;
        self.no_graph = Some(no_graph);
        let mem = self.pool.kv_mem.clone();
        let alloc = Allocator::new(&self.decoder, mem.clone()).map_err(rt)?;
        let (hidden, vocab) = (text.hidden_size, text.vocab_size);
        let width = self.pool.max_seq.div_ceil(self.pool.block_size);
        let mut buckets = Vec::new();
        for (i, rows) in bucket_sizes(max_rows).into_iter().enumerate() {
            let mut opts = RunOptions::new().map_err(rt)?;
            opts.set("gpu_graph_id", (i + 1).to_string()).map_err(rt)?;
            let shape = [1, rows as i64, hidden as i64];
            let mut b = Bucket {
                rows,
                binding: self.decoder.create_binding().map_err(rt)?,
                opts,
                embeds: DynTensor::new(&alloc, TensorElementType::Float16, shape).map_err(rt)?,
                past: Tensor::new(&alloc, [rows]).map_err(rt)?,
                table: Tensor::new(&alloc, [rows, width]).map_err(rt)?,
                out: StepOutputs::new(&alloc, rows, vocab, self.extras, PART)?,
                _keep: Vec::new(),
            };
            self.bind_bucket(&mut b, &alloc, &mem, hidden)?;
            buckets.push(b);
        }
        self.graphs = Some(DecodeGraphs {
            buckets,
            hidden,
            width,
        });
        // Capture every bucket now, alone on the GPU: no sequence exists, and the rows write
        // block 0 only.
        let _alone = crate::runtime::ortmodel::capture::exclusive();
        let sizes: Vec<usize> = self
            .graphs
            .as_ref()
            .map_or(Vec::new(), |g| g.buckets.iter().map(|b| b.rows).collect());
        for rows in sizes {
            for _ in 0..CAPTURE_RUNS {
                let step = self.graph_step(embed, &vec![0; rows], &vec![0; rows], &[], &[]);
                if let Err(e) = step {
                    self.graphs = None;
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Binds bucket `b`'s inputs and outputs (device tensors from `alloc`, in `mem`).
    fn bind_bucket(
        &self,
        b: &mut Bucket,
        alloc: &Allocator,
        mem: &MemoryInfo<'static>,
        hidden: usize,
    ) -> Result<(), BackendError> {
        let rt = |e: ort::Error| BackendError::runtime(PART, e);
        // SAFETY: the pool lives as long as the model, and so as long as this binding.
        let views = unsafe { self.pool.bind(&mut b.binding) }?;
        b._keep.extend(
            views
                .into_iter()
                .map(|v| Box::new(v) as Box<dyn std::any::Any + Send>),
        );
        let embeds = unsafe {
            TensorRefMut::<f16>::from_raw(
                mem.clone(),
                b.embeds.data_ptr_mut().cast(),
                vec![1, b.rows as i64, hidden as i64].into(),
            )
        }
        .map_err(rt)?;
        bind_in_place(&mut b.binding, tensor::INPUTS_EMBEDS, &embeds)?;
        b._keep.push(Box::new(embeds));
        let mut cu = Tensor::<i32>::new(alloc, [b.rows + 1]).map_err(rt)?;
        let steps: Vec<i32> = (0..=b.rows as i32).collect();
        Tensor::from_array(([b.rows + 1], steps))
            .map_err(rt)?
            .copy_into(&mut cu)
            .map_err(rt)?;
        for (name, t) in [
            (tensor::CUMULATIVE_SEQUENCE_LENGTH, &mut cu),
            (tensor::PAST_SEQLENS, &mut b.past),
            (tensor::BLOCK_TABLE, &mut b.table),
        ] {
            // SAFETY: each tensor lives in the bucket (or in `_keep`) as long as the binding.
            let view = unsafe {
                TensorRefMut::<i32>::from_raw(
                    mem.clone(),
                    t.data_ptr_mut().cast(),
                    t.shape().to_vec().into(),
                )
            }
            .map_err(rt)?;
            bind_in_place(&mut b.binding, name, &view)?;
            b._keep.push(Box::new(view));
        }
        b._keep.push(Box::new(cu));
        let bounds =
            Tensor::from_array(([2usize], vec![1, self.pool.max_seq as i32])).map_err(rt)?;
        b.binding
            .bind_input(tensor::ATTENTION_METADATA, &bounds)
            .map_err(rt)?;
        b.out.bind(&mut b.binding, mem, PART)
    }

    /// A decode step (one new token per row) through the smallest bucket holding `ids.len()`
    /// rows: `ids[r]` follows row `r`'s `lens[r]` positions in the blocks `tables[r]` (rows
    /// without a table, as at capture, get block 0). Returns the rows' outputs and the
    /// nanoseconds of the replay and of reading its results.
    pub(super) fn graph_step(
        &mut self,
        embed: &mut Session,
        ids: &[u32],
        lens: &[usize],
        tables: &[&[u32]],
        want: &[(usize, RowNeed)],
    ) -> Result<(Vec<StepLogits>, u64, u64), BackendError> {
        let rt = |e: ort::Error| BackendError::runtime(PART, e);
        let mem = self.pool.kv_mem.clone();
        let g = self.graphs.as_mut().expect("graphs are enabled");
        let (hidden, width) = (g.hidden, g.width);
        let index = g
            .buckets
            .iter()
            .position(|b| b.rows >= ids.len())
            .ok_or_else(|| BackendError::runtime(PART, "more rows than the largest graph"))?;
        let b = &mut g.buckets[index];
        let rows = b.rows;
        let mut all_ids: Vec<i64> = ids.iter().map(|t| *t as i64).collect();
        all_ids.resize(rows, 0);
        embed_into::<f16>(embed, all_ids, &mut b.embeds, &mem, hidden)?;
        let mut past: Vec<i32> = lens.iter().map(|l| *l as i32).collect();
        past.resize(rows, 0);
        let table = super::block_table(tables, rows, width);
        Tensor::from_array(([rows], past))
            .map_err(rt)?
            .copy_into(&mut b.past)
            .map_err(rt)?;
        Tensor::from_array(([rows, width], table))
            .map_err(rt)?
            .copy_into(&mut b.table)
            .map_err(rt)?;
        let t = std::time::Instant::now();
        drop(
            self.decoder
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

/// Binds `view` as input `name` as is ([`bind_input_in_place`]).
fn bind_in_place(
    b: &mut IoBinding,
    name: &str,
    view: &TensorRefMut<'_, impl ort::value::PrimitiveTensorElementType + std::fmt::Debug>,
) -> Result<(), BackendError> {
    let name = std::ffi::CString::new(name).expect("no NUL");
    bind_input_in_place(b, &name, view)
}
