//! Building one ONNX Runtime session with the configured execution providers.
//!
//! Providers are tried in the configured order; one that is compiled in but cannot start (no
//! driver, no TensorRT libraries) is dropped with a message and the next one is tried, unless
//! providers are strict. The provider that the session got is returned with it, so the
//! decoder knows whose memory its KV cache can stay in. A graph's external weights are read
//! into memory first where the session would keep them mapped (`weights`), so no session
//! maps a file of the export once built. Also the checks before a load ([`verify_files`])
//! and writing the graph ONNX Runtime optimised ([`write_optimized_graph`]).

use super::weights::ExternalData;
use super::{LoadError, LoadOptions, MANIFEST_NAME};
use crate::runtime::providers::Provider;
use ocrctl_exporters::contract::hint;
use ocrctl_exporters::export::{DecoderVariant, Manifest, Precision};
use ocrctl_exporters::kv_cache::KvCache;
use ort::ep::ExecutionProviderDispatch;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use std::path::Path;

/// When set, every session of a load runs ONNX Runtime's profiler and writes its trace to
/// `<value><part>_<timestamp>.json` when it ends (e.g. `OCRCTL_ORT_PROFILE=/tmp/prof/`).
pub const PROFILE_ENV: &str = "OCRCTL_ORT_PROFILE";

/// A session and its main provider: the first registered one (ONNX Runtime places every node
/// that provider supports on it; the CPU provider, never registered explicitly, comes last).
pub(super) struct Built {
    pub session: Session,
    pub provider: Provider,
}

/// What one session needs beyond the load's options.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Tweaks<'a> {
    /// Also write the graph ONNX Runtime runs here.
    pub optimized: Option<&'a Path>,
    /// ONNX Runtime graph transformers left out (`optimization.disable_specified_optimizers`).
    pub disabled_optimizers: Option<&'static str>,
}

impl Tweaks<'static> {
    /// A decoder graph's: [`hint::KV8_DISABLED_OPTIMIZERS`] for a GQA decoder exported with an
    /// 8-bit cache (`kv`, the manifest's record), nothing otherwise.
    pub fn decoder(variant: DecoderVariant, kv: &KvCache) -> Self {
        Tweaks {
            disabled_optimizers: (variant == DecoderVariant::Gqa && *kv != KvCache::Activation)
                .then_some(hint::KV8_DISABLED_OPTIMIZERS),
            ..Tweaks::default()
        }
    }
}

/// Builds the session for `path` (see [`Tweaks`]).
pub(super) fn build(
    env: &ort::environment::Environment,
    path: &Path,
    opts: &LoadOptions,
    tweaks: Tweaks<'_>,
) -> Result<Built, LoadError> {
    let part = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("model")
        .to_string();
    let err = |message: String| LoadError::Session {
        path: path.to_path_buf(),
        message,
    };
    // Read at most once for every provider tried; dropped when this returns (ONNX Runtime
    // copied it).
    let mut weights = None;
    // Availability notes were printed once by `OrtModel::load`.
    let (mut order, _) =
        crate::runtime::providers::usable(&opts.providers).map_err(|e| err(e.to_string()))?;
    loop {
        if drop_unstartable_trt_rtx(env, opts, &mut order).map_err(&err)? {
            continue;
        }
        let rtx = order.first() == Some(&Provider::TensorRtRtx);
        let in_memory = weights_for(order[0], path, &mut weights)?;
        // A prebuilt engine replaces the graph: its EPContext model names the engine file.
        let prebuilt = rtx
            .then(|| opts.providers.trt_rtx.engines.get(&part))
            .flatten()
            .map(|p| p.as_path());
        let attempt = Attempt {
            part: &part,
            file: prebuilt.unwrap_or(path),
            prebuilt: prebuilt.is_some(),
            rtx,
            eps: order
                .iter()
                .filter_map(|p| crate::runtime::providers::dispatch(*p, &opts.providers, &part))
                .collect(),
        };
        match attempt.session(env, opts, tweaks, in_memory) {
            Ok(session) => {
                let provider = order
                    .iter()
                    .copied()
                    .find(|p| p.is_gpu())
                    .unwrap_or(Provider::Cpu);
                return Ok(Built { session, provider });
            }
            // A GPU provider that is compiled in but cannot start (no driver, no TensorRT
            // libraries): drop it and try the next one, unless strict.
            Err(e) if !opts.providers.strict && order.len() > 1 && order[0] != Provider::Cpu => {
                let failed = order.remove(0);
                let e = e.to_string();
                let hint =
                    crate::runtime::cudalibs::hint(&e).map_or(String::new(), |h| format!(": {h}"));
                tracing::warn!(
                    "{} execution provider failed for {part} ({e}){hint}; falling back to {}",
                    failed.name(),
                    order[0].name()
                );
            }
            Err(e) => {
                let e = e.to_string();
                return Err(err(match crate::runtime::cudalibs::hint(&e) {
                    Some(h) => format!("{e} ({h})"),
                    None => e,
                }));
            }
        }
    }
}

/// TensorRT-RTX is a plugin: whether it starts is known once it is registered and ONNX
/// Runtime offers it a device. When it is first in `order` and cannot start, it is dropped
/// (`Ok(true)`: try the next) or, with strict providers or nothing after it, the error.
fn drop_unstartable_trt_rtx(
    env: &ort::environment::Environment,
    opts: &LoadOptions,
    order: &mut Vec<Provider>,
) -> Result<bool, String> {
    if order.first() != Some(&Provider::TensorRtRtx) {
        return Ok(false);
    }
    let Err(why) = crate::runtime::trtrtx::devices(env) else {
        return Ok(false);
    };
    if opts.providers.strict || order.len() == 1 {
        return Err(format!(
            "tensorrt-rtx execution provider unavailable: {why} (strict providers: no fallback)"
        ));
    }
    order.remove(0);
    if crate::runtime::trtrtx::first_report() {
        tracing::warn!(
            "tensorrt-rtx execution provider unavailable: {why}; falling back to {}",
            order[0].name()
        );
    }
    Ok(true)
}

/// One try at a session, with the providers of `eps` in order.
struct Attempt<'a> {
    /// The graph's part name (file stem): the profiler's and the engines' key.
    part: &'a str,
    /// The graph, or the prebuilt engine's EPContext model that replaces it.
    file: &'a Path,
    prebuilt: bool,
    /// TensorRT-RTX is the first provider.
    rtx: bool,
    eps: Vec<ExecutionProviderDispatch>,
}

impl Attempt<'_> {
    /// Builds the session of this try.
    fn session(
        &self,
        env: &ort::environment::Environment,
        opts: &LoadOptions,
        tweaks: Tweaks<'_>,
        weights: Option<&ExternalData>,
    ) -> ort::Result<Session> {
        let mut b = Session::builder(env)?
            // An EPContext model is one node: nothing for ONNX Runtime to optimise.
            .with_optimization_level(if self.prebuilt {
                GraphOptimizationLevel::Disable
            } else {
                GraphOptimizationLevel::All
            })?
            .with_log_level(match crate::runtime::ortlib::log_level() {
                Some(level) => level,
                None if self.eps.is_empty() => ort::logging::LogLevel::Error,
                None => ort::logging::LogLevel::Warning,
            })?
            .with_config_entry(
                "session.qdq_matmulnbits_accuracy_level",
                opts.accuracy_level.to_string(),
            )?;
        if opts.threads > 0 {
            b = b.with_intra_threads(opts.threads)?;
        }
        // No memory patterns: ONNX Runtime plans one per distinct set of input shapes and
        // its arena keeps every block it planned. Every run here has new shapes (image
        // sizes, a growing past, a changing batch), so a server's arena only grew: on an
        // H200, `serve --profile 16gb` at batch 4 held 16.6 GB with patterns and 6.7 GB
        // without, at the same throughput (2.81 vs 2.97 requests/s).
        b = b.with_memory_pattern(false)?;
        // A CPU session allocates through malloc rather than ONNX Runtime's arena, which keeps
        // every region it grew: the cpu profile's server on the full-size model held 0.94 GB
        // more after two A4 pages with it (docs/benchmarks/2026-12-06-memory/); malloc's fixed
        // thresholds (`cli::malloc`) give such blocks back. OCRCTL_CPU_ARENA=on keeps it.
        if self.eps.is_empty()
            && !self.rtx
            && std::env::var("OCRCTL_CPU_ARENA").as_deref() != Ok("on")
        {
            b = b.with_execution_providers([ort::ep::CPU::default()
                .with_arena_allocator(false)
                .build()])?;
        }
        // ONNX Runtime's profiler for one run of a command (issue 9's "profile before you
        // optimise"): a Chrome-trace JSON per session, written when the session ends.
        if let Some(prefix) = std::env::var_os(PROFILE_ENV) {
            let mut p = prefix;
            p.push(format!("{}_", self.part));
            b = b.with_profiling(p)?;
        }
        if let Some(names) = tweaks.disabled_optimizers {
            b = b.with_disabled_optimizers(names)?;
        }
        if let (Some(p), false) = (tweaks.optimized, self.prebuilt) {
            b = b.with_optimized_model_path(p)?;
        }
        if self.rtx {
            let devices = env
                .devices()
                .filter(|d| d.ep().is_ok_and(|n| n == crate::runtime::trtrtx::EP_NAME));
            let options = opts.providers.trt_rtx.options(self.part);
            b = b.with_devices(devices, Some(&options))?;
        }
        if !self.eps.is_empty() {
            b = b.with_execution_providers(&self.eps)?;
        }
        // An EPContext model names its engine, not these weights.
        if let (Some(w), false) = (weights, self.prebuilt) {
            b = b.with_external_initializer_file_in_memory(&w.name, w.bytes.clone())?;
        }
        b.commit_from_file(self.file)
    }
}

/// The weights to hand a session of provider `p` in memory: read once (into `cache`) the
/// first time a provider that would keep the file mapped needs them; `None` for the others.
fn weights_for<'a>(
    p: Provider,
    path: &Path,
    cache: &'a mut Option<Option<ExternalData>>,
) -> Result<Option<&'a ExternalData>, LoadError> {
    if !super::weights::keeps_map(p) {
        return Ok(None);
    }
    if cache.is_none() {
        *cache = Some(super::weights::read(path)?);
    }
    Ok(cache.as_ref().and_then(|w| w.as_ref()))
}

/// Loads `model` on the CPU with `opts` and writes the graph ONNX Runtime actually runs
/// (after its optimisations and fusions) to `optimized`. Used to inspect fusions such as
/// DequantizeLinear + MatMul → MatMulNBits.
pub fn write_optimized_graph(
    model: &Path,
    optimized: &Path,
    opts: &LoadOptions,
) -> Result<(), LoadError> {
    let (_, env) = crate::runtime::ortlib::environment(opts.ort_lib.as_deref())?;
    let tweaks = Tweaks {
        optimized: Some(optimized),
        ..Tweaks::default()
    };
    build(&env, model, opts, tweaks).map(|_| ())
}

/// Checks the files a load of `precision` reads (all but other precisions' graphs) against
/// the digests in the manifest, and says how long it took.
pub(super) fn verify_files(
    dir: &Path,
    manifest: &Manifest,
    precision: Precision,
    decoder: DecoderVariant,
) -> Result<(), LoadError> {
    if manifest.files.is_empty() {
        tracing::warn!(
            "{} records no file digests (exported by an older ocrctl); not verified",
            dir.join(MANIFEST_NAME).display()
        );
        return Ok(());
    }
    let others: std::collections::HashSet<String> = manifest
        .graphs
        .iter()
        .flat_map(|(p, parts)| {
            parts.iter().filter_map(move |(part, g)| {
                let unused_decoder = [DecoderVariant::Merged, DecoderVariant::Gqa]
                    .iter()
                    .any(|v| *v != decoder && v.part() == part);
                (*p != precision || unused_decoder).then_some(g)
            })
        })
        .flat_map(|g| std::iter::once(&g.file).chain(g.data_file.as_ref()))
        .map(|f| format!("onnx/{f}"))
        .collect();
    let r = ocrctl_exporters::verify::verify(dir, &manifest.files, |n| !others.contains(n))?;
    tracing::info!(
        "verified {} files ({:.1} MiB) in {:.2} s (--no-verify skips this)",
        r.files,
        r.bytes as f64 / (1024.0 * 1024.0),
        r.elapsed.as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_gqa_decoder_with_an_8bit_cache_leaves_the_norm_fusion_out() {
        let off = |v, kv: KvCache| Tweaks::decoder(v, &kv).disabled_optimizers;
        assert_eq!(
            off(DecoderVariant::Gqa, KvCache::Fp8 { scale: 1.0 }),
            Some(hint::KV8_DISABLED_OPTIMIZERS)
        );
        assert_eq!(
            off(DecoderVariant::Gqa, KvCache::Int8 { scale: 0.1 }),
            Some(hint::KV8_DISABLED_OPTIMIZERS)
        );
        assert_eq!(off(DecoderVariant::Gqa, KvCache::Activation), None);
        assert_eq!(off(DecoderVariant::Merged, KvCache::Activation), None);
    }
}
