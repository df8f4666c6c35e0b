//! The `decoder_gqa` path: a KV cache the model owns, allocated once per load and updated in
//! place, one slot per sequence.
//!
//! Every `past_key_values.*` input of the GQA decoder (see `ocrctl_exporters::decoder_gqa`)
//! is one buffer `[slots, kv_heads, max_seq, head_dim]` in the decoder provider's memory (GPU
//! memory on CUDA). A sequence owns a slot from its prefill until its cache is dropped; its
//! positions `0..len` live in rows `0..len` of the slot. A run binds, for slots
//! `first..first + rows`, a view of every buffer as both the past input and the present
//! output, so GroupQueryAttention writes the new keys and values in place: nothing is
//! concatenated, copied or repacked when sequences join or leave, and only token ids go in
//! and logits come out.
//!
//! - Prefill (and any run of S > 1 tokens) is a B = 1 run on the sequence's own slot.
//! - A prefill stage (`super::stage`) runs that prefill with a second decoder session on
//!   another thread (its own CUDA stream) while this session's decode steps go on, into a
//!   slot [`GqaCache::reserve`] set aside: the slot's recorded length is the prompt's from
//!   the start, so the dummy row of the concurrent steps (below) stays out of the rows the
//!   prefill writes. The steps may read those rows mid-write; that row's results are
//!   discarded. The engine adopts the sequence after the stage's run has returned its
//!   logits to the host, so its writes are complete before a step reads them.
//! - A decode step runs slots `0..=highest` at once; slots that are not in the step (free
//!   ones, or sequences the caller left out) get a dummy token written at their next free
//!   row, which their own next run overwrites before anything reads it. Free slots are handed
//!   out lowest first, so the active slots stay packed at the front.
//!
//! The cache's element type is the graph's (`past_key_values.*` inputs): the activation type,
//! or an 8-bit type of an export made with `--kv-cache fp8|int8`
//! (`ocrctl_exporters::kv_cache`), which then holds twice the positions per byte.
//!
//! Submodules: `decoder` ([`GqaDecoder`]: the path's load, `forward` and decode steps),
//! `graphs` (CUDA graphs of the decode steps), `outputs` (what a run brings to the host),
//! `view` (slots bound in place, of any element type).
//!
//! ort's `IoBinding::bind_input` copies a tensor made over borrowed memory before binding it
//! (a safety net for host arrays); for these views that copy would be the whole cache, so the
//! inputs are bound with ONNX Runtime's C `BindInput` directly ([`bind_input_in_place`],
//! [`view::RawView`]).

mod decoder;
pub(super) mod graphs;
pub(super) mod outputs;
pub(super) mod view;

pub(super) use decoder::{GqaDecoder, GqaLoad};

use crate::runtime::backend::{BackendError, RowNeed, StepLogits};
use ocrctl_exporters::contract::{graph, tensor, Kv};
use ocrctl_exporters::graph::DType;
use ort::memory::{AllocationDevice, Allocator, MemoryInfo};
use ort::session::{IoBinding, Session};
use ort::value::{
    DynTensor, PrimitiveTensorElementType, Tensor, TensorElementType, TensorRefMut, ValueType,
};
use ort::AsPointer;
use outputs::LastLogits;
use std::sync::{Arc, Mutex};

const PART: &str = graph::DECODER_GQA;

/// Which slots are taken; shared with the caches so that dropping one frees its slot.
type Taken = Arc<Mutex<Vec<bool>>>;

/// A sequence's hold on a cache slot; the slot is free again when this is dropped.
pub struct Slot {
    pub(super) index: usize,
    taken: Taken,
    /// A host cache's buffers and slot size: the slot's pages go back to the system on drop.
    host: Option<(Arc<KvBuffers>, usize)>,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").field("index", &self.index).finish()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some((buffers, slot_bytes)) = &self.host {
            buffers.discard(self.index, *slot_bytes);
        }
        let mut t = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        t[self.index] = false;
    }
}

/// The KV buffers, shared by the model's [`GqaCache`] and a prefill stage's copy of it
/// ([`GqaCache::for_stage`]): the memory lives until both are gone, so a stage thread still
/// running when the model is dropped never writes into freed memory.
struct KvBuffers {
    /// Kept for ownership only; runs address the memory through `bases`.
    owner: KvMemory,
    /// Each buffer's first byte (device or host address).
    bases: Vec<usize>,
}

/// Who owns the cache's memory: ONNX Runtime's allocator (device memory), or, in host memory,
/// zeroed pages the kernel maps on first write ([`HostBuffer`]).
enum KvMemory {
    Ort(#[allow(dead_code)] Vec<DynTensor>),
    Host(#[allow(dead_code)] Vec<HostBuffer>),
}

/// A host buffer from `calloc`, whose pages are untouched until written: ort zero-fills a
/// host tensor it allocates, so a CPU cache of the cpu profile's 4 sequences × 6 144
/// positions took its full 5.6 GB of RSS at load, idle or reading one receipt; here a
/// sequence takes what its positions use.
struct HostBuffer {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

impl HostBuffer {
    /// `bytes` of zeroes (16-byte aligned: above `malloc`'s alignment Rust's `alloc_zeroed`
    /// writes the zeroes itself, touching every page).
    fn zeroed(bytes: usize) -> Option<HostBuffer> {
        let layout = std::alloc::Layout::from_size_align(bytes.max(1), 16).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = std::ptr::NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })?;
        Some(HostBuffer { ptr, layout })
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// SAFETY: the tensors are only freed when the last holder drops them; the addresses are
// plain numbers, and every write through them happens inside an ONNX Runtime run on a slot
// that one sequence owns (see the module documentation on prefill stages).
unsafe impl Send for KvBuffers {}
unsafe impl Sync for KvBuffers {}

impl KvBuffers {
    /// `count` buffers of `shape` (`[slots, kv_heads, max_seq, head_dim]` of `ty`, `gib` in
    /// all): host memory from `calloc` ([`HostBuffer`]), device memory from `alloc`.
    fn allocate(
        alloc: &Allocator,
        ty: TensorElementType,
        shape: [i64; 4],
        count: usize,
        gib: f64,
    ) -> Result<KvBuffers, BackendError> {
        let [slots, _, max_seq, _] = shape;
        let failed = |e: String| {
            BackendError::runtime(
                PART,
                format!(
                    "allocating the KV cache ({slots} sequences x {max_seq} positions, \
                     {gib:.2} GiB in all; fewer sequences (the batch size) or a shorter \
                     max_sequence_length need less): {e}"
                ),
            )
        };
        if alloc.memory_info().allocation_device() == AllocationDevice::CPU {
            let elems: usize = shape.iter().map(|d| *d as usize).product();
            let bytes = ty.byte_size(elems).unwrap_or(elems * 4);
            let host = (0..count)
                .map(|_| HostBuffer::zeroed(bytes).ok_or_else(|| failed("out of memory".into())))
                .collect::<Result<Vec<_>, _>>()?;
            let bases = host.iter().map(|b| b.ptr.as_ptr() as usize).collect();
            return Ok(KvBuffers {
                owner: KvMemory::Host(host),
                bases,
            });
        }
        let mut tensors = Vec::with_capacity(count);
        for _ in 0..count {
            tensors.push(DynTensor::new(alloc, ty, shape).map_err(|e| failed(e.to_string()))?);
        }
        let bases = tensors
            .iter_mut()
            .map(|t| t.data_ptr_mut() as usize)
            .collect();
        Ok(KvBuffers {
            owner: KvMemory::Ort(tensors),
            bases,
        })
    }
    /// Gives slot `slot`'s whole pages of every host buffer back to the system (they read as
    /// zeroes when next touched): without it a CPU server kept the high-water mark of its
    /// pages' positions, ~0.5 GB per finished A4 page of the full-size model. Device
    /// memory stays as it is.
    fn discard(&self, slot: usize, slot_bytes: usize) {
        const PAGE: usize = 4096;
        for j in 0..self.bases.len() {
            let start = (self.at(j, slot, slot_bytes) as usize).next_multiple_of(PAGE);
            let end = (self.at(j, slot + 1, slot_bytes) as usize) / PAGE * PAGE;
            if end > start {
                // SAFETY: whole pages inside a buffer this struct owns, of a slot whose
                // sequence is gone; MADV_DONTNEED only drops their contents.
                unsafe {
                    libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED)
                };
            }
        }
    }

    /// Buffer `j`'s address at slot `first`.
    fn at(&self, j: usize, first: usize, slot_bytes: usize) -> *mut std::ffi::c_void {
        (self.bases[j] + first * slot_bytes) as *mut std::ffi::c_void
    }

    fn len(&self) -> usize {
        self.bases.len()
    }
}

/// The slot pool and its buffers.
pub(super) struct GqaCache {
    buffers: Arc<KvBuffers>,
    /// Bytes of one slot in one buffer.
    slot_bytes: usize,
    /// The activation type (of the embeddings a run binds).
    elem: DType,
    /// The cache's element type (the graph's `past_key_values.*`).
    cache_ty: TensorElementType,
    kv_heads: usize,
    head_dim: usize,
    pub slots: usize,
    pub max_seq: usize,
    kv_mem: MemoryInfo<'static>,
    taken: Taken,
    /// Current length of each slot's sequence (0 when free).
    lens: Vec<usize>,
    past_names: Vec<std::ffi::CString>,
    present_names: Vec<String>,
    /// Whether the graph has the `next_token` (argmax) output.
    has_next_token: bool,
    /// Whether the graph has the sampling candidates (`top_logits`, `top_ids`).
    has_top: bool,
    /// Whether the graph has the rows' log-normalisers (`logsumexp`; exports before
    /// 2026-12-03 lack it, and their log-probabilities come from the full logits).
    has_lse: bool,
    /// The last decode step's logits, for a sampling row that needs them after all.
    last: Option<LastLogits>,
    /// With CUDA graphs enabled on the session: the options of runs that are not captured.
    no_graph: Option<ort::session::RunOptions>,
    /// CUDA graphs of the decode steps, one per batch bucket ([`graphs`]).
    graphs: Option<graphs::DecodeGraphs>,
}

impl GqaCache {
    /// Allocates the `2 × layers` buffers of `slots × max_seq` positions with `decoder`'s
    /// allocator for `kv_mem`, of the element type of `decoder`'s cache inputs (`elem`, the
    /// activation type, for graphs that do not say).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        decoder: &Session,
        kv_mem: MemoryInfo<'static>,
        elem: DType,
        kv_heads: usize,
        head_dim: usize,
        slots: usize,
        max_seq: usize,
        layers: usize,
    ) -> Result<GqaCache, BackendError> {
        let rt = |e: ort::Error| BackendError::runtime(PART, e);
        let alloc = Allocator::new(decoder, kv_mem.clone()).map_err(rt)?;
        let ty = cache_element_type(decoder, elem);
        let shape = [
            slots as i64,
            kv_heads as i64,
            max_seq as i64,
            head_dim as i64,
        ];
        let elem_bytes = ty.byte_size(1).unwrap_or(4);
        let gib = (2 * layers * slots * kv_heads * max_seq * head_dim * elem_bytes) as f64
            / (1u64 << 30) as f64;
        let count = 2 * layers;
        let buffers = Arc::new(KvBuffers::allocate(&alloc, ty, shape, count, gib)?);
        Ok(GqaCache {
            buffers,
            slot_bytes: kv_heads * max_seq * head_dim * elem_bytes,
            elem,
            cache_ty: ty,
            kv_heads,
            head_dim,
            slots,
            max_seq,
            kv_mem,
            taken: Arc::new(Mutex::new(vec![false; slots])),
            lens: vec![0; slots],
            past_names: cstrings(tensor::cache_names(layers, false)),
            present_names: tensor::cache_names(layers, true),
            has_next_token: decoder
                .outputs()
                .iter()
                .any(|o| o.name() == tensor::NEXT_TOKEN),
            has_top: decoder
                .outputs()
                .iter()
                .any(|o| o.name() == tensor::TOP_LOGITS),
            has_lse: decoder
                .outputs()
                .iter()
                .any(|o| o.name() == tensor::LOGSUMEXP),
            last: None,
            no_graph: None,
            graphs: None,
        })
    }

    /// The cache's element type.
    pub fn element_type(&self) -> TensorElementType {
        self.cache_ty
    }

    /// Bytes the buffers take.
    pub fn bytes(&self) -> usize {
        self.buffers.len() * self.slots * self.slot_bytes
    }

    /// Takes the lowest free slot (its length is 0).
    pub fn take(&mut self) -> Result<Slot, BackendError> {
        let mut t = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        let index = t.iter().position(|x| !x).ok_or_else(|| {
            BackendError::Invalid(format!(
                "all {} KV cache slots are in use (the cache was sized for --batch-size {})",
                self.slots, self.slots
            ))
        })?;
        t[index] = true;
        self.lens[index] = 0;
        let host = matches!(self.buffers.owner, KvMemory::Host(_))
            .then(|| (self.buffers.clone(), self.slot_bytes));
        Ok(Slot {
            index,
            taken: self.taken.clone(),
            host,
        })
    }

    /// Takes the lowest free slot for a prompt of `positions` that a prefill stage will write
    /// while decode steps go on ([`GqaCache::for_stage`]). Its recorded length is set to
    /// `positions` at once, so the dummy row those steps write into a slot outside them lands
    /// at row `positions` (which the sequence's first decode step overwrites) and never in
    /// rows `0..positions` that the prefill writes. `None` when no slot is free or the prompt
    /// would fill the whole slot (the dummy row would then fall inside it).
    pub fn reserve(&mut self, positions: usize) -> Option<Slot> {
        if positions == 0 || positions >= self.max_seq {
            return None;
        }
        let slot = self.take().ok()?;
        self.lens[slot.index] = positions;
        Some(slot)
    }

    /// A copy of this cache for a prefill stage's decoder session: the same buffers and
    /// slot pool (the memory lives until both copies are gone), no CUDA graphs. It prefills
    /// reserved slots ([`GqaCache::reserve`]) only: the model's copy keeps the lengths that
    /// its decode steps read.
    pub fn for_stage(&self) -> GqaCache {
        GqaCache {
            buffers: self.buffers.clone(),
            slot_bytes: self.slot_bytes,
            elem: self.elem,
            cache_ty: self.cache_ty,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            slots: self.slots,
            max_seq: self.max_seq,
            kv_mem: self.kv_mem.clone(),
            taken: self.taken.clone(),
            lens: vec![0; self.slots],
            past_names: self.past_names.clone(),
            present_names: self.present_names.clone(),
            has_next_token: self.has_next_token,
            has_top: self.has_top,
            has_lse: self.has_lse,
            last: None,
            no_graph: None,
            graphs: None,
        }
    }

    /// Slots not taken.
    pub fn free(&self) -> usize {
        self.taken
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|t| !**t)
            .count()
    }

    /// Whether slot `i` is taken.
    fn is_taken(&self, i: usize) -> bool {
        self.taken.lock().unwrap_or_else(|e| e.into_inner())[i]
    }

    /// Checks that `len` positions fit a slot.
    pub fn check_fits(&self, len: usize) -> Result<(), BackendError> {
        if len > self.max_seq {
            return Err(BackendError::Invalid(format!(
                "the sequence needs {len} positions; the KV cache holds {} per sequence \
                 (the profile's max_sequence_length)",
                self.max_seq
            )));
        }
        Ok(())
    }

    /// Runs the decoder on `embeds [rows, S, hidden]` for slots `first..first + rows`, whose
    /// lengths before the run are `lens` (S new positions each). Returns, for the rows in
    /// `want` (index into the run's rows, what it needs), in that order, their logits, argmax
    /// or sampling candidates, and the nanoseconds of the run and of reading the results.
    /// When no row needs its full logits they stay in device memory (kept until the next run,
    /// [`GqaCache::last_step_row`]).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &mut self,
        decoder: &mut Session,
        host: &MemoryInfo<'static>,
        first: usize,
        embeds: DynTensor,
        lens: &[usize],
        s: usize,
        want: &[(usize, RowNeed)],
    ) -> Result<(Vec<StepLogits>, u64, u64), BackendError> {
        let rt = |e: ort::Error| BackendError::runtime(PART, e);
        let rows = lens.len();
        assert!(
            first + rows <= self.slots,
            "slots {first}+{rows} of {}",
            self.slots
        );
        for l in lens {
            self.check_fits(l + s)?;
        }
        // GQA's contract: seqlens_k is each row's total length minus one, the total is the
        // largest total length (read on the host).
        let seqlens: Vec<i32> = lens.iter().map(|l| (l + s - 1) as i32).collect();
        let total = lens.iter().map(|l| l + s).max().unwrap_or(s) as i32;
        let seqlens = Tensor::from_array(([rows], seqlens)).map_err(rt)?;
        let total = Tensor::from_array((Vec::<i64>::new(), vec![total])).map_err(rt)?;
        let mut b = decoder.create_binding().map_err(rt)?;
        b.bind_input(tensor::INPUTS_EMBEDS, &embeds).map_err(rt)?;
        b.bind_input(tensor::SEQLENS_K, &seqlens).map_err(rt)?;
        b.bind_input(tensor::TOTAL_SEQUENCE_LENGTH, &total)
            .map_err(rt)?;
        // SAFETY: slots first..first+rows lie inside the buffers (asserted above), which
        // outlive the binding and the run; the views are dropped before this returns.
        let views = unsafe { self.bind_slots(&mut b, first, rows) }?;
        let extras = outputs::Extras {
            next_token: self.has_next_token,
            top: self.has_top,
            lse: self.has_lse,
        };
        let (host, dev) = (host, &self.kv_mem);
        let opts = self.no_graph.as_ref();
        let (rows, last, run_ns, read_ns) =
            outputs::run_and_read(decoder, &mut b, extras, host, dev, want, opts, PART)?;
        // Kept (where the run left them) for a sampling row that needs them after all.
        self.last = Some(last);
        drop(b);
        drop(views);
        Ok((rows, run_ns, read_ns))
    }

    /// Binds views of slots `first..first + rows` of every KV buffer to `b` as both the past
    /// input and the present output (GroupQueryAttention then writes in place), and returns
    /// the input views, which must live as long as the binding.
    ///
    /// # Safety
    /// `first + rows <= self.slots`, and the binding must not outlive the buffers.
    pub(super) unsafe fn bind_slots(
        &self,
        b: &mut IoBinding,
        first: usize,
        rows: usize,
    ) -> Result<Vec<view::RawView>, BackendError> {
        let shape = [
            rows as i64,
            self.kv_heads as i64,
            self.max_seq as i64,
            self.head_dim as i64,
        ];
        let mut views = Vec::with_capacity(self.buffers.len());
        for j in 0..self.buffers.len() {
            let ptr = self.buffers.at(j, first, self.slot_bytes);
            // SAFETY: the caller's contract; input and output alias on purpose.
            let v = || unsafe { view::RawView::new(&self.kv_mem, ptr, &shape, self.cache_ty) };
            let input = v()?;
            input.bind_input(b, &self.past_names[j])?;
            v()?.bind_output(b, &self.present_names[j])?;
            views.push(input);
        }
        Ok(views)
    }

    /// Lengths of slots `0..rows` for a decode step: `step` holds (slot, length) of the
    /// sequences in the step; every other slot keeps its recorded length (0 when free).
    pub fn step_lens(&self, step: &[(usize, usize)]) -> Vec<usize> {
        let rows = step.iter().map(|(s, _)| s + 1).max().unwrap_or(0);
        (0..rows)
            .map(|i| match step.iter().find(|(s, _)| *s == i) {
                Some((_, l)) => *l,
                None if self.is_taken(i) => self.lens[i],
                None => 0,
            })
            .collect()
    }

    /// Row `row` of the last decode step's logits (see [`LastLogits`]).
    pub fn last_step_row(&mut self, row: usize) -> Result<Vec<f32>, BackendError> {
        let graphs = self.graphs.as_ref();
        outputs::last_row(self.last.as_mut(), row, |i| {
            graphs.map(|g| g.bucket_logits(i))
        })
    }

    /// Records that slot `i` now holds `len` positions.
    pub fn set_len(&mut self, i: usize, len: usize) {
        self.lens[i] = len;
    }
}

/// Binds `value` as input `name` of `b` as is (no copy; see the module documentation).
pub(super) fn bind_input_in_place<T: PrimitiveTensorElementType + std::fmt::Debug>(
    b: &mut IoBinding,
    name: &std::ffi::CStr,
    value: &TensorRefMut<'_, T>,
) -> Result<(), BackendError> {
    // SAFETY: both pointers come from live ort objects; ONNX Runtime copies the OrtValue
    // handle (which refers to the caller's memory) into the binding.
    let status = unsafe { (ort::api().BindInput)(b.ptr_mut(), name.as_ptr(), value.ptr()) };
    view::check(status, &format!("binding {}", name.to_string_lossy()))
}

/// The element type of `decoder`'s KV cache inputs (`past_key_values.0.key`): the activation
/// type `elem`, or an 8-bit type for an `--kv-cache fp8|int8` export. Graphs that do not say
/// get `elem`'s.
pub(super) fn cache_element_type(decoder: &Session, elem: DType) -> TensorElementType {
    let past0 = tensor::past(0, Kv::Key);
    decoder
        .inputs()
        .iter()
        .find(|i| i.name() == past0)
        .and_then(|i| match i.dtype() {
            ValueType::Tensor { ty, .. } => Some(*ty),
            _ => None,
        })
        .unwrap_or(super::tensors::element_type(elem))
}

fn cstrings(names: Vec<String>) -> Vec<std::ffi::CString> {
    names
        .into_iter()
        .map(|n| std::ffi::CString::new(n).expect("no NUL"))
        .collect()
}

#[cfg(test)]
mod host_tests {
    use super::*;

    const MIB: usize = 1 << 20;

    /// Pages of `len` bytes at `ptr` that are resident (`mincore`).
    fn resident(ptr: usize, len: usize) -> usize {
        let mut v = vec![0u8; len.div_ceil(4096)];
        // SAFETY: a page-aligned range inside one live allocation; `v` has a byte per page.
        let r = unsafe { libc::mincore(ptr as *mut libc::c_void, len, v.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore failed");
        v.iter().filter(|b| *b & 1 == 1).count()
    }

    #[test]
    fn a_host_cache_takes_pages_when_written_and_gives_a_freed_slot_back() {
        // Two slots of 24 MiB: above glibc's largest mmap threshold (32 MiB), so calloc maps
        // it fresh whatever other tests freed before.
        let buf = HostBuffer::zeroed(48 * MIB + 4096).unwrap();
        let base = (buf.ptr.as_ptr() as usize).next_multiple_of(4096);
        let b = KvBuffers {
            owner: KvMemory::Host(Vec::new()),
            bases: vec![base],
        };
        assert_eq!(
            resident(base, 48 * MIB),
            0,
            "untouched pages are not resident"
        );
        // SAFETY: inside `buf`, which outlives the writes.
        unsafe { std::ptr::write_bytes(base as *mut u8, 1, 48 * MIB) };
        assert_eq!(resident(base, 48 * MIB), 48 * 256);
        b.discard(0, 24 * MIB);
        assert_eq!(resident(base, 24 * MIB), 0, "slot 0 went back");
        assert_eq!(
            resident(base + 24 * MIB, 24 * MIB),
            24 * 256,
            "slot 1 stays"
        );
        // SAFETY: as above; a discarded page reads as zeroes.
        assert_eq!(unsafe { *(base as *const u8) }, 0);
        drop(buf);
    }
}
