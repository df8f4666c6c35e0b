//! Execution-provider selection: TensorRT-RTX / TensorRT → CUDA → CPU in a profile's order,
//! with fallback.
//!
//! TensorRT-RTX is a plugin execution provider (its own shared library, registered with ONNX
//! Runtime at run time and appended per device): see [`crate::runtime::trtrtx`].
//!
//! A provider that this ONNX Runtime build lacks (the CPU wheel has neither CUDA nor
//! TensorRT), or whose libraries fail to load at registration (no `libnvinfer.so.10`, no
//! CUDA driver), is skipped with one line saying which and what ocrctl fell back to; with
//! `strict` that is an error instead. Sessions with a GPU provider log at warning level, so
//! ONNX Runtime's own report of nodes it placed on the CPU is shown. (Forbidding CPU
//! placement with `session.disable_cpu_ep_fallback` is not usable: ORT always places shape
//! computations on the CPU, and the load then fails — seen on the H200 with the CUDA EP.)

use ort::ep::{self, ExecutionProvider, ExecutionProviderDispatch};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// One execution provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    #[serde(rename = "tensorrt")]
    TensorRt,
    /// NVIDIA TensorRT for RTX (GeForce RTX and RTX workstation cards, Ampere and later),
    /// through ONNX Runtime's `NvTensorRTRTXExecutionProvider` plugin.
    #[serde(rename = "tensorrt-rtx")]
    TensorRtRtx,
    Cuda,
    Cpu,
}

impl Provider {
    /// Every provider, in the order `--providers`' help lists them.
    pub const ALL: [Provider; 4] = [
        Provider::TensorRtRtx,
        Provider::TensorRt,
        Provider::Cuda,
        Provider::Cpu,
    ];

    /// The provider of a [`name`](Provider::name), or of its short form (`trt-rtx`, `trt`).
    pub fn parse(name: &str) -> Option<Provider> {
        match name {
            "trt-rtx" => Some(Provider::TensorRtRtx),
            "trt" => Some(Provider::TensorRt),
            _ => Provider::ALL.into_iter().find(|p| p.name() == name),
        }
    }

    /// Whether the provider runs on a GPU.
    pub fn is_gpu(self) -> bool {
        !matches!(self, Provider::Cpu)
    }

    /// Whether the provider is a TensorRT (classic or RTX): it parses the `--target tensorrt`
    /// graphs and needs shape ranges.
    pub fn is_tensorrt(self) -> bool {
        matches!(self, Provider::TensorRt | Provider::TensorRtRtx)
    }

    /// Name as used in profiles and messages.
    pub fn name(self) -> &'static str {
        match self {
            Provider::TensorRt => "tensorrt",
            Provider::TensorRtRtx => "tensorrt-rtx",
            Provider::Cuda => "cuda",
            Provider::Cpu => "cpu",
        }
    }
}

/// CUDA provider settings.
#[derive(Debug, Clone, Default)]
pub struct CudaConfig {
    /// Arena limit in bytes (`gpu_mem_limit`).
    pub memory_limit: Option<usize>,
    /// `kSameAsRequested` instead of power-of-two arena growth (tight budgets).
    pub same_as_requested: bool,
    /// CUDA graphs for the GQA decoder's decode steps (one graph per batch bucket).
    pub cuda_graphs: bool,
}

/// TensorRT provider settings. Shape profiles are per graph (`part` → min, opt, max).
#[derive(Debug, Clone, Default)]
pub struct TrtConfig {
    pub workspace: Option<usize>,
    pub engine_cache: Option<PathBuf>,
    pub timing_cache: Option<PathBuf>,
    pub builder_optimization_level: Option<u8>,
    pub fp16: bool,
    pub shapes: std::collections::BTreeMap<String, (String, String, String)>,
}

/// Which providers to try, in order, and how.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    pub order: Vec<Provider>,
    pub strict: bool,
    pub device_id: i32,
    pub cuda: CudaConfig,
    pub trt: TrtConfig,
    pub trt_rtx: crate::runtime::trtrtx::TrtRtxConfig,
}

impl Default for ProviderConfig {
    fn default() -> Self {
        ProviderConfig {
            order: vec![Provider::Cpu],
            strict: false,
            device_id: 0,
            cuda: CudaConfig::default(),
            trt: TrtConfig::default(),
            trt_rtx: Default::default(),
        }
    }
}

/// Errors selecting providers.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("{provider} execution provider unavailable: {reason} (strict providers: no fallback)")]
    Unavailable {
        provider: &'static str,
        reason: String,
    },
}

/// Whether this ONNX Runtime build was compiled with `p`.
pub fn compiled_in(p: Provider) -> bool {
    match p {
        Provider::TensorRt => ep::TensorRT::is_available().unwrap_or(false),
        // A plugin: present when its library is found; whether it starts is known only once it
        // is registered (see `trtrtx::devices`).
        Provider::TensorRtRtx => crate::runtime::trtrtx::plugin_library().is_ok(),
        Provider::Cuda => ep::CUDA::is_available().unwrap_or(false),
        Provider::Cpu => true,
    }
}

/// Whether graph `part`'s session captures CUDA graphs when they are on: the GQA and paged
/// decoders, whose decode steps have fixed shapes per batch bucket (`ortmodel::gqa::graphs`,
/// `ortmodel::paged::graphs`); the other graphs' shapes change from run to run.
pub fn captures_graphs(part: &str) -> bool {
    use ocrctl_exporters::contract::graph::{DECODER_GQA, DECODER_PAGED};
    part.starts_with(DECODER_GQA) || part.starts_with(DECODER_PAGED)
}

/// The dispatch for `p` configured for graph `part` (`None` for the CPU, which ORT always has).
pub fn dispatch(
    p: Provider,
    cfg: &ProviderConfig,
    part: &str,
) -> Option<ExecutionProviderDispatch> {
    if p.is_gpu() {
        // The provider library resolves CUDA by soname: wheels' copies must be loaded first.
        if let Some(lib) = crate::runtime::ortlib::loaded_library() {
            crate::runtime::cudalibs::preload(lib);
        }
    }
    match p {
        // Plugin EPs are appended per device, not by dispatch (`trtrtx::append`).
        Provider::Cpu | Provider::TensorRtRtx => None,
        Provider::Cuda => {
            let graphs = cfg.cuda.cuda_graphs && captures_graphs(part);
            // TF32 off: ONNX Runtime's CUDA provider otherwise multiplies float32 with 10-bit
            // mantissas, and an fp32 graph drifted from the reference by 0.004–0.007 in
            // log-probabilities (0 on four of five fixture pages without). Whoever picks fp32
            // on a GPU asks for the reference's arithmetic. fp16 graphs drifted less too and
            // ran no slower on the H200 (docs/benchmarks/2026-12-04-h200/ §3, §5).
            let mut c = ep::CUDA::default()
                .with_device_id(cfg.device_id)
                .with_cuda_graph(graphs)
                .with_tf32(false);
            if let Some(l) = cfg.cuda.memory_limit {
                c = c.with_memory_limit(l);
            }
            if cfg.cuda.same_as_requested {
                c = c.with_arena_extend_strategy(ep::ArenaExtendStrategy::SameAsRequested);
            }
            Some(c.build().error_on_failure())
        }
        Provider::TensorRt => {
            let mut t = ep::TensorRT::default()
                .with_device_id(cfg.device_id)
                .with_fp16(cfg.trt.fp16);
            if let Some(w) = cfg.trt.workspace {
                t = t.with_max_workspace_size(w);
            }
            if let Some(d) = &cfg.trt.engine_cache {
                t = t
                    .with_engine_cache(true)
                    .with_engine_cache_path(d.display())
                    .with_engine_cache_prefix(part);
            }
            if let Some(d) = &cfg.trt.timing_cache {
                t = t
                    .with_timing_cache(true)
                    .with_timing_cache_path(d.display());
            }
            if let Some(l) = cfg.trt.builder_optimization_level {
                t = t.with_builder_optimization_level(l);
            }
            if let Some((min, opt, max)) = cfg.trt.shapes.get(part) {
                t = t
                    .with_profile_min_shapes(min)
                    .with_profile_opt_shapes(opt)
                    .with_profile_max_shapes(max);
            }
            Some(t.build().error_on_failure())
        }
    }
}

/// Providers of `cfg.order` that this build has; the others are reported (or, when
/// `strict`, refused). Returns the usable order and the messages.
pub fn usable(cfg: &ProviderConfig) -> Result<(Vec<Provider>, Vec<String>), ProviderError> {
    let mut keep = Vec::new();
    let mut notes = Vec::new();
    for (i, p) in cfg.order.iter().enumerate() {
        if compiled_in(*p) {
            keep.push(*p);
            continue;
        }
        let reason = if *p == Provider::TensorRtRtx {
            crate::runtime::trtrtx::plugin_library()
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        } else {
            "not compiled into this ONNX Runtime (the `onnxruntime` CPU wheel has only the CPU provider; install `onnxruntime-gpu`)".to_string()
        };
        if cfg.strict {
            return Err(ProviderError::Unavailable {
                provider: p.name(),
                reason,
            });
        }
        let next = cfg.order[i + 1..]
            .iter()
            .find(|q| compiled_in(**q))
            .map_or("the CPU", |q| q.name());
        let verb = if *p == Provider::TensorRtRtx {
            "unavailable: "
        } else {
            ""
        };
        notes.push(format!(
            "{} execution provider {verb}{reason}; falling back to {next}",
            p.name()
        ));
    }
    if keep.is_empty() {
        keep.push(Provider::Cpu);
    }
    Ok((keep, notes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_decoders_with_bucketed_steps_capture_graphs() {
        use ocrctl_exporters::contract::graph;
        // The paged decoder's sessions were once built without graphs: its "captured"
        // buckets then ran as plain runs (2026-12-06).
        for (part, captures) in [
            (graph::DECODER_GQA, true),
            (graph::DECODER_PAGED, true),
            (graph::VISION, false),
            (graph::EMBED, false),
        ] {
            assert_eq!(captures_graphs(part), captures, "{part}");
        }
    }

    #[test]
    fn provider_names_round_trip_through_serde() {
        let v: Vec<Provider> =
            serde_json::from_str(r#"["tensorrt-rtx","tensorrt","cuda","cpu"]"#).unwrap();
        assert_eq!(
            v,
            vec![
                Provider::TensorRtRtx,
                Provider::TensorRt,
                Provider::Cuda,
                Provider::Cpu
            ]
        );
        assert_eq!(
            serde_json::to_string(&Provider::TensorRtRtx).unwrap(),
            "\"tensorrt-rtx\""
        );
        assert_eq!(
            serde_json::to_string(&Provider::TensorRt).unwrap(),
            "\"tensorrt\""
        );
    }
}
