//! One process-wide lock that keeps every other thread's GPU work out of a CUDA graph capture.
//!
//! ONNX Runtime's CUDA provider captures a graph with `cudaStreamCaptureModeGlobal`: while
//! one thread captures, a "potentially unsafe" CUDA call from *any* thread of the process
//! (`cudaMalloc`, a synchronous copy, `cudaDeviceSynchronize`, which ONNX Runtime's IoBinding
//! calls to synchronise inputs) fails with "operation not permitted when stream is
//! capturing", and the capture is invalidated too. The decode graphs are captured at load
//! ([`super::gqa`]), but a process may have other threads on the GPU then: the vision and
//! prefill stages of an engine already serving, another device's engine loading or
//! serving. Seen on an H200 (2026-12-03) when captures still happened lazily during the
//! first decode steps: a prefill on the stage's thread failed with that error, then a
//! vision encoder run with a cuDNN error, two pages lost.
//!
//! A vision encoder run can collide the other way (H200, 2026-12-03, 2 of 6 fixture runs with
//! the vision stage and CUDA graphs on, fp16 cache): the decoder's input synchronisation
//! failed with that error while the stage's thread ran a page of a size not seen before, and
//! that run failed in cuDNN's `execute` of its first convolution; the process had no capture
//! of its own open then (scripts/gpu/capture_shim.c logged every one through the CUDA runtime:
//! the decode graphs', all ended at load), so the capture was most likely cuDNN's own (its
//! runtime is linked in, out of the shim's sight), on a new shape. Runs of
//! sizes already seen never collided there; on an H100 (2026-12-06) they did when the
//! size differed from the encoder's previous run (its convolution keeps one shape's plan). So
//! a vision run whose shape changed holds the lock alone too ([`hold`]).
//!
//! So a capture holds the lock [`exclusive`]ly and every GPU-touching entry point of a model
//! (the [`crate::runtime::backend::Backend`] methods, the stages' encoder and prefill, a
//! model's loading) holds it [`shared`]: captures wait for running work to finish, and work
//! waits for a capture (a few hundred milliseconds, once per model load). Uncontended, a
//! shared hold costs one atomic operation. Shared holds nest on one thread (a backend
//! method calling another): only the outermost takes the lock, so a capture waiting between
//! two nested holds cannot deadlock them.

use std::cell::Cell;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

static LOCK: RwLock<()> = RwLock::new(());

thread_local! {
    /// How many [`Shared`] holds this thread has open.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// A shared hold of the capture lock (see the module documentation).
pub(crate) struct Shared {
    guard: Option<RwLockReadGuard<'static, ()>>,
}

impl Shared {
    /// Runs `f` with this hold released, then holds the lock again: for a capture on this
    /// thread ([`exclusive`]) in the middle of work that holds it shared.
    pub(crate) fn released<R>(&mut self, f: impl FnOnce() -> R) -> R {
        drop(self.guard.take());
        DEPTH.with(|d| d.set(d.get() - 1));
        let r = f();
        let outermost = DEPTH.with(|d| {
            d.set(d.get() + 1);
            d.get() == 1
        });
        if outermost {
            self.guard = Some(LOCK.read().unwrap_or_else(PoisonError::into_inner));
        }
        r
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
    }
}

/// Holds the lock shared for the life of the result: no capture starts meanwhile.
pub(crate) fn shared() -> Shared {
    let outermost = DEPTH.with(|d| {
        d.set(d.get() + 1);
        d.get() == 1
    });
    Shared {
        // A panic while holding the lock leaves nothing inconsistent behind it: go on.
        guard: outermost.then(|| LOCK.read().unwrap_or_else(PoisonError::into_inner)),
    }
}

/// Holds the lock alone for the life of the result, once every shared hold has ended: for a
/// capture. Must not be called while this thread holds it shared (it would wait forever).
pub(crate) fn exclusive() -> RwLockWriteGuard<'static, ()> {
    debug_assert_eq!(DEPTH.with(Cell::get), 0, "exclusive inside a shared hold");
    LOCK.write().unwrap_or_else(PoisonError::into_inner)
}

/// A hold of the lock, [`shared`] or [`exclusive`] (see [`hold`]).
pub(crate) enum Hold {
    /// Other threads' work goes on; captures wait.
    Shared { _hold: Shared },
    /// Nothing else on the GPU meanwhile (what a capture needs).
    Alone {
        _guard: RwLockWriteGuard<'static, ()>,
    },
}

/// Holds the lock alone when `alone` (work that may capture a stream of its own, such as a
/// session's first run of a shape) and this thread holds it nowhere else; shared otherwise
/// (a nested hold cannot become exclusive without waiting for itself).
pub(crate) fn hold(alone: bool) -> Hold {
    if alone && DEPTH.with(Cell::get) == 0 {
        Hold::Alone {
            _guard: exclusive(),
        }
    } else {
        Hold::Shared { _hold: shared() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_capture_waits_for_shared_holds_and_holds_nest() {
        // One thread holds the lock shared (twice, nested), another asks for it alone: it
        // gets it only after the outer hold ends, and a nested hold taken while the writer
        // waits does not deadlock.
        let held = Arc::new(AtomicBool::new(false));
        let outer = shared();
        let h = held.clone();
        let writer = std::thread::spawn(move || {
            let _w = exclusive();
            h.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(50));
        let inner = shared();
        assert!(!held.load(Ordering::SeqCst), "the capture must wait");
        drop(inner);
        assert!(!held.load(Ordering::SeqCst), "the outer hold is still open");
        drop(outer);
        writer.join().unwrap();
        assert!(held.load(Ordering::SeqCst));
        assert_eq!(DEPTH.with(Cell::get), 0);
        // A hold released around an exclusive section on the same thread (a model's load
        // capturing its graphs), then held again.
        let mut load = shared();
        let inside = load.released(|| {
            let _w = exclusive();
            DEPTH.with(Cell::get)
        });
        assert_eq!((inside, DEPTH.with(Cell::get)), (0, 1));
        assert!(LOCK.try_write().is_err(), "held shared again");
        drop(load);
        assert_eq!(DEPTH.with(Cell::get), 0);
    }

    #[test]
    fn hold_is_alone_only_when_asked_and_not_nested() {
        // Alone: no other hold can be taken meanwhile.
        let alone = hold(true);
        assert!(matches!(alone, Hold::Alone { .. }));
        assert!(LOCK.try_read().is_err());
        drop(alone);
        // Not asked: shared (no capture can start; other tests' holds make more racy).
        let shared_hold = hold(false);
        assert!(matches!(shared_hold, Hold::Shared { .. }));
        assert!(LOCK.try_write().is_err());
        // Asked inside a shared hold of this thread: shared (exclusive would wait forever).
        let nested = hold(true);
        assert!(matches!(nested, Hold::Shared { .. }));
        drop(nested);
        drop(shared_hold);
        assert_eq!(DEPTH.with(Cell::get), 0);
    }
}
