//! A decode step that failed for a reason outside its pages: its pages are queued again and
//! recomputed from their prompt and tokens (as a preempted page is) rather than failed.
//!
//! The one such reason known is a CUDA stream-capture collision: while a library captures a
//! stream in global mode, another thread's synchronisation fails with "operation not
//! permitted when stream is capturing" (CUDA error 900) and nothing ran. Fixture runs of 15
//! pages on an H100 lost a page this way in about one of four runs
//! (docs/benchmarks/2026-12-06-paged §3). Only a paged cache recomputes (its pages keep
//! their images, their blocks came back when the failed step dropped their caches); a page
//! is queued again at most [`MAX_REQUEUES`] times, then fails with the error.

use super::admission::Queued;
use super::*;

/// Times one page may be queued again after a transient step failure.
pub const MAX_REQUEUES: u32 = 2;

/// CUDA's text for error 900 (`cudaErrorStreamCaptureUnsupported`), as ONNX Runtime reports it.
const CAPTURE_COLLISION: &str = "operation not permitted when stream is capturing";

/// Whether `e` is a failure the step's pages had no part in.
pub fn is_transient(e: &BackendError) -> bool {
    e.to_string().contains(CAPTURE_COLLISION)
}

impl<B: Backend> Engine<B> {
    /// Queues `q` again to be recomputed when its step failed with a transient `e`, on a
    /// paged cache, and it has been queued again fewer than [`MAX_REQUEUES`] times; returns
    /// it otherwise (the caller fails it).
    pub(super) fn requeue(
        &mut self,
        batch: &mut Batch<B::Cache>,
        q: Queued,
        e: &BackendError,
    ) -> Option<Queued> {
        let paged = self.backend.kv_capacity().block_size().is_some();
        if !paged || !is_transient(e) {
            return Some(q);
        }
        // Counted only for pages that were requeued (a collision is rare), and forgotten once
        // the page fails for good.
        let times = self.requeues.entry(q.index).or_insert(0);
        if *times >= MAX_REQUEUES {
            self.requeues.remove(&q.index);
            return Some(q);
        }
        *times += 1;
        self.stats.requeued += 1;
        tracing::warn!(
            index = q.index,
            tokens = q.out.token_ids.len(),
            "a decode step failed ({e}); its page is recomputed"
        );
        let at = batch.queued.partition_point(|w| w.seq < q.seq);
        batch.queued.insert(at, q);
        None
    }
}
