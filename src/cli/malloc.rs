//! glibc's malloc set to give freed memory back to the system.
//!
//! glibc raises its mmap threshold to the size of every mmapped block freed, up to 32 MiB;
//! from then on such blocks come from its heaps, which are only trimmed at their top. After a
//! burst of 16 large pages `ocrctl serve` on the fixture stayed at its 497 MiB peak; with fixed
//! thresholds it went back to ~120 MiB, for ONNX Runtime's and pdfium's allocations as well as
//! ours, since all go through glibc (docs/benchmarks/2026-12-06-memory: mimalloc as Rust's
//! allocator did less, and raised the peak).

/// Blocks of 1 MiB and more are mapped and unmapped on their own, and a heap keeps at most
/// 1 MiB free at its top. Glibc's own variables (`GLIBC_TUNABLES=glibc.malloc.mmap_threshold=…`,
/// `MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`) win when set.
pub fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const THRESHOLD: libc::c_int = 1 << 20;
        let set = |name: &str| std::env::var_os(name).is_some();
        let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
        for (param, env, tunable) in [
            (
                libc::M_MMAP_THRESHOLD,
                "MALLOC_MMAP_THRESHOLD_",
                "mmap_threshold",
            ),
            (
                libc::M_TRIM_THRESHOLD,
                "MALLOC_TRIM_THRESHOLD_",
                "trim_threshold",
            ),
        ] {
            if !set(env) && !tunables.contains(tunable) {
                // SAFETY: mallopt only sets a malloc parameter; called before any thread starts.
                unsafe { libc::mallopt(param, THRESHOLD) };
            }
        }
    }
}
