//! The `decoder_paged` path: a pool of fixed-size KV blocks handed to sequences as they grow,
//! so pages in flight follow memory, not `max_sequence_length` (design and GPU checks:
//! `docs/design/paged-kv-cache.md`).
//!
//! Every `past_key_values.*` input of the paged decoder (`ocrctl_exporters::decoder_paged`)
//! is one buffer `[blocks, block_size, kv_heads, head_dim]` allocated once per load. A
//! sequence's [`Blocks`] list the blocks its positions live in, in order; a run binds the
//! whole pool as past input and present output (ONNX Runtime's PagedAttention writes the new
//! keys and values into the blocks in place) and each sequence's blocks as its row of
//! `block_table`. Nothing is copied when sequences join or leave.
//!
//! - A prefill (and any run of S > 1 tokens) is one sequence's S tokens.
//! - A decode step packs one token per sequence: `inputs_embeds [1, B, hidden]`,
//!   `cumulative_sequence_length` 0..=B, `past_seqlens` the lengths, `block_table` rows
//!   padded with block 0, which the kernel never reads past a row's length.
//! - Block 0 is never handed out: rows of a CUDA-graph bucket beyond the step write their
//!   dummy position there (`graphs`).
//!
//! A run takes the blocks its new positions need before it runs and fails, naming the pool,
//! when none is free: the engine's admission (`generation::engine::admission`) asks
//! [`KvCapacity::Blocks`] first and preempts pages so that this does not happen. The kernel is
//! CUDA-only (float16 activations): this path runs on the CUDA provider, checked by
//! `scripts/gpu/gpu_paged_runtime.sh`.

mod graphs;
mod pool;

pub(super) use pool::Blocks;

use super::gqa::outputs::{self, Extras, LastLogits};
use super::path::Decoder;
use super::{tensors, Common, LoadError, LoadOptions, OrtCache};
use crate::runtime::backend::{BackendError, KvCapacity, RowNeed, StepLogits};
use crate::runtime::providers::Provider;
use ocrctl_exporters::config::TextConfig;
use ocrctl_exporters::contract::{graph, tensor};
use ocrctl_exporters::export::DecoderVariant;
use ort::session::Session;
use ort::value::{DynTensor, Tensor};
use pool::BlockPool;
use std::path::Path;

const PART: &str = graph::DECODER_PAGED;

/// Why the paged decoder is refused off CUDA.
pub const CUDA_ONLY: &str = "the paged decoder (decoder_model_paged) runs on the CUDA provider \
    only: ONNX Runtime's PagedAttention has no other kernel (--providers cuda, or --decoder gqa)";

/// Positions per block unless [`LoadOptions::kv_block_size`] says otherwise: FlashAttention
/// takes paged prompts in blocks of a multiple of 128 at head size 128, and blocks of 128
/// cost 1–3 % more than 256 per step (docs/benchmarks/2026-12-05-h200 §1) while wasting
/// half as much of a page's last block.
pub const DEFAULT_BLOCK_SIZE: usize = 128;

/// The paged decoder's session and its block pool.
pub(super) struct PagedDecoder {
    decoder: Session,
    pool: BlockPool,
    extras: Extras,
    /// The last decode step's logits, for a sampling row that needs them after all.
    last: Option<LastLogits>,
    /// With CUDA graphs enabled on the session: the options of runs that are not captured.
    no_graph: Option<ort::session::RunOptions>,
    graphs: Option<graphs::DecodeGraphs>,
}

/// What loading the paged path needs beside its decoder session.
pub(super) struct PagedLoad<'a> {
    /// The decoder's graph file (errors name it).
    pub path: &'a Path,
    pub opts: &'a LoadOptions,
    pub text: &'a TextConfig,
    /// Where the pool lives (the decoder provider's memory).
    pub kv: ort::memory::MemoryInfo<'static>,
    /// Whether the session was created with CUDA graphs enabled.
    pub graphs_on: bool,
}

/// A run's inputs besides the embeddings and the pool, on the host.
struct Packed {
    cumulative: Vec<i32>,
    past: Vec<i32>,
    /// `[rows, width]` row-major.
    table: Vec<i32>,
    width: usize,
    /// Largest new tokens of a row, largest total positions.
    bounds: [i32; 2],
}

impl PagedDecoder {
    /// The path over `decoder` (on `provider`): allocates the pool from `opts`
    /// ([`LoadOptions::kv_cache_bytes`], else what `kv_slots` sequences of
    /// `max_sequence_length` would take) and, with `graphs_on` on CUDA, captures the decode
    /// steps' graphs (a failed capture leaves them uncaptured, with a warning).
    pub fn load(
        l: PagedLoad<'_>,
        (decoder, provider): (Session, Provider),
        embed: &mut Session,
        gpu: &mut super::capture::Shared,
    ) -> Result<PagedDecoder, LoadError> {
        let PagedLoad {
            path,
            opts,
            text,
            kv,
            graphs_on,
        } = l;
        if provider != Provider::Cuda {
            return Err(LoadError::Session {
                path: path.to_path_buf(),
                message: format!("{CUDA_ONLY} (the decoder got {})", provider.name()),
            });
        }
        let pool = BlockPool::new(&decoder, kv, opts, text).map_err(|e| LoadError::Session {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let extras = Extras::of(&decoder);
        let mut d = PagedDecoder {
            decoder,
            pool,
            extras,
            last: None,
            no_graph: None,
            graphs: None,
        };
        if graphs_on {
            let t = std::time::Instant::now();
            let rows = opts.kv_slots.max(1);
            // The capture takes the lock alone (see `capture`).
            match gpu.released(|| d.enable_graphs(embed, text, rows)) {
                Ok(()) => tracing::info!(
                    "CUDA graphs for paged decode steps of 1 to {rows} sequences captured in \
                     {:.1} s",
                    t.elapsed().as_secs_f64()
                ),
                Err(e) => {
                    tracing::warn!("CUDA graphs unavailable ({e}); decode steps run without them")
                }
            }
        }
        tracing::info!(
            "paged decoder, KV pool of {} blocks x {} positions ({:.2} GiB, {:?}), at most {} \
             positions a sequence",
            d.pool.total(),
            d.pool.block_size,
            d.pool.bytes() as f64 / (1u64 << 30) as f64,
            d.pool.cache_ty,
            d.pool.max_seq
        );
        Ok(d)
    }

    /// Bytes the block pool takes.
    pub fn pool_bytes(&self) -> usize {
        self.pool.bytes()
    }

    /// Runs the decoder on `embeds` (`[1, T, hidden]`, the rows' new tokens packed) with the
    /// other inputs `p` gives; each row of `want` gets what it needs.
    fn run(
        &mut self,
        c: &mut Common,
        embeds: DynTensor,
        p: Packed,
        want: &[(usize, RowNeed)],
    ) -> Result<(Vec<StepLogits>, u64, u64), BackendError> {
        let rt = |e: ort::Error| BackendError::runtime(PART, e);
        let rows = p.past.len();
        let mut b = self.decoder.create_binding().map_err(rt)?;
        b.bind_input(tensor::INPUTS_EMBEDS, &embeds).map_err(rt)?;
        let cu = Tensor::from_array(([rows + 1], p.cumulative)).map_err(rt)?;
        let past = Tensor::from_array(([rows], p.past)).map_err(rt)?;
        let table = Tensor::from_array(([rows, p.width], p.table)).map_err(rt)?;
        let bounds = Tensor::from_array(([2usize], p.bounds.to_vec())).map_err(rt)?;
        b.bind_input(tensor::CUMULATIVE_SEQUENCE_LENGTH, &cu)
            .map_err(rt)?;
        b.bind_input(tensor::PAST_SEQLENS, &past).map_err(rt)?;
        b.bind_input(tensor::BLOCK_TABLE, &table).map_err(rt)?;
        b.bind_input(tensor::ATTENTION_METADATA, &bounds)
            .map_err(rt)?;
        // SAFETY: the pool's buffers outlive the binding and the run; the views are dropped
        // before this returns.
        let views = unsafe { self.pool.bind(&mut b) }?;
        let (host, dev) = (&c.placement.host, &self.pool.kv_mem);
        let opts = self.no_graph.as_ref();
        let (rows_out, last, run_ns, read_ns) = outputs::run_and_read(
            &mut self.decoder,
            &mut b,
            self.extras,
            host,
            dev,
            want,
            opts,
            PART,
        )?;
        self.last = Some(last);
        drop(b);
        drop(views);
        Ok((rows_out, run_ns, read_ns))
    }
}

/// `block_table [rows, width]` row-major: row `r` holds `tables[r]`, padded with block 0
/// (rows past `tables` are all block 0).
fn block_table(tables: &[&[u32]], rows: usize, width: usize) -> Vec<i32> {
    let mut table = vec![0i32; rows * width];
    for (r, t) in tables.iter().enumerate() {
        for (j, id) in t.iter().enumerate() {
            table[r * width + j] = *id as i32;
        }
    }
    table
}

/// The inputs of a run of `news[i]` new tokens after `lens[i]` cached positions in the
/// blocks `tables[i]`.
fn pack(lens: &[usize], news: &[usize], tables: &[&[u32]]) -> Packed {
    let width = tables.iter().map(|t| t.len()).max().unwrap_or(1).max(1);
    let table = block_table(tables, lens.len(), width);
    let mut cumulative = vec![0i32];
    for n in news {
        cumulative.push(cumulative.last().expect("starts at 0") + *n as i32);
    }
    let total = lens.iter().zip(news).map(|(l, n)| l + n).max().unwrap_or(0);
    Packed {
        cumulative,
        past: lens.iter().map(|l| *l as i32).collect(),
        table,
        width,
        bounds: [*news.iter().max().unwrap_or(&0) as i32, total as i32],
    }
}

impl Decoder for PagedDecoder {
    fn variant(&self) -> DecoderVariant {
        DecoderVariant::Paged
    }

    fn kv_capacity(&self) -> KvCapacity {
        KvCapacity::Blocks {
            free: self.pool.free(),
            total: self.pool.total(),
            block_size: self.pool.block_size,
            positions: self.pool.max_seq,
        }
    }

    /// `embeds [S, hidden]` after the sequence's cached positions (new blocks for a prefill),
    /// as one run of one sequence.
    fn forward(
        &mut self,
        c: &mut Common,
        embeds: ndarray::Array2<f32>,
        cache: Option<OrtCache>,
    ) -> Result<(Vec<f32>, OrtCache), BackendError> {
        let (s, d) = (embeds.nrows(), embeds.ncols());
        let mut cache = cache.unwrap_or_else(|| OrtCache::in_blocks(self.pool.empty()));
        let len = cache.len;
        let blocks = blocks_of(&mut cache)?;
        self.pool.grow(blocks, len + s)?;
        let p = pack(&[len], &[s], &[blocks.ids()]);
        let data = tensors::into_row_major(embeds);
        let e = tensors::float_tensor(c.act, vec![1, s as i64, d as i64], data, PART)?;
        let (mut logits, _, _) = self.run(c, e, p, &[(0, RowNeed::Full)])?;
        cache.len += s;
        c.stats.bound_runs += 1;
        match logits.pop() {
            Some(StepLogits::Full(l)) => Ok((l, cache)),
            _ => Err(BackendError::runtime(PART, "no logits for the run's row")),
        }
    }

    /// One run of one new token per sequence, packed; each row gets what `need` says (full
    /// logits where `need` is shorter than the step).
    fn decode_batch_select(
        &mut self,
        c: &mut Common,
        tokens: &[u32],
        mut caches: Vec<OrtCache>,
        need: &[RowNeed],
    ) -> Result<(Vec<StepLogits>, Vec<OrtCache>), BackendError> {
        let lens: Vec<usize> = caches.iter().map(|c| c.len).collect();
        for cache in caches.iter_mut() {
            let len = cache.len;
            let blocks = blocks_of(cache)?;
            self.pool.grow(blocks, len + 1)?;
        }
        let want: Vec<(usize, RowNeed)> = (0..caches.len())
            .map(|i| (i, need.get(i).copied().unwrap_or(RowNeed::Full)))
            .collect();
        let tables: Vec<&[u32]> = caches
            .iter()
            .map(|c| c.blocks().map(Blocks::ids).ok_or_else(other_path))
            .collect::<Result<_, _>>()?;
        let (out, run_ns, read_ns) = if self.graphs.is_some() && tokens.len() <= self.graph_rows() {
            self.graph_step(&mut c.embed, tokens, &lens, &tables, &want)?
        } else {
            let t = std::time::Instant::now();
            let embeds = c.embed_ids(vec![1, tokens.len() as i64], tokens)?;
            c.stats.step_embed_ns += t.elapsed().as_nanos() as u64;
            let p = pack(&lens, &vec![1; lens.len()], &tables);
            self.run(c, embeds, p, &want)?
        };
        for cache in caches.iter_mut() {
            cache.len += 1;
        }
        c.stats.bound_runs += 1;
        c.stats.step_run_ns += run_ns;
        c.stats.step_logits_ns += read_ns;
        Ok((out, caches))
    }

    fn step_logits(&mut self, c: &mut Common, row: usize) -> Result<Vec<f32>, BackendError> {
        c.stats.step_logits_fallbacks += 1;
        let graphs = self.graphs.as_ref();
        outputs::last_row(self.last.as_mut(), row, |i| {
            graphs.map(|g| g.bucket_logits(i))
        })
    }
}

fn blocks_of(c: &mut OrtCache) -> Result<&mut Blocks, BackendError> {
    c.blocks_mut().ok_or_else(other_path)
}

fn other_path() -> BackendError {
    BackendError::Invalid("a KV cache of another decoder path reached the paged decoder".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_packs_one_token_per_row_and_pads_tables_with_block_zero() {
        let p = pack(&[5, 130, 0], &[1, 1, 1], &[&[3], &[7, 9], &[]]);
        assert_eq!(p.cumulative, [0, 1, 2, 3]);
        assert_eq!(p.past, [5, 130, 0]);
        assert_eq!(p.width, 2);
        assert_eq!(p.table, [3, 0, 7, 9, 0, 0]);
        assert_eq!(p.bounds, [1, 131]);
        let prompt = pack(&[0], &[300], &[&[4, 2, 8]]);
        assert_eq!(prompt.cumulative, [0, 300]);
        assert_eq!(prompt.bounds, [300, 300]);
    }
}
