//! The state of a running batch ([`Batch`]): the requests decoding together with their
//! caches ([`Active`]), those whose images the vision stage is encoding ([`Waiting`]), and, with
//! a paged cache, those waiting for blocks.

use super::GenRequest;
use super::{admission, need};
use crate::generation::generate::Generation;
use crate::generation::sampling::Sampler;
use std::collections::VecDeque;

/// A request decoding: its sampler, its cache and what it generated so far.
pub(super) struct Active<C> {
    pub(super) index: usize,
    pub(super) req: GenRequest,
    pub(super) sampler: Sampler,
    pub(super) logits: Vec<f32>,
    /// The next token when it was chosen from the device's argmax or candidates (`logits`
    /// is then empty).
    pub(super) device_choice: Option<need::Chosen>,
    pub(super) cache: C,
    pub(super) out: Generation,
    /// Arrival order: a paged cache that runs dry preempts the youngest page first.
    pub(super) seq: u64,
    /// Positions its cache holds (the prompt, then one per token fed back).
    pub(super) cached: usize,
}

/// A request admitted while its images are encoded (and perhaps its prompt prefilled) on the
/// vision stage.
pub(super) struct Waiting {
    pub(super) index: usize,
    pub(super) req: GenRequest,
    pub(super) sampler: Sampler,
    pub(super) ticket: u64,
    /// Whether its cache sequence was reserved at admission (the stage prefills it);
    /// otherwise the prefill takes one when the features are back.
    pub(super) reserved: bool,
    /// What it generated before a preemption (empty for a new request).
    pub(super) out: Generation,
    pub(super) seq: u64,
    /// Blocks of a paged cache set aside for its prefill (0 otherwise).
    pub(super) promised: usize,
}

/// The requests being decoded together, with their caches, those admitted whose images
/// the vision stage is still encoding (they hold their place in the batch), and, with a
/// paged cache, those waiting for blocks (new, or preempted to be recomputed).
pub struct Batch<C> {
    pub(super) active: Vec<Active<C>>,
    pub(super) waiting: VecDeque<Waiting>,
    pub(super) queued: VecDeque<admission::Queued>,
}

impl<C> Default for Batch<C> {
    fn default() -> Self {
        Batch {
            active: Vec::new(),
            waiting: VecDeque::new(),
            queued: VecDeque::new(),
        }
    }
}

impl<C> Batch<C> {
    /// An empty batch.
    pub fn new() -> Self {
        Batch::default()
    }

    /// Requests in the batch (decoding, waiting for their image features or for blocks).
    pub fn len(&self) -> usize {
        self.active.len() + self.waiting.len() + self.queued.len()
    }

    /// Whether no request is in the batch.
    pub fn is_empty(&self) -> bool {
        self.active.is_empty() && self.waiting.is_empty() && self.queued.is_empty()
    }

    /// Requests decoding now (the decode step's batch).
    pub fn decoding(&self) -> usize {
        self.active.len()
    }

    /// Requests waiting for blocks of a paged cache: new ones, and preempted ones to be
    /// recomputed.
    pub fn queued(&self) -> usize {
        self.queued.len()
    }

    /// Requests admitted whose image features are still being computed.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The caller ids of the requests in the batch (decoding first, then waiting, then
    /// queued for blocks).
    pub fn indices(&self) -> Vec<usize> {
        let waiting = self.waiting.iter().map(|w| w.index);
        let queued = self.queued.iter().map(|q| q.index);
        let active = self.active.iter().map(|a| a.index);
        active.chain(waiting).chain(queued).collect()
    }

    /// Removes request `index`, returning what it generated so far.
    pub fn remove(&mut self, index: usize) -> Option<Generation> {
        if let Some(pos) = self.waiting.iter().position(|w| w.index == index) {
            return self.waiting.remove(pos).map(|w| w.out);
        }
        if let Some(pos) = self.queued.iter().position(|q| q.index == index) {
            return self.queued.remove(pos).map(|q| q.out);
        }
        let pos = self.active.iter().position(|a| a.index == index)?;
        Some(self.active.remove(pos).out)
    }
}
