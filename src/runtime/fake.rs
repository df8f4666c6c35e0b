//! One configurable fake [`Backend`] for unit tests, so that generation, batching and the
//! server's engine thread run without a model.
//!
//! Its hidden size is 1: a token embeds as its id (one number) and an image's feature is
//! its width, so merged image rows are visible in the output. The next token is a rule over
//! every input so far (see [`FakeBackend::new`]); its logit is [`FakeBackend::peak`], all
//! others 0. The other knobs add a delay, a panic or empty logits, a fixed number of cache
//! slots or a pool of blocks taken as sequences grow, an image encoder and a page prefill for a vision stage, an image it refuses and
//! device-side argmax and sampling candidates; the public counters say how it was called.

use crate::model::preprocess::Pixels;
use crate::runtime::backend::{
    Backend, BackendError, BatchLogits, ImageEncoder, KvCapacity, PagePrefill, RowNeed,
    StageHandles, StepLogits,
};
use ndarray::{Array2, Array4};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Picks the next token from every input value so far, in order (see [`FakeBackend::new`]).
type Rule = Arc<dyn Fn(&[f32]) -> u32 + Send + Sync>;

/// A fake model; build it with [`FakeBackend::new`] (or [`FakeBackend::sum`],
/// [`FakeBackend::successor`]) and the knobs below.
pub struct FakeBackend {
    rule: Rule,
    vocab: usize,
    peak: f32,
    delay: Duration,
    panic_at_decode: Option<usize>,
    /// Decode steps (1-based calls of [`Backend::decode_batch_select`]) that fail, and how.
    failing_steps: (Vec<usize>, String),
    steps: usize,
    empty_logits_for: Option<f32>,
    slots: Option<usize>,
    /// One clone per live cache: the strong count says how many slots are taken.
    held: Arc<()>,
    /// A paged cache's block pool ([`FakeBackend::blocks`]).
    pool: Option<Arc<BlockPool>>,
    offers_encoder: bool,
    offers_prefill: bool,
    /// Prefills run by the stage's handle ([`FakeBackend::with_page_prefill`]).
    stage_prefills: Arc<AtomicUsize>,
    refused_width: Option<usize>,
    decodes: usize,
    candidates: Option<usize>,
    /// Whether candidate rows come with their log-normaliser.
    lse: bool,
    last_step: Vec<Vec<f32>>,
    /// Rows answered with sampling candidates, and rows whose full logits were fetched after
    /// them ([`Backend::step_logits`]).
    pub candidate_rows: usize,
    pub step_logits_fetches: usize,
    /// Decoder runs so far: prefills and decode steps (one per sequence).
    pub forwards: usize,
    /// The most sequences one [`Backend::decode_batch`] call has held.
    pub max_batch_seen: usize,
}

impl FakeBackend {
    /// A model over `vocab` ids whose next token is `rule(inputs)`: `inputs` holds every row
    /// the decoder has seen for this sequence (the prompt, its image rows replaced by the
    /// images' widths, then each token fed back), one value per row. The cache is that list.
    pub fn new(vocab: usize, rule: impl Fn(&[f32]) -> u32 + Send + Sync + 'static) -> FakeBackend {
        FakeBackend {
            rule: Arc::new(rule),
            vocab,
            peak: 10.0,
            delay: Duration::ZERO,
            panic_at_decode: None,
            failing_steps: (Vec::new(), String::new()),
            steps: 0,
            empty_logits_for: None,
            slots: None,
            held: Arc::new(()),
            pool: None,
            offers_encoder: false,
            offers_prefill: false,
            stage_prefills: Arc::new(AtomicUsize::new(0)),
            refused_width: None,
            decodes: 0,
            candidates: None,
            lse: true,
            last_step: Vec::new(),
            candidate_rows: 0,
            step_logits_fetches: 0,
            forwards: 0,
            max_batch_seen: 0,
        }
    }

    /// Next token = (sum of every input so far) mod `vocab`: it depends on the whole history,
    /// so any mix-up between batched sequences changes the output.
    pub fn sum(vocab: usize) -> FakeBackend {
        let v = vocab as u64;
        FakeBackend::new(vocab, move |h| {
            (h.iter().map(|x| *x as u64).sum::<u64>() % v) as u32
        })
    }

    /// Next token = (last input + 1) mod `vocab`.
    pub fn successor(vocab: usize) -> FakeBackend {
        FakeBackend::new(vocab, move |h| {
            ((h[h.len() - 1] as usize + 1) % vocab) as u32
        })
    }

    /// The chosen token's logit (default 10; every other logit is 0).
    pub fn peak(mut self, logit: f32) -> FakeBackend {
        self.peak = logit;
        self
    }

    /// Sleeps `delay` in every decoder run (prefill, and each sequence of a decode step).
    pub fn delay(mut self, delay: Duration) -> FakeBackend {
        self.delay = delay;
        self
    }

    /// Panics with "a bug in a runtime" in the `n`-th decode step run (1-based, counted over
    /// all sequences; prefills do not count), like a runtime bug that unwinds.
    pub fn panic_at_decode(mut self, n: usize) -> FakeBackend {
        self.panic_at_decode = Some(n);
        self
    }

    /// Decode steps `steps` (1-based calls of [`Backend::decode_batch_select`]) fail with
    /// `message` before running, dropping the step's caches (their slots or blocks come back).
    pub fn fail_steps(mut self, steps: &[usize], message: &str) -> FakeBackend {
        self.failing_steps = (steps.to_vec(), message.to_string());
        self
    }

    /// A prefill whose input holds `id` (as a token or an image width) returns empty logits,
    /// which the sampler's precondition rejects.
    pub fn empty_logits_for(mut self, id: u32) -> FakeBackend {
        self.empty_logits_for = Some(id as f32);
        self
    }

    /// A cache of `n` sequences allocated once: a prefill takes a slot, dropping the cache
    /// frees it, and [`Backend::kv_capacity`] reports what is left.
    pub fn slots(mut self, n: usize) -> FakeBackend {
        self.slots = Some(n);
        self
    }

    /// A paged cache: a pool of `total` blocks of `block_size` positions (one per input row),
    /// taken as a sequence grows and given back when its cache is dropped. A run that needs a
    /// block when none is free fails, as a real pool would, so a scheduler that over-commits
    /// is caught.
    pub fn blocks(mut self, total: usize, block_size: usize) -> FakeBackend {
        self.pool = Some(Arc::new(BlockPool {
            total,
            block_size,
            used: AtomicUsize::new(0),
        }));
        self
    }

    /// Blocks held by live caches ([`FakeBackend::blocks`]).
    pub fn taken_blocks(&self) -> usize {
        self.pool
            .as_ref()
            .map_or(0, |p| p.used.load(Ordering::Relaxed))
    }

    /// Offers an image encoder for a vision stage ([`Backend::stage_handles`]); it sleeps
    /// `delay` per image, so decode steps run while it works.
    pub fn with_image_encoder(mut self) -> FakeBackend {
        self.offers_encoder = true;
        self
    }

    /// Offers a [`PagePrefill`] for the vision stage (with [`FakeBackend::with_image_encoder`]
    /// and [`FakeBackend::slots`]): [`Backend::reserve`] sets a slot aside and the stage's
    /// handle prefills into it with the same rule, sleeping `delay`.
    pub fn with_page_prefill(mut self) -> FakeBackend {
        self.offers_prefill = true;
        self
    }

    /// Prefills the stage's handle has run.
    pub fn stage_prefills(&self) -> usize {
        self.stage_prefills.load(Ordering::Relaxed)
    }

    /// Images `width` pixels wide fail to encode (on either path).
    pub fn refuse_image_width(mut self, width: usize) -> FakeBackend {
        self.refused_width = Some(width);
        self
    }

    /// Answers [`Backend::decode_batch_select`] as a GPU backend does: greedy rows get the
    /// argmax, sampling rows the `k` largest logits (largest first, lower id first on ties),
    /// with the step's full logits kept for [`Backend::step_logits`].
    pub fn candidates(mut self, k: usize) -> FakeBackend {
        self.candidates = Some(k);
        self
    }

    /// Candidate rows without their log-normaliser, as from a graph exported before the
    /// `logsumexp` output: log-probabilities then need the full row.
    pub fn without_logsumexp(mut self) -> FakeBackend {
        self.lse = false;
        self
    }

    /// Sequences holding a cache slot now.
    pub fn taken_slots(&self) -> usize {
        Arc::strong_count(&self.held) - 1
    }
}

/// A sequence's cache: every input row so far, and its slot or blocks while it lives.
pub struct FakeCache {
    history: Vec<f32>,
    _slot: Arc<()>,
    /// The pool and how many of its blocks this cache holds.
    blocks: Option<(Arc<BlockPool>, usize)>,
}

impl FakeCache {
    fn new(slot: Arc<()>, pool: Option<&Arc<BlockPool>>) -> FakeCache {
        FakeCache {
            history: Vec::new(),
            _slot: slot,
            blocks: pool.map(|p| (p.clone(), 0)),
        }
    }

    /// Appends `rows` to the history, taking the blocks they need first.
    fn extend(&mut self, rows: impl Iterator<Item = f32> + Clone) -> Result<(), BackendError> {
        if let Some((pool, held)) = self.blocks.as_mut() {
            let need = (self.history.len() + rows.clone().count()).div_ceil(pool.block_size);
            let more = need.saturating_sub(*held);
            let taken = pool.used.fetch_add(more, Ordering::Relaxed);
            if taken + more > pool.total {
                pool.used.fetch_sub(more, Ordering::Relaxed);
                return Err(BackendError::Invalid(format!(
                    "no free KV block: {more} more needed, {} of {} free",
                    pool.total - taken,
                    pool.total
                )));
            }
            *held += more;
        }
        self.history.extend(rows);
        Ok(())
    }
}

impl Drop for FakeCache {
    fn drop(&mut self) {
        if let Some((pool, held)) = self.blocks.take() {
            pool.used.fetch_sub(held, Ordering::Relaxed);
        }
    }
}

/// The fake's paged pool: blocks in use, counted.
struct BlockPool {
    total: usize,
    block_size: usize,
    used: AtomicUsize,
}

/// The fake's stage prefill: the model's rule over the prompt, into a reserved slot.
struct RulePrefill {
    rule: Rule,
    vocab: usize,
    peak: f32,
    delay: Duration,
    count: Arc<AtomicUsize>,
}

impl PagePrefill<FakeCache> for RulePrefill {
    fn embed(&mut self, ids: &[u32]) -> Result<Array2<f32>, BackendError> {
        Ok(embed_ids(ids))
    }

    fn prefill(
        &mut self,
        e: Array2<f32>,
        mut cache: FakeCache,
    ) -> Result<(Vec<f32>, FakeCache), BackendError> {
        std::thread::sleep(self.delay);
        if !cache.history.is_empty() {
            return Err(BackendError::Invalid(
                "a stage prefill into a used slot".into(),
            ));
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        cache.extend(e.iter().copied())?;
        let mut logits = vec![0.0; self.vocab];
        logits[(self.rule)(&cache.history) as usize] = self.peak;
        Ok((logits, cache))
    }
}

fn embed_ids(ids: &[u32]) -> Array2<f32> {
    Array2::from_shape_fn((ids.len(), 1), |(i, _)| ids[i] as f32)
}

/// The fake's image encoder: an image's feature is its width.
struct WidthEncoder {
    delay: Duration,
    refused_width: Option<usize>,
}

impl ImageEncoder for WidthEncoder {
    fn encode(&mut self, p: &Pixels) -> Result<Array2<f32>, BackendError> {
        std::thread::sleep(self.delay);
        encode_width(p, self.refused_width)
    }
}

/// An image `width` pixels wide (one high) for the fake's encoder, whose feature is the width.
pub fn image(width: usize) -> Pixels {
    Pixels::dense(Array4::zeros((1, 3, 1, width)))
}

fn encode_width(p: &Pixels, refused: Option<usize>) -> Result<Array2<f32>, BackendError> {
    let w = p.width();
    if refused == Some(w) {
        return Err(BackendError::Invalid(format!("an image {w} pixels wide")));
    }
    Ok(Array2::from_elem((1, 1), w as f32))
}

impl Backend for FakeBackend {
    type Cache = FakeCache;

    fn hidden_size(&self) -> usize {
        1
    }

    fn encode_image(&mut self, p: &Pixels) -> Result<Array2<f32>, BackendError> {
        encode_width(p, self.refused_width)
    }

    fn stage_handles(&self) -> Option<StageHandles<FakeCache>> {
        let encoder = self.offers_encoder.then(|| {
            Box::new(WidthEncoder {
                delay: self.delay,
                refused_width: self.refused_width,
            }) as Box<dyn ImageEncoder>
        })?;
        let prefill = self.offers_prefill.then(|| {
            Box::new(RulePrefill {
                rule: self.rule.clone(),
                vocab: self.vocab,
                peak: self.peak,
                delay: self.delay,
                count: self.stage_prefills.clone(),
            }) as Box<dyn PagePrefill<FakeCache>>
        });
        Some(StageHandles { encoder, prefill })
    }

    fn reserve(&mut self, _positions: usize) -> Option<FakeCache> {
        let free = self.slots? - self.taken_slots();
        (free > 0).then(|| FakeCache::new(self.held.clone(), None))
    }

    fn kv_capacity(&self) -> KvCapacity {
        if let Some(p) = &self.pool {
            let used = p.used.load(Ordering::Relaxed);
            return KvCapacity::Blocks {
                free: p.total.saturating_sub(used),
                total: p.total,
                block_size: p.block_size,
                positions: p.total * p.block_size,
            };
        }
        match self.slots {
            Some(n) => KvCapacity::Slots {
                free: n.saturating_sub(self.taken_slots()),
                positions: usize::MAX,
            },
            None => KvCapacity::Unbounded,
        }
    }

    fn embed(&mut self, ids: &[u32]) -> Result<Array2<f32>, BackendError> {
        Ok(embed_ids(ids))
    }

    fn forward(
        &mut self,
        e: Array2<f32>,
        cache: Option<FakeCache>,
    ) -> Result<(Vec<f32>, FakeCache), BackendError> {
        self.forwards += 1;
        std::thread::sleep(self.delay);
        let prefill = cache.is_none();
        if !prefill {
            self.decodes += 1;
            if self.panic_at_decode == Some(self.decodes) {
                panic!("a bug in a runtime");
            }
        }
        let mut cache = match cache {
            Some(c) => c,
            None => {
                if self.slots.is_some_and(|n| self.taken_slots() >= n) {
                    return Err(BackendError::Invalid("no free cache slot".into()));
                }
                FakeCache::new(self.held.clone(), self.pool.as_ref())
            }
        };
        cache.extend(e.iter().copied())?;
        let history = &cache.history;
        if prefill
            && self
                .empty_logits_for
                .is_some_and(|v| e.iter().any(|x| *x == v))
        {
            return Ok((Vec::new(), cache));
        }
        let mut logits = vec![0.0; self.vocab];
        logits[(self.rule)(history) as usize] = self.peak;
        Ok((logits, cache))
    }

    fn decode_batch(
        &mut self,
        tokens: &[u32],
        caches: Vec<FakeCache>,
    ) -> Result<BatchLogits<FakeCache>, BackendError> {
        self.max_batch_seen = self.max_batch_seen.max(tokens.len());
        let mut logits = Vec::with_capacity(tokens.len());
        let mut out = Vec::with_capacity(tokens.len());
        for (t, c) in tokens.iter().zip(caches) {
            let e = self.embed(&[*t])?;
            let (l, c) = self.forward(e, Some(c))?;
            logits.push(l);
            out.push(c);
        }
        Ok((logits, out))
    }

    fn decode_batch_select(
        &mut self,
        tokens: &[u32],
        caches: Vec<FakeCache>,
        need: &[RowNeed],
    ) -> Result<(Vec<StepLogits>, Vec<FakeCache>), BackendError> {
        self.steps += 1;
        if self.failing_steps.0.contains(&self.steps) {
            return Err(BackendError::runtime("decoder", &self.failing_steps.1));
        }
        let (logits, caches) = self.decode_batch(tokens, caches)?;
        let Some(k) = self.candidates else {
            return Ok((logits.into_iter().map(StepLogits::Full).collect(), caches));
        };
        let rows = logits
            .iter()
            .zip(need)
            .map(|(l, n)| {
                let mut top: Vec<(f32, u32)> =
                    l.iter().enumerate().map(|(i, v)| (*v, i as u32)).collect();
                top.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                match n {
                    RowNeed::Argmax => StepLogits::Argmax(top[0].1),
                    RowNeed::Candidates => {
                        self.candidate_rows += 1;
                        top.truncate(k);
                        StepLogits::Candidates {
                            top,
                            vocab: l.len(),
                            lse: self
                                .lse
                                .then(|| crate::generation::generate::log_sum_exp(l)),
                        }
                    }
                    RowNeed::Full => StepLogits::Full(l.clone()),
                }
            })
            .collect();
        self.last_step = logits;
        Ok((rows, caches))
    }

    fn step_logits(&mut self, row: usize) -> Result<Vec<f32>, BackendError> {
        self.step_logits_fetches += 1;
        self.last_step
            .get(row)
            .cloned()
            .ok_or_else(|| BackendError::Invalid(format!("no row {row} in the last step")))
    }
}
