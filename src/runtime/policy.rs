//! What a hardware profile and a caller's explicit choices make of an opened export's
//! [`LoadOptions`]: the precision (the profile's, or the exported one closest to it), the
//! providers and their settings (CUDA arena, TensorRT workspace, caches and min/opt/max
//! shapes derived from the profile and the model, TensorRT-RTX's prebuilt engines), threads
//! and the KV cache's size. A choice the caller made ([`RuntimeChoices`]) always wins over the
//! profile's; without a profile the defaults are the CPU's.

use crate::model::export::Export;
use crate::profile::{
    trt_shapes, ArenaExtendStrategy, ModelDims, Profile, TensorRtRtxSection, TensorRtSection,
};
use crate::runtime::ortmodel::LoadOptions;
use crate::runtime::providers::{CudaConfig, Provider, ProviderConfig, TrtConfig};
use crate::runtime::trtrtx::{self, engines, TrtRtxConfig};
use ocrctl_exporters::contract::graph;
use ocrctl_exporters::export::{DecoderVariant, Precision};
use std::path::PathBuf;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// What the caller chose explicitly (command-line flags); `None` leaves it to the profile.
#[derive(Debug, Clone)]
pub struct RuntimeChoices {
    pub precision: Option<Precision>,
    pub providers: Option<Vec<Provider>>,
    /// Fail instead of falling back when a listed provider is unavailable.
    pub strict_providers: bool,
    pub threads: Option<usize>,
    pub ort_lib: Option<PathBuf>,
    pub accuracy_level: u8,
    pub decoder: Option<DecoderVariant>,
    /// GiB of the paged decoder's block pool.
    pub kv_cache_gb: Option<f64>,
    /// Check the export's files against their digests.
    pub verify: bool,
    pub cuda_graphs: Option<bool>,
    pub vision_stage: bool,
    pub prefill_stage: bool,
}

/// Load options for `export` under `profile` (if any) with the caller's `choices`, and the
/// one line to tell the user when the profile's precision was replaced by an exported one.
pub fn load_options(
    export: &Export,
    profile: Option<&Profile>,
    choices: &RuntimeChoices,
) -> (LoadOptions, Option<String>) {
    let (precision, notice) = match (choices.precision, profile) {
        (Some(p), _) => (p, None),
        (None, Some(pr)) => profile_precision(pr, export),
        (None, None) => (Precision::Fp32, None),
    };
    let mut lo = LoadOptions::new(precision);
    lo.ort_lib = choices.ort_lib.clone();
    lo.accuracy_level = choices.accuracy_level;
    lo.verify = choices.verify;
    lo.decoder = choices.decoder;
    if let Some(p) = profile {
        lo.kv_slots = p.max_batch_size.max(1) as usize;
        lo.max_sequence_length = p.max_sequence_length as usize;
        lo.kv_cache_bytes = (p.kv_cache_gb > 0.0).then_some((p.kv_cache_gb * GIB) as usize);
    }
    if let Some(g) = choices.kv_cache_gb {
        lo.kv_cache_bytes = Some((g * GIB) as usize);
    }
    lo.threads = choices
        .threads
        .or(profile
            .and_then(|p| p.cpu.as_ref())
            .map(|c| c.threads as usize))
        .unwrap_or(0);
    lo.providers = provider_config(export, profile, choices, precision);
    lo.vision_stage = choices.vision_stage;
    lo.prefill_stage = choices.prefill_stage;
    (lo, notice)
}

/// The providers in order and each one's settings: the caller's order, else the profile's,
/// else the CPU; the profile's CUDA, TensorRT and TensorRT-RTX sections.
fn provider_config(
    export: &Export,
    profile: Option<&Profile>,
    choices: &RuntimeChoices,
    precision: Precision,
) -> ProviderConfig {
    let mut pc = ProviderConfig {
        order: choices
            .providers
            .clone()
            .or(profile.map(|p| p.providers.clone()))
            .unwrap_or(vec![Provider::Cpu]),
        strict: choices.strict_providers,
        ..ProviderConfig::default()
    };
    if let Some(p) = profile {
        if let Some(c) = &p.cuda {
            pc.cuda = CudaConfig {
                memory_limit: (c.memory_limit_gb > 0.0)
                    .then_some((c.memory_limit_gb * GIB) as usize),
                same_as_requested: c.arena_extend_strategy == ArenaExtendStrategy::SameAsRequested,
                cuda_graphs: c.cuda_graphs,
            };
        }
        if let Some(t) = &p.tensorrt {
            pc.trt = trt_config(export, p, t, precision);
        }
        if let Some(t) = &p.tensorrt_rtx {
            pc.trt_rtx = trt_rtx_config(export, p, t);
        }
    }
    if let Some(g) = choices.cuda_graphs {
        pc.cuda.cuda_graphs = g;
    }
    pc
}

/// The TensorRT provider's settings under profile `p` (its `tensorrt` section `t`): the
/// workspace and caches, and each graph's shape range derived from the profile and the model.
fn trt_config(
    export: &Export,
    p: &Profile,
    t: &TensorRtSection,
    precision: Precision,
) -> TrtConfig {
    let model = &export.dir;
    let mut trt = TrtConfig {
        workspace: Some((t.workspace_gb * GIB) as usize),
        engine_cache: Some(t.engine_cache_path(model)),
        timing_cache: Some(t.timing_cache_path(model)),
        builder_optimization_level: Some(t.builder_optimization_level),
        fp16: t.fp16,
        shapes: Default::default(),
    };
    let s = trt_shapes(p, &ModelDims::from_config(export.config()));
    for (part, r) in [
        (graph::VISION, s.vision_encoder),
        (graph::EMBED, s.embed_tokens),
        (graph::DECODER_MERGED, s.decoder),
    ] {
        trt.shapes.insert(
            format!("{part}{}", precision.suffix()),
            (r.min, r.opt, r.max),
        );
    }
    trt
}

/// The TensorRT-RTX provider's settings for `export` under profile `p`: shape ranges for
/// engines the provider builds itself, and the prebuilt engines when they match (else one
/// log line says why they are not used).
fn trt_rtx_config(export: &Export, p: &Profile, t: &TensorRtRtxSection) -> TrtRtxConfig {
    let model = &export.dir;
    let mut c = TrtRtxConfig {
        runtime_cache: Some(model.join(&t.runtime_cache_dir)),
        cuda_graphs: t.cuda_graphs,
        workspace: (t.workspace_gb > 0.0).then_some((t.workspace_gb * GIB) as usize),
        ..Default::default()
    };
    let m = &export.manifest;
    let Ok(spec) = engines::BuildSpec::new(m, p) else {
        // Not a --target tensorrt export (or not this precision): the model loader says so.
        return c;
    };
    for g in &spec.graphs {
        c.shapes.insert(
            g.stem.clone(),
            (g.min.clone(), g.opt.clone(), g.max.clone()),
        );
    }
    let runtime = trtrtx::plugin_library()
        .ok()
        .and_then(|l| trtrtx::bundled_version(&l));
    let set = m.engines.get(&p.name);
    match engines::check(set, &spec, runtime.as_deref(), model) {
        Ok(()) => {
            let set = set.expect("a matching set exists");
            c.engines = engines::context_models(set, &spec, model)
                .into_iter()
                .collect();
        }
        Err(why) => {
            if p.providers.first() == Some(&Provider::TensorRtRtx) {
                tracing::info!("tensorrt-rtx: prebuilt engines not used: {why}; the provider builds them when a session starts");
            }
        }
    }
    c
}

/// The profile's precision, or, when the export lacks it, the exported precision closest to
/// it (same activation type first: int4 → fp32, int4-fp16 → fp16; then 16-bit before 32-bit
/// on a GPU profile), with the line saying so. A quick-start export (fp32, fp16) thus runs
/// under every profile.
pub fn profile_precision(p: &Profile, export: &Export) -> (Precision, Option<String>) {
    let have = &export.manifest.precisions;
    if have.contains(&p.precision) || have.is_empty() {
        return (p.precision, None);
    }
    let chosen = closest_precision(p, have);
    let notice = format!(
        "ocrctl: profile {} wants {}, which {} was not exported with (it has {}); using {} \
         (--precision chooses; export --precision {} for the profile's own)",
        p.name,
        p.precision.name(),
        export.dir.display(),
        have.iter().map(|x| x.name()).collect::<Vec<_>>().join(", "),
        chosen.name(),
        p.precision.name()
    );
    (chosen, Some(notice))
}

/// The first of `have` in the order of preference of [`profile_precision`].
fn closest_precision(p: &Profile, have: &[Precision]) -> Precision {
    let gpu = p.providers.iter().any(|x| *x != Provider::Cpu);
    let order: &[Precision] = match (p.precision, gpu) {
        (Precision::Int4, _) => &[Precision::Fp32, Precision::Int4Fp16, Precision::Fp16],
        (Precision::Int4Fp16, _) => &[Precision::Fp16, Precision::Int4, Precision::Fp32],
        (_, true) => &[
            Precision::Fp16,
            Precision::Int4Fp16,
            Precision::Fp32,
            Precision::Int4,
        ],
        (_, false) => &[
            Precision::Fp32,
            Precision::Int4,
            Precision::Fp16,
            Precision::Int4Fp16,
        ],
    };
    order
        .iter()
        .copied()
        .find(|x| have.contains(x))
        .unwrap_or(have[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_precision_gives_way_to_the_closest_exported_one() {
        let (cpu, gpu) = (
            Profile::load("cpu").unwrap(),
            Profile::load("16gb").unwrap(),
        );
        let quick = [Precision::Fp32, Precision::Fp16];
        assert_eq!(closest_precision(&cpu, &quick), Precision::Fp32);
        assert_eq!(closest_precision(&gpu, &quick), Precision::Fp16);
        let int4 = Profile {
            precision: Precision::Int4,
            ..cpu
        };
        assert_eq!(
            closest_precision(&int4, &[Precision::Fp16]),
            Precision::Fp16
        );
        assert_eq!(closest_precision(&int4, &quick), Precision::Fp32);
    }
}
