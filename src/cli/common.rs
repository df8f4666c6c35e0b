//! Command-line options shared by the commands that run a model (`ocr`, `bench`).
//!
//! `--profile NAME|PATH` (see `ocrctl profiles list`) sets the precision, providers and their
//! options (CUDA arena, TensorRT workspace, caches and min/opt/max shapes), CPU threads,
//! batch size and token limits; explicit flags override it ([`ocrctl::runtime::policy`] makes
//! the two into load options). `--model` is opened once ([`open_export`]) and the
//! [`Export`] handed to everything that runs it.

use anyhow::Context;
use clap::Args;
use ocrctl::model::export::{Export, OpenError};
use ocrctl::profile::Profile;
use ocrctl::runtime::ortmodel::LoadOptions;
use ocrctl::runtime::policy::{self, RuntimeChoices};
use ocrctl::runtime::providers::Provider;
use ocrctl_exporters::export::{DecoderVariant, Precision};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
    /// Execution providers in order of preference, comma-separated (default: the profile's,
    /// else cpu).
    #[arg(long, env = "OCRCTL_PROVIDERS", value_delimiter = ',', value_parser = ProviderParser)]
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
    #[arg(long, env = "OCRCTL_CUDA_GRAPHS", value_parser = OnOff)]
    pub cuda_graphs: Option<bool>,
    /// Encode pages' images on a thread of their own while the batch decodes (`on`/`off`;
    /// GPU providers only).
    #[arg(long, env = "OCRCTL_VISION_STAGE", default_value = "on", action = clap::ArgAction::Set,
        value_parser = OnOff)]
    pub vision_stage: bool,
    /// With the vision stage and the GQA decoder, also prefill pages on the stage's thread
    /// with a second decoder session, so prompts do not stall decode steps (`on`/`off`; costs
    /// a second copy of the decoder's weights in GPU memory; measured no throughput gain on an
    /// H200: docs/manual/gpu.md).
    #[arg(long, env = "OCRCTL_PREFILL_STAGE", default_value = "off", action = clap::ArgAction::Set,
        value_parser = OnOff)]
    pub prefill_stage: bool,
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

/// `--providers`' values: the names of [`Provider::ALL`], so that `--help` lists what the
/// parser takes (`trt-rtx` and `trt` are accepted too, unlisted).
#[derive(Clone)]
struct ProviderParser;

impl clap::builder::TypedValueParser for ProviderParser {
    type Value = Provider;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Provider, clap::Error> {
        let name = value.to_string_lossy();
        match Provider::parse(name.trim()) {
            Some(p) => Ok(p),
            // clap's own message: the value and the possible values.
            None => Err(invalid(cmd, arg, value, Provider::ALL.map(Provider::name))),
        }
    }

    fn possible_values(
        &self,
    ) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
        Some(Box::new(
            Provider::ALL
                .iter()
                .map(|p| clap::builder::PossibleValue::new(p.name())),
        ))
    }
}

/// clap's error for a `value` not among `names`: the value, the option and the possible values.
fn invalid<const N: usize>(
    cmd: &clap::Command,
    arg: Option<&clap::Arg>,
    value: &std::ffi::OsStr,
    names: [&'static str; N],
) -> clap::Error {
    use clap::builder::TypedValueParser;
    match clap::builder::PossibleValuesParser::new(names).parse_ref(cmd, arg, value) {
        Err(e) => e,
        // Only called for values the parser refused, which none of `names` is.
        Ok(_) => clap::Error::new(clap::error::ErrorKind::InvalidValue).with_cmd(cmd),
    }
}

/// An `on`/`off` switch. `--help` lists `on, off` (clap's `BoolishValueParser` lists
/// `true, false`); the values it takes are still all of its (`true`, `yes`, `1`, …).
#[derive(Clone)]
pub struct OnOff;

impl clap::builder::TypedValueParser for OnOff {
    type Value = bool;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<bool, clap::Error> {
        clap::builder::BoolishValueParser::new()
            .parse_ref(cmd, arg, value)
            .map_err(|_| invalid(cmd, arg, value, ["on", "off"]))
    }

    fn possible_values(
        &self,
    ) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
        Some(Box::new(
            ["on", "off"]
                .into_iter()
                .map(clap::builder::PossibleValue::new),
        ))
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

    /// The profile and the explicit choices of these flags, checked (before any export is
    /// read, so that a wrong flag is named first).
    fn resolve(&self) -> anyhow::Result<(Option<Profile>, RuntimeChoices)> {
        let profile = self.profile()?;
        let precision = match &self.precision {
            Some(p) => Some(Precision::parse(p).context("--precision")?),
            None => None,
        };
        let choices = RuntimeChoices {
            precision,
            providers: self.providers.clone(),
            strict_providers: self.strict_providers,
            threads: self.threads,
            ort_lib: self.ort_lib.clone(),
            accuracy_level: self.accuracy_level,
            decoder: self.decoder,
            kv_cache_gb: self.kv_cache_gb,
            verify: !self.no_verify,
            cuda_graphs: self.cuda_graphs,
            vision_stage: self.vision_stage,
            prefill_stage: self.prefill_stage,
        };
        Ok((profile, choices))
    }

    /// Checks these flags, opens the export in `model` (once: the value goes to every part
    /// that runs it) and returns its load options, the profile and the export.
    pub fn open(
        &self,
        model: &Path,
    ) -> anyhow::Result<(LoadOptions, Option<Profile>, Arc<Export>)> {
        let (profile, choices) = self.resolve()?;
        let export = open_export(model)?;
        let lo = options_for(&export, profile.as_ref(), &choices);
        Ok((lo, profile, export))
    }

    /// The load options these flags (and the profile) describe for an opened `export`.
    pub fn load_options(&self, export: &Export) -> anyhow::Result<(LoadOptions, Option<Profile>)> {
        let (profile, choices) = self.resolve()?;
        let lo = options_for(export, profile.as_ref(), &choices);
        Ok((lo, profile))
    }
}

/// The library's load options for `export`, saying in one line when the profile's precision
/// was not exported and another is used.
fn options_for(
    export: &Export,
    profile: Option<&Profile>,
    choices: &RuntimeChoices,
) -> LoadOptions {
    let (lo, notice) = policy::load_options(export, profile, choices);
    if let Some(n) = notice {
        eprintln!("{n}");
    }
    lo
}

/// Opens the export `--model` names; a folder that is not one is named with the flag.
pub fn open_export(model: &Path) -> anyhow::Result<Arc<Export>> {
    match Export::open(model) {
        Ok(e) => Ok(Arc::new(e)),
        Err(OpenError::Manifest(e)) => {
            Err(anyhow::Error::new(e).context(format!("--model {}", model.display())))
        }
        Err(e) => Err(e.into()),
    }
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

    /// `--help` lists `on, off` for the switches and every provider by name; the switches
    /// still take clap's other boolean words, the providers their short names.
    #[test]
    fn help_lists_the_values_the_parsers_take() {
        use clap::CommandFactory;
        let help = Cli::command().render_long_help().to_string();
        assert!(!help.contains("true, false"), "{help}");
        assert_eq!(
            help.matches("[possible values: on, off]").count(),
            3,
            "{help}"
        );
        assert!(
            help.contains("[possible values: tensorrt-rtx, tensorrt, cuda, cpu]"),
            "{help}"
        );
        let rt = Cli::try_parse_from(["t", "--vision-stage", "false", "--cuda-graphs", "yes"])
            .unwrap()
            .rt;
        assert!(!rt.vision_stage);
        assert_eq!(rt.cuda_graphs, Some(true));
        let rt = Cli::try_parse_from(["t", "--providers", "trt-rtx, cuda,cpu"])
            .unwrap()
            .rt;
        use ocrctl::runtime::providers::Provider;
        assert_eq!(
            rt.providers,
            Some(vec![Provider::TensorRtRtx, Provider::Cuda, Provider::Cpu])
        );
        for (flag, bad, listed) in [
            ("--prefill-stage", "maybe", "[possible values: on, off]"),
            (
                "--providers",
                "rocm",
                "[possible values: tensorrt-rtx, tensorrt, cuda, cpu]",
            ),
        ] {
            let e = Cli::try_parse_from(["t", flag, bad])
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains(&format!("invalid value '{bad}'")), "{e}");
            assert!(e.contains(listed), "{e}");
        }
    }
}
