//! The block pool of the paged decoder: `2 × layers` buffers
//! `[blocks, block_size, kv_heads, head_dim]` allocated once, a free list, and [`Blocks`], a
//! sequence's hold on some of them (given back when dropped).

use super::PART;
use crate::runtime::backend::BackendError;
use crate::runtime::ortmodel::gqa::view::RawView;
use crate::runtime::ortmodel::LoadOptions;
use ocrctl_exporters::config::TextConfig;
use ocrctl_exporters::contract::tensor;
use ort::memory::{Allocator, MemoryInfo};
use ort::session::{IoBinding, Session};
use ort::value::{DynTensor, TensorElementType};
use std::sync::{Arc, Mutex};

/// Free block ids, shared with the [`Blocks`] that give theirs back.
type FreeList = Arc<Mutex<Vec<u32>>>;

/// A sequence's blocks, in position order; free again when this is dropped.
#[derive(Debug)]
pub struct Blocks {
    ids: Vec<u32>,
    free: FreeList,
}

impl Blocks {
    /// The block ids, position order.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}

impl Drop for Blocks {
    fn drop(&mut self) {
        let mut f = self.free.lock().unwrap_or_else(|e| e.into_inner());
        // Its first block last: the next `take` pops it first.
        f.extend(self.ids.drain(..).rev());
    }
}

/// The pool's buffers and free list.
pub(super) struct BlockPool {
    /// Kept for ownership; runs address the memory through views of the whole buffers.
    tensors: Vec<DynTensor>,
    /// `[blocks, block_size, kv_heads, head_dim]`.
    shape: [i64; 4],
    pub block_size: usize,
    /// Positions one sequence may hold (the profile's `max_sequence_length`).
    pub max_seq: usize,
    pub cache_ty: TensorElementType,
    pub kv_mem: MemoryInfo<'static>,
    free: FreeList,
    past_names: Vec<std::ffi::CString>,
    present_names: Vec<String>,
}

impl BlockPool {
    /// Allocates the pool `opts` asks for with `decoder`'s allocator for `kv_mem`, of the
    /// element type of `decoder`'s cache inputs.
    pub fn new(
        decoder: &Session,
        kv_mem: MemoryInfo<'static>,
        opts: &LoadOptions,
        t: &TextConfig,
    ) -> Result<BlockPool, BackendError> {
        let rt = |e: ort::Error| BackendError::runtime(PART, e);
        let ty = crate::runtime::ortmodel::gqa::cache_element_type(decoder, opts.precision.dtype());
        let max_pos = t.max_position_embeddings.max(1);
        let max_seq = match opts.max_sequence_length {
            0 => max_pos.min(8192),
            n => n.min(max_pos),
        };
        let block_size = match opts.kv_block_size {
            0 => super::DEFAULT_BLOCK_SIZE,
            n => n,
        };
        let position_bytes =
            2 * t.num_layers * t.num_kv_heads * t.head_dim * ty.byte_size(1).unwrap_or(4);
        let bytes = opts
            .kv_cache_bytes
            .unwrap_or(opts.kv_slots.max(1) * max_seq * position_bytes);
        let blocks = pool_blocks(
            bytes,
            block_size * position_bytes,
            max_seq.div_ceil(block_size),
        );
        let shape = [
            blocks as i64,
            block_size as i64,
            t.num_kv_heads as i64,
            t.head_dim as i64,
        ];
        let alloc = Allocator::new(decoder, kv_mem.clone()).map_err(rt)?;
        let gib = (blocks * block_size * position_bytes) as f64 / (1u64 << 30) as f64;
        let mut tensors = Vec::with_capacity(2 * t.num_layers);
        for _ in 0..2 * t.num_layers {
            tensors.push(DynTensor::new(&alloc, ty, shape).map_err(|e| {
                BackendError::runtime(
                    PART,
                    format!(
                        "allocating the KV block pool ({blocks} blocks of {block_size} positions, \
                         {gib:.2} GiB in all; a smaller kv_cache_gb needs less): {e}"
                    ),
                )
            })?);
        }
        // Highest ids last: `pop` hands out the lowest first. Block 0 stays out (see the
        // module documentation of `super`).
        let free = (1..blocks as u32).rev().collect();
        let names = |present| tensor::cache_names(t.num_layers, present);
        Ok(BlockPool {
            tensors,
            shape,
            block_size,
            max_seq,
            cache_ty: ty,
            kv_mem,
            free: Arc::new(Mutex::new(free)),
            past_names: names(false)
                .into_iter()
                .map(|n| std::ffi::CString::new(n).expect("no NUL"))
                .collect(),
            present_names: names(true),
        })
    }

    /// A sequence with no blocks yet.
    pub fn empty(&self) -> Blocks {
        Blocks {
            ids: Vec::new(),
            free: self.free.clone(),
        }
    }

    /// Blocks a sequence may be given (all but block 0).
    pub fn total(&self) -> usize {
        self.shape[0] as usize - 1
    }

    /// Blocks free now.
    pub fn free(&self) -> usize {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Bytes the buffers take.
    pub fn bytes(&self) -> usize {
        let per = self.cache_ty.byte_size(1).unwrap_or(4);
        self.tensors.len() * self.shape.iter().product::<i64>() as usize * per
    }

    /// Gives `b` the blocks `positions` need, or fails naming what is short: a sequence
    /// longer than `max_seq`, or a pool without enough free blocks (the engine preempts
    /// before it comes to that).
    pub fn grow(&self, b: &mut Blocks, positions: usize) -> Result<(), BackendError> {
        if positions > self.max_seq {
            return Err(BackendError::Invalid(format!(
                "the sequence needs {positions} positions; the KV cache holds {} per sequence \
                 (the profile's max_sequence_length)",
                self.max_seq
            )));
        }
        take(b, positions.div_ceil(self.block_size), self.total())
    }

    /// Binds every buffer whole to `b` as both the past input and the present output, and
    /// returns the input views, which must live as long as the binding.
    ///
    /// # Safety
    /// The binding must not outlive the pool.
    pub unsafe fn bind(&self, b: &mut IoBinding) -> Result<Vec<RawView>, BackendError> {
        let mut views = Vec::with_capacity(self.tensors.len());
        for (j, t) in self.tensors.iter().enumerate() {
            let ptr = t.data_ptr() as *mut std::ffi::c_void;
            // SAFETY: the whole buffer, alive as long as the pool; input and output alias on
            // purpose (PagedAttention writes the new positions in place).
            let v = || unsafe { RawView::new(&self.kv_mem, ptr, &self.shape, self.cache_ty) };
            let input = v()?;
            input.bind_input(b, &self.past_names[j])?;
            v()?.bind_output(b, &self.present_names[j])?;
            views.push(input);
        }
        Ok(views)
    }
}

/// Gives `b` blocks from its free list until it holds `blocks` (lowest ids first), or fails
/// naming the shortfall in a pool of `total`.
fn take(b: &mut Blocks, blocks: usize, total: usize) -> Result<(), BackendError> {
    let need = blocks.saturating_sub(b.ids.len());
    if need == 0 {
        return Ok(());
    }
    let mut f = b.free.lock().unwrap_or_else(|e| e.into_inner());
    if f.len() < need {
        return Err(BackendError::Invalid(format!(
            "no free KV block: {need} more needed, {} of {total} free",
            f.len()
        )));
    }
    let at = f.len() - need;
    b.ids.extend(f.drain(at..).rev());
    Ok(())
}

/// Blocks in a pool of `bytes` at `block_bytes` each, one more for block 0, and at least one
/// sequence's worth (`per_sequence`) so that any page allowed can run.
fn pool_blocks(bytes: usize, block_bytes: usize, per_sequence: usize) -> usize {
    (bytes / block_bytes.max(1)).max(per_sequence) + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool_of(blocks: u32) -> FreeList {
        Arc::new(Mutex::new((1..blocks).rev().collect()))
    }

    #[test]
    fn sequences_take_blocks_as_they_grow_and_give_them_back_when_dropped() {
        let free = pool_of(5);
        let empty = || Blocks {
            ids: Vec::new(),
            free: free.clone(),
        };
        let (mut a, mut b) = (empty(), empty());
        // Lowest ids first, block 0 never.
        take(&mut a, 2, 4).unwrap();
        assert_eq!(a.ids(), [1, 2]);
        take(&mut a, 2, 4).unwrap();
        assert_eq!(a.ids(), [1, 2], "holds enough already");
        take(&mut b, 1, 4).unwrap();
        assert_eq!(b.ids(), [3]);
        let e = take(&mut b, 3, 4).unwrap_err().to_string();
        assert_eq!(e, "no free KV block: 2 more needed, 1 of 4 free");
        assert_eq!(b.ids(), [3], "nothing taken by a failed growth");
        drop(a);
        take(&mut b, 3, 4).unwrap();
        assert_eq!(b.ids(), [3, 1, 2]);
        drop(b);
        let mut left = free.lock().unwrap().clone();
        left.sort();
        assert_eq!(left, [1, 2, 3, 4]);
    }

    #[test]
    fn a_pool_holds_at_least_one_longest_sequence_and_the_scratch_block() {
        assert_eq!(pool_blocks(10 << 20, 1 << 20, 4), 11);
        assert_eq!(pool_blocks(1 << 20, 1 << 20, 4), 5);
    }
}
