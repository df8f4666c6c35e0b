//! Who may start, and who gives way: admission against the backend's KV capacity, and
//! preemption by recompute when a paged cache runs dry.
//!
//! The engine asks one question of the backend, [`Backend::kv_capacity`]:
//! - **unbounded** (the merged decoder): a request starts when the batch has room;
//! - **slots** (the GQA decoder): it starts when a sequence is free, else waits for one;
//! - **blocks** (the paged decoder): it starts when its prompt's blocks are free beside those
//!   set aside for pages whose images are being encoded, with a small reserve for the running
//!   pages to grow into; each decode step first makes sure every page that enters a new block
//!   gets one, preempting the youngest running pages until they do. A preempted page gives its
//!   blocks back and waits at the head of the queue with what it generated; when blocks are
//!   free again its prompt and tokens are prefilled anew (vLLM's preemption by recompute,
//!   <https://docs.vllm.ai/en/latest/configuration/optimization.html#preemption>) and it goes
//!   on as if nothing happened: same sampler, same tokens. A page whose prompt and
//!   `max_new_tokens` fit the pool therefore never fails for lack of blocks.

use super::{Active, Batch, Engine, EngineError, Event, Flow, GenRequest, Waiting};
use crate::generation::generate::Generation;
use crate::generation::sampling::Sampler;
use crate::generation::vision::PrefillJob;
use crate::runtime::backend::{Backend, KvCapacity};

/// A request waiting for blocks: new, or preempted with what it had generated.
pub(super) struct Queued {
    pub index: usize,
    pub req: GenRequest,
    pub sampler: Sampler,
    pub out: Generation,
    pub seq: u64,
}

impl Queued {
    /// Positions its prefill writes: the prompt and the tokens generated before a preemption.
    fn positions(&self) -> usize {
        self.req.prompt_ids.len() + self.out.token_ids.len()
    }
}

/// Blocks a running page may still grow into before a new page starts: 1 % of the pool, as
/// vLLM's watermark, so that a start does not cause a preemption at the next step.
fn growth_reserve(total: usize) -> usize {
    total.div_ceil(100)
}

/// Whether a cache of capacity `cap` has the blocks waiting request `w`'s prefill takes
/// (always, for a cache that is not paged).
pub(super) fn has_blocks_for(cap: KvCapacity, w: &Waiting) -> bool {
    match cap {
        KvCapacity::Blocks {
            free, block_size, ..
        } => free >= (w.req.prompt_ids.len() + w.out.token_ids.len()).div_ceil(block_size),
        _ => true,
    }
}

impl<B: Backend> Engine<B> {
    /// Whether `batch` has room for another request: fewer than `max_batch` in it, and a
    /// free sequence for it (and for each waiting request without a reserved one) when the
    /// cache has fixed slots. With a paged cache a request is taken while none is queued for
    /// blocks; it then starts as soon as its blocks are free. A full cache makes new requests
    /// wait for running ones instead of failing.
    pub fn has_room(&mut self, batch: &Batch<B::Cache>) -> bool {
        self.reap(batch);
        if batch.len() >= self.max_batch.max(1) {
            return false;
        }
        match self.backend.kv_capacity() {
            KvCapacity::Unbounded => true,
            KvCapacity::Slots { free, .. } => {
                free > batch.waiting.iter().filter(|w| !w.reserved).count()
            }
            KvCapacity::Blocks { .. } => batch.queued.is_empty(),
        }
    }

    /// Blocks set aside for the prefills of pages on the vision stage.
    fn promised(batch: &Batch<B::Cache>) -> usize {
        batch.waiting.iter().map(|w| w.promised).sum()
    }

    /// Starts queued requests, oldest first, while the paged pool has their prompts' blocks
    /// beside those promised and the growth reserve (all of the pool when nothing runs).
    pub(super) fn start_queued(
        &mut self,
        batch: &mut Batch<B::Cache>,
        on_event: &mut dyn FnMut(Event) -> Flow,
    ) {
        while let Some(q) = batch.queued.front() {
            let KvCapacity::Blocks {
                free,
                total,
                block_size,
                ..
            } = self.backend.kv_capacity()
            else {
                return;
            };
            let need = q.positions().div_ceil(block_size);
            let idle = batch.active.is_empty() && batch.waiting.is_empty();
            let reserve = if idle { 0 } else { growth_reserve(total) };
            if free < Self::promised(batch) + need + reserve {
                return;
            }
            let q = batch.queued.pop_front().expect("front above");
            self.start(batch, q, need, on_event);
        }
    }

    /// Starts request `q`: hands its images to the vision stage (it then waits in the batch,
    /// with `promised` blocks set aside for its prefill) or prefills it here.
    pub(super) fn start(
        &mut self,
        batch: &mut Batch<B::Cache>,
        q: Queued,
        promised: usize,
        on_event: &mut dyn FnMut(Event) -> Flow,
    ) {
        let Queued {
            index,
            mut req,
            sampler,
            out,
            seq,
        } = q;
        if let Some(stage) = self.vision.as_mut().filter(|_| !req.images.is_empty()) {
            // The stage prefills too when it can and the backend sets a sequence aside (a
            // new request on a slot cache).
            let fresh = out.token_ids.is_empty() && promised == 0;
            let prefill = (fresh && stage.prefills())
                .then(|| self.backend.reserve(req.prompt_ids.len()))
                .flatten()
                .map(|cache| PrefillJob {
                    prompt_ids: req.prompt_ids.clone(),
                    image_token_id: self.image_token_id,
                    cache,
                });
            let reserved = prefill.is_some();
            // A paged cache may preempt the page later: its recompute needs the images again.
            let images = match promised {
                0 => std::mem::take(&mut req.images),
                _ => req.images.clone(),
            };
            let ticket = stage.submit(images, prefill);
            batch.waiting.push_back(Waiting {
                index,
                req,
                sampler,
                ticket,
                reserved,
                out,
                seq,
                promised,
            });
            return;
        }
        match self.prefill(&req, &out.token_ids) {
            Ok((logits, cache)) => {
                let cached = req.prompt_ids.len() + out.token_ids.len();
                batch.active.push(Active {
                    index,
                    req,
                    sampler,
                    logits,
                    device_choice: None,
                    cache,
                    out,
                    seq,
                    cached,
                });
            }
            Err(e) => {
                on_event(Event::Done {
                    index,
                    result: &Err(EngineError::Runtime(e.to_string())),
                });
            }
        }
    }

    /// Before a decode step over `keep`: with a paged cache, makes sure each page whose next
    /// position opens a new block gets one, preempting the youngest pages (their blocks given
    /// back, queued to be recomputed) until the rest fit. Blocks promised to pages on the
    /// vision stage are kept for them unless a single page is left running.
    pub(super) fn preempt_for_growth(
        &mut self,
        batch: &mut Batch<B::Cache>,
        mut keep: Vec<Active<B::Cache>>,
    ) -> Vec<Active<B::Cache>> {
        let Some(block_size) = self.backend.kv_capacity().block_size() else {
            return keep;
        };
        let promised = Self::promised(batch);
        while keep.len() > 1 {
            let free = self.backend.kv_capacity().free().unwrap_or(0);
            let opening = keep.iter().filter(|a| a.cached % block_size == 0).count();
            if opening + promised <= free {
                break;
            }
            let youngest = (0..keep.len())
                .max_by_key(|i| keep[*i].seq)
                .expect("more than one page");
            let a = keep.remove(youngest);
            self.stats.preemptions += 1;
            tracing::debug!(
                index = a.index,
                tokens = a.out.token_ids.len(),
                free,
                "preempted: the paged KV cache is full"
            );
            // Dropping its cache gives its blocks back; the oldest queued page starts first.
            let at = batch.queued.partition_point(|q| q.seq < a.seq);
            batch.queued.insert(
                at,
                Queued {
                    index: a.index,
                    req: a.req,
                    sampler: a.sampler,
                    out: a.out,
                    seq: a.seq,
                },
            );
        }
        keep
    }
}
