//! Command-line options shared by the commands that run a model (`ocr`, `bench`).
//!
//! `--profile NAME|PATH` (see `ocrctl profiles list`) sets the precision, providers and their
//! options (CUDA arena, TensorRT workspace, caches and min/opt/max shapes), CPU threads,
//! batch size and token limits; explicit flags override it.

use anyhow::Context;
use clap::Args;
use ocrctl::profile::{trt_shapes, ArenaExtendStrategy, ModelDims, Profile};
use ocrctl::runtime::ortmodel::LoadOptions;
use ocrctl::runtime::providers::{CudaConfig, Provider, ProviderConfig, TrtConfig};
use ocrctl_exporters::contract::graph;
use ocrctl_exporters::export::{DecoderVariant, Manifest, Precision};
use std::path::{Path, PathBuf};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// How to run an exported model.
#[derive(Args, Debug, Clone)]
pub struct RuntimeArgs {
    /// Hardware profile (`16gb`, `24gb`, `80gb`, `cpu`, or a YAML file). Default, without
    /// --providers: the largest built-in one the first GPU's memory holds, else none (CPU).
    #[arg(long, env = "OCRCTL_PROFILE")]
    pub profile: Option<String>,
    /// Which exported graphs to run: fp32, fp16, int4 or int4-fp16 (default: the
    /// profile's, else fp32).
    #[arg(long, env = "OCRCTL_PRECISION")]
    pub precision: Option<String>,
    /// Execution providers in order of preference: tensorrt-rtx, tensorrt, cuda, cpu
    /// (default: the profile's, else cpu).
    #[arg(long, env = "OCRCTL_PROVIDERS", value_delimiter = ',', value_parser = parse_provider)]
    pub providers: Option<Vec<Provider>>,
    /// Fail instead of falling back when a listed provider is unavailable.
    #[arg(long, env = "OCRCTL_STRICT_PROVIDERS")]
    pub strict_providers: bool,
    /// ONNX Runtime intra-op threads (0 = all cores; default: the profile's).
    #[arg(long, env = "OCRCTL_THREADS")]
    pub threads: Option<usize>,
    /// Path of libonnxruntime.so (default: found automatically: docs/manual/setup.md).
    #[arg(long, env = "OCRCTL_ORT_LIB")]
    pub ort_lib: Option<PathBuf>,
    /// `session.qdq_matmulnbits_accuracy_level` for int4 graphs on the CPU: 0 computes in
    /// float, 4 (ONNX Runtime's default) quantizes activations to int8.
    #[arg(long, env = "OCRCTL_ACCURACY_LEVEL", default_value_t = 4, value_parser = clap::value_parser!(u8).range(0..=4))]
    pub accuracy_level: u8,
    /// Decoder graph to run: `gqa` (a KV slot of max_sequence_length per page, updated in
    /// place; the default when the export has it), `paged` (CUDA only: KV blocks taken as
    /// pages grow, from a pool of --kv-cache-gb, so pages in flight follow memory) or
    /// `merged`.
    #[arg(long, env = "OCRCTL_DECODER", value_parser = parse_decoder)]
    pub decoder: Option<DecoderVariant>,
    /// GiB of the paged decoder's KV block pool (default: the profile's `kv_cache_gb`, else
    /// what --batch-size pages of max_sequence_length take).
    #[arg(long, env = "OCRCTL_KV_CACHE_GB", value_parser = parse_gib)]
    pub kv_cache_gb: Option<f64>,
    /// Skip checking the export's files against the sha256 digests in its ocrctl.json.
    #[arg(long, env = "OCRCTL_NO_VERIFY")]
    pub no_verify: bool,
    /// CUDA graphs for the GQA decoder's decode steps (`on`/`off`; default: the profile's
    /// `cuda.cuda_graphs`, else off).
    #[arg(long, env = "OCRCTL_CUDA_GRAPHS", value_parser = clap::builder::BoolishValueParser::new())]
    pub cuda_graphs: Option<bool>,
    /// Encode pages' images on a thread of their own while the batch decodes (`on`/`off`;
    /// GPU providers only).
    #[arg(long, env = "OCRCTL_VISION_STAGE", default_value = "on", action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new())]
    pub vision_stage: bool,
    /// With the vision stage and the GQA decoder, also prefill pages on the stage's thread
    /// with a second decoder session, so prompts do not stall decode steps (`on`/`off`; costs
    /// a second copy of the decoder's weights in GPU memory; measured no throughput gain on an
    /// H200: docs/manual/gpu.md).
    #[arg(long, env = "OCRCTL_PREFILL_STAGE", default_value = "off", action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new())]
    pub prefill_stage: bool,
}

/// The profile's precision, or, when the export in `model` lacks it and `--precision` was not
/// given, the exported precision closest to it (same activation type first: int4 → fp32,
/// int4-fp16 → fp16; then 16-bit before 32-bit on a GPU profile), with one line saying so. A
/// quick-start export (fp32, fp16) thus runs under every profile.
fn profile_precision(p: &Profile, model: &Path) -> Precision {
    let Ok(m) = Manifest::load(model) else {
        return p.precision; // the load reports what is wrong with the folder
    };
    if m.precisions.contains(&p.precision) || m.precisions.is_empty() {
        return p.precision;
    }
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
    let chosen = order
        .iter()
        .copied()
        .find(|x| m.precisions.contains(x))
        .unwrap_or(m.precisions[0]);
    eprintln!(
        "ocrctl: profile {} wants {}, which {} was not exported with (it has {}); using {} \
         (--precision chooses; export --precision {} for the profile's own)",
        p.name,
        p.precision.name(),
        model.display(),
        m.precisions
            .iter()
            .map(|x| x.name())
            .collect::<Vec<_>>()
            .join(", "),
        chosen.name(),
        p.precision.name()
    );
    chosen
}

/// One `--logit-bias` entry: `ID=BIAS` (a token id and the bias added to its logit, -100
/// to 100; the range is checked with the other sampling parameters).
pub fn parse_logit_bias(s: &str) -> Result<(u32, f32), String> {
    let (id, bias) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not ID=BIAS (e.g. 151645=-100)"))?;
    let id = id
        .trim()
        .parse()
        .map_err(|_| format!("`{id}` in `{s}` is not a token id"))?;
    let bias = bias
        .trim()
        .parse()
        .map_err(|_| format!("`{bias}` in `{s}` is not a number"))?;
    Ok((id, bias))
}

fn parse_gib(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(g) if g.is_finite() && g > 0.0 => Ok(g),
        _ => Err(format!("`{s}` is not a positive number of GiB")),
    }
}

fn parse_decoder(s: &str) -> Result<DecoderVariant, String> {
    DecoderVariant::parse(s).map_err(|e| e.to_string())
}

fn parse_provider(s: &str) -> Result<Provider, String> {
    match s.trim() {
        "tensorrt-rtx" | "trt-rtx" => Ok(Provider::TensorRtRtx),
        "tensorrt" | "trt" => Ok(Provider::TensorRt),
        "cuda" => Ok(Provider::Cuda),
        "cpu" => Ok(Provider::Cpu),
        other => Err(format!(
            "unknown provider `{other}` (expected tensorrt-rtx, tensorrt, cuda or cpu)"
        )),
    }
}

/// The built-in profile this machine's first GPU holds, chosen once and said in one line.
pub fn auto_profile() -> Option<&'static str> {
    static CHOICE: std::sync::OnceLock<Option<&'static str>> = std::sync::OnceLock::new();
    *CHOICE.get_or_init(|| {
        let (name, gib) = ocrctl::profile::auto::for_this_machine()?;
        eprintln!(
            "ocrctl: no --profile given; GPU 0 has {gib:.1} GiB: using the {name} profile \
             (--profile NAME or --providers cpu to choose)"
        );
        Some(name)
    })
}

impl RuntimeArgs {
    /// The profile: `--profile`'s, else (without `--providers`) the one this machine's GPU
    /// holds ([`auto_profile`]), else none (the CPU).
    pub fn profile(&self) -> anyhow::Result<Option<Profile>> {
        let name = match (&self.profile, &self.providers) {
            (Some(p), _) => p.as_str(),
            (None, None) => match auto_profile() {
                Some(p) => p,
                None => return Ok(None),
            },
            (None, Some(_)) => return Ok(None),
        };
        Profile::load(name)
            .map(Some)
            .with_context(|| format!("--profile {name}"))
    }

    /// The load options these flags (and the profile) describe for the export in `model`.
    pub fn load_options(&self, model: &Path) -> anyhow::Result<(LoadOptions, Option<Profile>)> {
        let profile = self.profile()?;
        let precision = match (&self.precision, &profile) {
            (Some(p), _) => Precision::parse(p).context("--precision")?,
            (None, Some(pr)) => profile_precision(pr, model),
            (None, None) => Precision::Fp32,
        };
        let mut lo = LoadOptions::new(precision);
        lo.ort_lib = self.ort_lib.clone();
        lo.accuracy_level = self.accuracy_level;
        lo.verify = !self.no_verify;
        lo.decoder = self.decoder;
        if let Some(p) = &profile {
            lo.kv_slots = p.max_batch_size.max(1) as usize;
            lo.max_sequence_length = p.max_sequence_length as usize;
            lo.kv_cache_bytes = (p.kv_cache_gb > 0.0).then_some((p.kv_cache_gb * GIB) as usize);
        }
        if let Some(g) = self.kv_cache_gb {
            lo.kv_cache_bytes = Some((g * GIB) as usize);
        }
        lo.threads = self
            .threads
            .or(profile
                .as_ref()
                .and_then(|p| p.cpu.as_ref())
                .map(|c| c.threads as usize))
            .unwrap_or(0);
        let mut pc = ProviderConfig {
            order: self
                .providers
                .clone()
                .or(profile.as_ref().map(|p| p.providers.clone()))
                .unwrap_or(vec![Provider::Cpu]),
            strict: self.strict_providers,
            ..ProviderConfig::default()
        };
        if let Some(p) = &profile {
            if let Some(c) = &p.cuda {
                pc.cuda = CudaConfig {
                    memory_limit: (c.memory_limit_gb > 0.0)
                        .then_some((c.memory_limit_gb * GIB) as usize),
                    same_as_requested: c.arena_extend_strategy
                        == ArenaExtendStrategy::SameAsRequested,
                    cuda_graphs: c.cuda_graphs,
                };
            }
            if let Some(t) = &p.tensorrt {
                let mut trt = TrtConfig {
                    workspace: Some((t.workspace_gb * GIB) as usize),
                    engine_cache: Some(t.engine_cache_path(model)),
                    timing_cache: Some(t.timing_cache_path(model)),
                    builder_optimization_level: Some(t.builder_optimization_level),
                    fp16: t.fp16,
                    shapes: Default::default(),
                };
                if let Ok(m) = Manifest::load(model) {
                    let s = trt_shapes(p, &ModelDims::from_config(&m.model));
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
                }
                pc.trt = trt;
            }
            if let Some(t) = &p.tensorrt_rtx {
                pc.trt_rtx = trt_rtx_config(model, p, t);
            }
        }
        if let Some(g) = self.cuda_graphs {
            pc.cuda.cuda_graphs = g;
        }
        lo.providers = pc;
        lo.vision_stage = self.vision_stage;
        lo.prefill_stage = self.prefill_stage;
        Ok((lo, profile))
    }
}

/// The TensorRT-RTX provider's settings for `model` under profile `p`: shape ranges for
/// engines the provider builds itself, and the prebuilt engines when they match (else one
/// log line says why they are not used).
fn trt_rtx_config(
    model: &Path,
    p: &Profile,
    t: &ocrctl::profile::TensorRtRtxSection,
) -> ocrctl::runtime::trtrtx::TrtRtxConfig {
    use ocrctl::runtime::trtrtx::{self, engines};
    let mut c = trtrtx::TrtRtxConfig {
        runtime_cache: Some(model.join(&t.runtime_cache_dir)),
        cuda_graphs: t.cuda_graphs,
        workspace: (t.workspace_gb > 0.0).then_some((t.workspace_gb * GIB) as usize),
        ..Default::default()
    };
    let Ok(m) = Manifest::load(model) else {
        return c;
    };
    let Ok(spec) = engines::BuildSpec::new(&m, p) else {
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

/// An error and its causes on one line, each cause once: errors that already print their
/// cause (`path: No such file or directory`) are not followed by it a second time.
pub fn describe(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !out.contains(&c) {
            out.push_str(": ");
            out.push_str(&c);
        }
    }
    out
}

/// `WIDTHxHEIGHT` of option `flag` (`--sizes`, `--warm-up`) in pixels.
pub fn parse_size(flag: &str, s: &str) -> anyhow::Result<(u32, u32)> {
    use anyhow::Context;
    let (w, h) = s
        .split_once('x')
        .with_context(|| format!("{flag}: `{s}` is not WIDTHxHEIGHT"))?;
    let dim = |v: &str, what: &str| -> anyhow::Result<u32> {
        match v.trim().parse::<u32>() {
            Ok(n) if n > 0 => Ok(n),
            _ => anyhow::bail!("{flag}: {what} in `{s}` is not a positive whole number"),
        }
    };
    Ok((dim(w, "width")?, dim(h, "height")?))
}

#[cfg(test)]
mod tests {
    use super::RuntimeArgs;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        rt: RuntimeArgs,
    }

    #[test]
    fn switches_take_on_and_off_and_default_as_documented() {
        let rt = Cli::try_parse_from(["t"]).unwrap().rt;
        assert!(rt.vision_stage && !rt.prefill_stage);
        assert_eq!(rt.cuda_graphs, None);
        let rt = Cli::try_parse_from(["t", "--prefill-stage", "on"])
            .unwrap()
            .rt;
        assert!(rt.vision_stage && rt.prefill_stage);
        let rt = Cli::try_parse_from(["t", "--vision-stage", "off", "--cuda-graphs", "on"])
            .unwrap()
            .rt;
        assert!(!rt.vision_stage);
        assert_eq!(rt.cuda_graphs, Some(true));
        let rt = Cli::try_parse_from(["t", "--vision-stage", "on"])
            .unwrap()
            .rt;
        assert!(rt.vision_stage);
        assert!(Cli::try_parse_from(["t", "--vision-stage", "maybe"]).is_err());
    }
}
