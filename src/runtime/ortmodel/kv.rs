//! The decoder's KV cache: per-sequence caches, the padded batch cache, and host repacking.
//!
//! Values are `present.*` outputs of the last step and live wherever the decoder left them:
//! in the execution provider's memory on the IoBinding path (GPU memory on CUDA/TensorRT), in
//! host memory otherwise. A batch step reuses the padded batch cache as is while the batch
//! is unchanged (same sequences, same order), so on a GPU the cache never leaves it between
//! steps. When sequences join or leave the cache is repacked: on the bound path by the repack
//! graph in the decoder's memory (`super::repack`); on the host path, or if that graph is
//! unavailable, by [`pack`] on the host: each source tensor is copied to host memory once (a
//! no-op for host values), rows are cut and left-padded, and the result is bound as the next
//! step's past, which ONNX Runtime uploads. Joins and leaves happen once per request while
//! steps happen once per token, so even the host transfer is rare.

use super::tensors::on_host;
use crate::runtime::backend::BackendError;
use ort::value::{DynTensor, PrimitiveTensorElementType, Tensor};
use std::sync::atomic::{AtomicU64, Ordering};

/// The KV cache of one sequence: its length, and where its values are, by decoder path
/// (`Held`).
pub struct OrtCache {
    pub(super) len: usize,
    pub(super) held: Held,
}

/// Where a sequence's KV values are: one variant per decoder path.
pub(super) enum Held {
    /// The merged decoder's: `present.*` values from the last step.
    Merged(MergedKv),
    /// The GQA decoder's: the slot of the model's KV cache this sequence owns (freed on drop).
    Slot(super::gqa::Slot),
    /// The paged decoder's: the blocks of its pool this sequence owns (freed on drop).
    Blocks(super::paged::Blocks),
}

/// A sequence's values on the merged path. After a batch step its rows live in the model's
/// padded batch cache; they stay valid until a `decode_batch` call leaves the sequence out
/// (the batch cache then holds only that call's sequences).
pub(super) struct MergedKv {
    /// Unique per sequence step chain, to recognise the rows of the shared batch cache.
    pub id: u64,
    /// This sequence's own `present.*` values (`[1, kv_heads, len, head_dim]`), or `None` when
    /// its rows live in the model's padded batch cache.
    pub kv: Option<Vec<DynTensor>>,
}

impl OrtCache {
    /// A new sequence's cache on the merged path.
    pub(super) fn own(kv: Vec<DynTensor>, len: usize) -> OrtCache {
        let id = NEXT_CACHE_ID.fetch_add(1, Ordering::Relaxed);
        OrtCache::merged(MergedKv { id, kv: Some(kv) }, len)
    }

    /// A merged-path cache of `len` positions.
    pub(super) fn merged(m: MergedKv, len: usize) -> OrtCache {
        OrtCache {
            len,
            held: Held::Merged(m),
        }
    }

    /// A new sequence's cache in a slot of the model's GQA cache.
    pub(super) fn in_slot(slot: super::gqa::Slot) -> OrtCache {
        OrtCache {
            len: 0,
            held: Held::Slot(slot),
        }
    }

    /// A new sequence's cache in blocks of the model's paged pool (none taken yet).
    pub(super) fn in_blocks(blocks: super::paged::Blocks) -> OrtCache {
        OrtCache {
            len: 0,
            held: Held::Blocks(blocks),
        }
    }

    /// The paged path's blocks (`None` on the other paths).
    pub(super) fn blocks(&self) -> Option<&super::paged::Blocks> {
        match &self.held {
            Held::Blocks(b) => Some(b),
            _ => None,
        }
    }

    /// The paged path's blocks, to grow (`None` on the other paths).
    pub(super) fn blocks_mut(&mut self) -> Option<&mut super::paged::Blocks> {
        match &mut self.held {
            Held::Blocks(b) => Some(b),
            _ => None,
        }
    }

    /// The merged path's values and the length, or an error naming the path that made
    /// this cache.
    pub(super) fn into_merged(self) -> Result<(MergedKv, usize), BackendError> {
        match self.held {
            Held::Merged(m) => Ok((m, self.len)),
            Held::Slot(_) | Held::Blocks(_) => Err(BackendError::Invalid(
                "a KV cache made by another decoder path reached the merged decoder".into(),
            )),
        }
    }

    /// The GQA slot this cache owns (`None` on the merged path).
    pub(super) fn slot(&self) -> Option<usize> {
        match &self.held {
            Held::Slot(s) => Some(s.index),
            Held::Merged(_) | Held::Blocks(_) => None,
        }
    }
}

static NEXT_CACHE_ID: AtomicU64 = AtomicU64::new(1);

/// The padded KV cache of the last batch step: `[B, kv_heads, p, head_dim]` per layer and
/// kind, row `i` holding sequence `ids[i]` left-padded by `p - lens[i]`.
pub(super) struct BatchKv {
    pub ids: Vec<u64>,
    pub lens: Vec<usize>,
    pub p: usize,
    pub kv: Vec<DynTensor>,
}

impl BatchKv {
    /// Row of sequence `id`, if it is in this batch.
    pub fn row(&self, id: u64) -> Option<usize> {
        self.ids.iter().position(|x| *x == id)
    }
}

/// Where one row of a new padded cache comes from.
pub(super) enum RowSrc {
    /// A sequence's own values (`[1, kv_heads, len, head_dim]`).
    Own(Vec<DynTensor>),
    /// Row `r` of the previous batch cache.
    Batch(usize),
}

/// Shape of the KV tensors.
#[derive(Debug, Clone, Copy)]
pub(super) struct KvDims {
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Number of tensors (2 per layer: key, value).
    pub tensors: usize,
}

/// Builds a padded cache `[rows, kv_heads, p, head_dim]` per tensor on the host: row `i`
/// holds the last `rows[i].1` positions of its source, right-aligned (left padding is zero
/// and masked out). `old` is the previous batch cache that [`RowSrc::Batch`] rows refer to.
pub(super) fn pack<T>(
    rows: &[(RowSrc, usize)],
    old: Option<&BatchKv>,
    p: usize,
    d: KvDims,
    part: &str,
) -> Result<Vec<DynTensor>, BackendError>
where
    T: PrimitiveTensorElementType + Copy + Default + std::fmt::Debug + 'static,
{
    let b = rows.len();
    let (kvh, hd) = (d.kv_heads, d.head_dim);
    let rt = |e: ort::Error| BackendError::runtime(part, e);
    let mut out = Vec::with_capacity(d.tensors);
    for j in 0..d.tensors {
        // Each source tensor crosses to the host at most once per repack.
        let old_host = match old {
            Some(o) if rows.iter().any(|r| matches!(r.0, RowSrc::Batch(_))) => {
                Some((on_host(&o.kv[j], part)?, o.p))
            }
            _ => None,
        };
        let mut buf = vec![T::default(); b * kvh * p * hd];
        for (i, (src, l)) in rows.iter().enumerate() {
            let l = *l;
            if l > p {
                return Err(BackendError::Invalid(format!(
                    "KV repack: row of {l} positions does not fit {p}"
                )));
            }
            let own;
            let (data, r, q): (&[T], usize, usize) = match src {
                RowSrc::Own(kv) => {
                    own = on_host(&kv[j], part)?;
                    (own.try_extract_tensor::<T>().map_err(rt)?.1, 0, l)
                }
                RowSrc::Batch(r) => {
                    let (v, q) = old_host.as_ref().expect("batch rows have their source");
                    (v.try_extract_tensor::<T>().map_err(rt)?.1, *r, *q)
                }
            };
            for h in 0..kvh {
                let src = ((r * kvh + h) * q + (q - l)) * hd;
                let dst = ((i * kvh + h) * p + (p - l)) * hd;
                buf[dst..dst + l * hd].copy_from_slice(&data[src..src + l * hd]);
            }
        }
        let shape = vec![b as i64, kvh as i64, p as i64, hd as i64];
        out.push(Tensor::from_array((shape, buf)).map_err(rt)?.upcast());
    }
    Ok(out)
}
