//! Hardware profiles: what one machine may run, read from YAML, and the memory it needs.
//!
//! A profile (`profiles/16gb.yaml`, `24gb.yaml`, `80gb.yaml`, `cpu.yaml`) bounds everything
//! that costs memory: batch size, image side, sequence length (prompt + output), the KV-cache
//! budget, the TensorRT workspace and the CUDA arena. Three things live here:
//!
//! - [`Profile`]: the schema (serde, unknown fields rejected) and [`Profile::validate`], whose
//!   errors name the file, the field and the reason ([`ProfileError`]).
//! - [`trt_shapes`]: the TensorRT EP's `trt_profile_{min,opt,max}_shapes` strings, derived
//!   from the profile and the model's dimensions ([`ModelDims`]), never written by hand.
//! - [`budget`]: a memory calculator (weights, KV cache, activations, workspace, runtime
//!   overhead) whose [`Budget`] says whether the profile fits a device, prints as a table, and
//!   names what to lower when it does not ([`Budget::advice`]).
//!
//! # Finding a profile
//!
//! [`Profile::load`] takes a name or a path. An argument containing `/` (or `\`) or ending
//! in `.yaml`/`.yml` is a path, read as is. Anything else is a name, resolved in this order:
//!
//! 1. `$OCRCTL_PROFILES_DIR/<name>.yaml` (an explicit override, even of a built-in name);
//! 2. the built-in profiles embedded in the binary (`16gb`, `24gb`, `80gb`, `cpu`), so they
//!    work from any directory and always match the binary;
//! 3. `<name>.yaml` in a `profiles/` folder of any ancestor of the executable (a checkout's
//!    `target/debug/ocrctl` finds the checkout's `profiles/`), then `./profiles/`.
//!
//! To load a file of the current directory that shares a built-in's name, write a path
//! (`./16gb.yaml`).
//!
//! # Units
//!
//! Every `*_gb` field is GiB (2^30 bytes, what `nvidia-smi` reports in MiB divided by 1024);
//! `max_body_mb` is MiB.

use ocrctl_exporters::config::ModelConfig;
use ocrctl_exporters::export::{Manifest, Precision, MANIFEST};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};

/// The built-in profiles, embedded at build time: `(name, YAML text)`.
pub const BUILTIN: &[(&str, &str)] = &[
    ("16gb", include_str!("../profiles/16gb.yaml")),
    ("24gb", include_str!("../profiles/24gb.yaml")),
    ("80gb", include_str!("../profiles/80gb.yaml")),
    ("cpu", include_str!("../profiles/cpu.yaml")),
];

/// Environment variable naming a folder searched first for `<name>.yaml`.
pub const PROFILES_DIR_ENV: &str = "OCRCTL_PROFILES_DIR";

/// Largest image side the model accepts (the preprocessor caps the longest side at 1540 px).
pub const MAX_IMAGE_SIDE: u32 = 1540;

/// Image sides are multiples of this (patch 14 × spatial merge 2).
pub const IMAGE_SIDE_UNIT: u32 = 28;

/// Chat-template tokens around the image placeholder: LightOnOCR-2-1B's template renders
/// 12 (`<|im_start|>system<|im_end|>\n<|im_start|>user\n` … `<|im_end|>\n<|im_start|>assistant\n`),
/// rounded up for templates that add a few.
pub const PROMPT_TOKENS: u64 = 16;

/// Device memory the CUDA runtime takes before any tensor: the context, ONNX Runtime's CUDA
/// EP cuBLAS/cuBLASLt and cuDNN handles and their workspaces (measured contexts are
/// 300-500 MiB on recent GPUs; this rounds up).
pub const CUDA_RUNTIME_BYTES: u64 = 512 * MIB;

/// Extra device memory when TensorRT is loaded: its own cuBLAS and cuDNN initialisation
/// (TensorRT logs about +222 MiB for cuBLAS/cuBLASLt and +172 MiB for cuDNN).
pub const TENSORRT_RUNTIME_BYTES: u64 = 384 * MIB;

/// Host memory of the process besides weights and tensors on a CPU-only profile: ONNX
/// Runtime, the tokenizer, image decoding buffers.
pub const CPU_RUNTIME_BYTES: u64 = 256 * MIB;

/// Share of the device memory left unplanned: allocator rounding and fragmentation, the
/// display or other processes. A profile fits when its total stays below the rest.
pub const MIN_HEADROOM_FRACTION: f64 = 0.05;

/// Activation tensors of width `hidden` alive at the peak of an encoder/decoder layer
/// (residual, normed input, q, k, v, attention output).
const HIDDEN_COPIES: u64 = 6;

/// Activation tensors of the MLP's intermediate width alive at once (gate, up, product).
const MLP_COPIES: u64 = 3;

/// Bytes per element of unfused attention scores: the exported graphs compute scores and
/// softmax in float32 and both are alive at once.
const SCORE_BYTES: u64 = 8;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Everything that can be wrong with a profile, or with the export it is checked against.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The profile file could not be read.
    #[error("{file}: cannot read the profile: {error}")]
    Read {
        file: PathBuf,
        error: std::io::Error,
    },
    /// A bare name that is neither a built-in nor a file in the search folders.
    #[error(
        "profile `{name}` not found: it is not a built-in ({builtins}) and no `{name}.yaml` \
         is in {searched} (give a path to load another file)"
    )]
    NotFound {
        name: String,
        builtins: String,
        searched: String,
    },
    /// Not YAML, or not the schema: an unknown field, a wrong type, a missing field.
    #[error("{file}: {message}")]
    Schema { file: String, message: String },
    /// A value the schema accepts but that is impossible or inconsistent.
    #[error("{file}: field `{field}`: {reason}")]
    Invalid {
        file: String,
        field: String,
        reason: String,
    },
    /// The export a profile is checked against lacks something.
    #[error("{file}: {reason}")]
    Model { file: PathBuf, reason: String },
}

/// Where a profile came from; shown in every error and in `profiles list`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ProfileSource {
    /// Parsed from a string with no file behind it.
    #[default]
    Inline,
    /// One of [`BUILTIN`], by name.
    BuiltIn(String),
    /// A file on disk.
    File(PathBuf),
}

impl fmt::Display for ProfileSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProfileSource::Inline => write!(f, "<inline profile>"),
            ProfileSource::BuiltIn(n) => write!(f, "built-in profiles/{n}.yaml"),
            ProfileSource::File(p) => write!(f, "{}", p.display()),
        }
    }
}

/// An ONNX Runtime execution provider a profile may list (shared with the runtime).
pub use crate::providers::Provider;

/// How the CUDA EP's memory arena grows (`arena_extend_strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArenaExtendStrategy {
    /// `kNextPowerOfTwo`: fewer, larger extensions; can overshoot a tight budget.
    NextPowerOfTwo,
    /// `kSameAsRequested`: extends by what is asked; the choice for tight budgets.
    SameAsRequested,
}

/// TensorRT EP settings. The min/opt/max shape profiles are derived ([`trt_shapes`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorRtSection {
    /// Builder workspace limit (`trt_max_workspace_size`), GiB.
    pub workspace_gb: f64,
    /// Engine cache folder (`trt_engine_cache_path`); relative to the model directory.
    pub engine_cache_dir: PathBuf,
    /// Timing cache folder (`trt_timing_cache_path`); relative to the model directory.
    pub timing_cache_dir: PathBuf,
    /// `trt_builder_optimization_level`, 0..=5 (below 3 builds faster, runs slower).
    pub builder_optimization_level: u8,
    /// `trt_fp16_enable` (weak typing; TensorRT 10 only, TensorRT 11 ignores it: the graph's
    /// own precision decides there).
    pub fp16: bool,
}

impl TensorRtSection {
    /// The engine cache folder for an export in `model_dir`.
    pub fn engine_cache_path(&self, model_dir: &Path) -> PathBuf {
        model_dir.join(&self.engine_cache_dir)
    }

    /// The timing cache folder for an export in `model_dir`.
    pub fn timing_cache_path(&self, model_dir: &Path) -> PathBuf {
        model_dir.join(&self.timing_cache_dir)
    }
}

/// CUDA EP settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CudaSection {
    /// Arena limit per session (`gpu_mem_limit`), GiB.
    pub memory_limit_gb: f64,
    /// `arena_extend_strategy`.
    pub arena_extend_strategy: ArenaExtendStrategy,
    /// `enable_cuda_graph` (only for fixed shapes).
    pub cuda_graphs: bool,
}

/// CPU EP settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuSection {
    /// Intra-op threads; 0 = all cores.
    pub threads: u32,
}

/// A hardware profile (one YAML file). See the module documentation for how it is found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Short name, `[A-Za-z0-9._-]+` (the file stem for the shipped profiles).
    pub name: String,
    /// One line for `profiles list`.
    pub description: String,
    /// Device memory the profile is sized for, GiB; 0 for a CPU-only profile.
    pub gpu_memory_gb: f64,
    /// Execution providers in order of preference.
    pub providers: Vec<Provider>,
    /// Which graphs of an export to run.
    pub precision: Precision,
    /// Sequences decoded together.
    pub max_batch_size: u32,
    /// Longest image side after preprocessing, px (multiple of 28, at most 1540).
    pub max_image_side: u32,
    /// Prompt + generated tokens of one sequence.
    pub max_sequence_length: u32,
    /// `max_new_tokens` when a request gives none.
    pub default_max_new_tokens: u32,
    /// Largest `max_new_tokens` a request may ask for.
    pub max_new_tokens_limit: u32,
    /// Memory the KV cache of the whole batch may take, GiB.
    pub kv_cache_gb: f64,
    /// Pages one request may carry.
    pub max_images_per_request: u32,
    /// HTTP request body limit, MiB.
    pub max_body_mb: u32,
    /// Requests waiting for a batch slot before new ones are refused (0: refuse when full).
    pub queue_size: u32,
    /// Memory the server may spend decoding request images at once, MiB (a decode takes up
    /// to 11 bytes a pixel; one larger than this runs alone). Default 1024.
    #[serde(default = "default_decode_memory_mb")]
    pub decode_memory_mb: u32,
    /// TensorRT EP settings (required when `providers` lists `tensorrt`).
    #[serde(default)]
    pub tensorrt: Option<TensorRtSection>,
    /// CUDA EP settings (required when `providers` lists `cuda`).
    #[serde(default)]
    pub cuda: Option<CudaSection>,
    /// CPU EP settings (required when `providers` lists `cpu`).
    #[serde(default)]
    pub cpu: Option<CpuSection>,
    /// Where the profile was read from (not part of the YAML).
    #[serde(skip)]
    pub source: ProfileSource,
}

fn default_decode_memory_mb() -> u32 {
    1024
}

/// Whether an argument names a file rather than a profile.
fn looks_like_path(s: &str) -> bool {
    s.contains('/') || s.contains('\\') || s.ends_with(".yaml") || s.ends_with(".yml")
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && !s.starts_with('.')
}

/// The YAML text of a built-in profile.
pub fn builtin(name: &str) -> Option<&'static str> {
    BUILTIN.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

fn env_dir() -> Option<PathBuf> {
    std::env::var_os(PROFILES_DIR_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// `profiles/` folders of the executable's ancestors, then `./profiles`.
fn fallback_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        for a in exe.ancestors().skip(1) {
            let d = a.join("profiles");
            if d.is_dir() && !dirs.contains(&d) {
                dirs.push(d);
            }
        }
    }
    if let Ok(cwd) = std::env::current_dir() {
        let d = cwd.join("profiles");
        if d.is_dir() && !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    dirs
}

/// Folders searched for `<name>.yaml`, in order (`$OCRCTL_PROFILES_DIR` first; the built-ins
/// are consulted between it and the others).
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = env_dir().into_iter().collect();
    for d in fallback_dirs() {
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    dirs
}

fn read(path: &Path) -> Result<String, ProfileError> {
    std::fs::read_to_string(path).map_err(|e| ProfileError::Read {
        file: path.to_path_buf(),
        error: e,
    })
}

/// Finds a profile by name or path and returns where it is and its YAML text.
pub fn locate(name_or_path: &str) -> Result<(ProfileSource, String), ProfileError> {
    if looks_like_path(name_or_path) {
        let p = PathBuf::from(name_or_path);
        let text = read(&p)?;
        return Ok((ProfileSource::File(p), text));
    }
    let name = name_or_path;
    let not_found = |searched: &[PathBuf]| ProfileError::NotFound {
        name: name.to_string(),
        builtins: BUILTIN
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", "),
        searched: if searched.is_empty() {
            "no profiles folder".to_string()
        } else {
            searched
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        },
    };
    if !valid_name(name) {
        return Err(not_found(&search_dirs()));
    }
    let file = format!("{name}.yaml");
    if let Some(d) = env_dir() {
        let p = d.join(&file);
        if p.is_file() {
            let text = read(&p)?;
            return Ok((ProfileSource::File(p), text));
        }
    }
    if let Some(text) = builtin(name) {
        return Ok((ProfileSource::BuiltIn(name.to_string()), text.to_string()));
    }
    for d in fallback_dirs() {
        let p = d.join(&file);
        if p.is_file() {
            let text = read(&p)?;
            return Ok((ProfileSource::File(p), text));
        }
    }
    Err(not_found(&search_dirs()))
}

/// One entry of [`available`]: a profile name and what loading it gave.
#[derive(Debug)]
pub struct Listed {
    /// The name `Profile::load` resolves.
    pub name: String,
    /// The profile, or why it does not load.
    pub profile: Result<Profile, ProfileError>,
}

/// Every profile loadable by name: the built-ins, then other `*.yaml` files of the search
/// folders in name order. Files that do not parse are listed with their error.
pub fn available() -> Vec<Listed> {
    let mut names: Vec<String> = BUILTIN.iter().map(|(n, _)| n.to_string()).collect();
    let mut extra = Vec::new();
    for d in search_dirs() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.extension().and_then(|x| x.to_str()) != Some("yaml") {
                continue;
            }
            if let Some(stem) = p.file_stem().and_then(|s| s.to_str()) {
                if valid_name(stem)
                    && !names.iter().any(|n| n == stem)
                    && !extra.contains(&stem.to_string())
                {
                    extra.push(stem.to_string());
                }
            }
        }
    }
    extra.sort();
    names.extend(extra);
    names
        .into_iter()
        .map(|name| {
            let profile = Profile::load(&name);
            Listed { name, profile }
        })
        .collect()
}

fn gib_to_bytes(gb: f64) -> u64 {
    // Saturating float→int casts: negative or NaN gives 0, never a panic.
    (gb * GIB as f64).round() as u64
}

impl Profile {
    /// Loads and validates a profile by name or path (see the module documentation).
    pub fn load(name_or_path: &str) -> Result<Profile, ProfileError> {
        let (source, text) = locate(name_or_path)?;
        Profile::parse(&text, source)
    }

    /// Parses and validates YAML text; `source` names it in errors.
    pub fn parse(text: &str, source: ProfileSource) -> Result<Profile, ProfileError> {
        let mut p: Profile = serde_yaml::from_str(text).map_err(|e| ProfileError::Schema {
            file: source.to_string(),
            message: e.to_string(),
        })?;
        p.source = source;
        p.validate()?;
        Ok(p)
    }

    fn invalid(&self, field: &str, reason: impl Into<String>) -> ProfileError {
        ProfileError::Invalid {
            file: self.source.to_string(),
            field: field.to_string(),
            reason: reason.into(),
        }
    }

    /// Whether any listed provider runs on a GPU.
    pub fn uses_gpu(&self) -> bool {
        self.providers.iter().any(|p| p.is_gpu())
    }

    /// Whether `providers` lists `p`.
    pub fn has(&self, p: Provider) -> bool {
        self.providers.contains(&p)
    }

    /// Tokens of the longest prompt: a `max_image_side`² page and the chat template.
    pub fn max_prompt_tokens(&self) -> u64 {
        let per_side = (self.max_image_side / IMAGE_SIDE_UNIT) as u64;
        per_side * per_side + PROMPT_TOKENS
    }

    /// Checks every value and every relation between values; the first problem is returned.
    pub fn validate(&self) -> Result<(), ProfileError> {
        if !valid_name(&self.name) {
            return Err(self.invalid(
                "name",
                format!(
                    "`{}` is not a profile name (letters, digits, `.`, `_`, `-`; not starting with `.`)",
                    self.name
                ),
            ));
        }
        if self.description.trim().is_empty() {
            return Err(self.invalid("description", "is empty"));
        }
        check_gb(self, "gpu_memory_gb", self.gpu_memory_gb, true)?;
        if self.providers.is_empty() {
            return Err(self.invalid(
                "providers",
                "is empty (list one or more of tensorrt, cuda, cpu, in order of preference)",
            ));
        }
        for (i, p) in self.providers.iter().enumerate() {
            if self.providers[..i].contains(p) {
                return Err(self.invalid("providers", format!("`{}` is listed twice", p.name())));
            }
        }
        if self.uses_gpu() && self.gpu_memory_gb == 0.0 {
            let gpu: Vec<&str> = self
                .providers
                .iter()
                .filter(|p| p.is_gpu())
                .map(|p| p.name())
                .collect();
            return Err(self.invalid(
                "gpu_memory_gb",
                format!(
                    "is 0 but providers lists the GPU provider(s) {} (give the GPU memory in GiB, or list only cpu)",
                    gpu.join(", ")
                ),
            ));
        }
        if self.max_batch_size == 0 {
            return Err(self.invalid("max_batch_size", "must be at least 1"));
        }
        if self.max_batch_size > 4096 {
            return Err(self.invalid(
                "max_batch_size",
                format!("{} is more than 4096", self.max_batch_size),
            ));
        }
        if self.max_image_side < IMAGE_SIDE_UNIT || self.max_image_side > MAX_IMAGE_SIDE {
            return Err(self.invalid(
                "max_image_side",
                format!(
                    "{} is outside {IMAGE_SIDE_UNIT}..={MAX_IMAGE_SIDE} (the model's largest input is {MAX_IMAGE_SIDE} px)",
                    self.max_image_side
                ),
            ));
        }
        if !self.max_image_side.is_multiple_of(IMAGE_SIDE_UNIT) {
            return Err(self.invalid(
                "max_image_side",
                format!(
                    "{} is not a multiple of {IMAGE_SIDE_UNIT} (patch 14 × merge 2); use {} or {}",
                    self.max_image_side,
                    self.max_image_side / IMAGE_SIDE_UNIT * IMAGE_SIDE_UNIT,
                    (self.max_image_side / IMAGE_SIDE_UNIT + 1) * IMAGE_SIDE_UNIT
                ),
            ));
        }
        if self.max_sequence_length == 0 {
            return Err(self.invalid("max_sequence_length", "must be at least 1"));
        }
        if self.max_new_tokens_limit == 0 {
            return Err(self.invalid("max_new_tokens_limit", "must be at least 1"));
        }
        if self.default_max_new_tokens == 0 {
            return Err(self.invalid("default_max_new_tokens", "must be at least 1"));
        }
        if self.default_max_new_tokens > self.max_new_tokens_limit {
            return Err(self.invalid(
                "default_max_new_tokens",
                format!(
                    "{} is more than max_new_tokens_limit {}",
                    self.default_max_new_tokens, self.max_new_tokens_limit
                ),
            ));
        }
        if self.max_new_tokens_limit >= self.max_sequence_length {
            return Err(self.invalid(
                "max_new_tokens_limit",
                format!(
                    "{} is not less than max_sequence_length {} (the sequence also holds the prompt)",
                    self.max_new_tokens_limit, self.max_sequence_length
                ),
            ));
        }
        let need = self.max_prompt_tokens() + self.max_new_tokens_limit as u64;
        if (self.max_sequence_length as u64) < need {
            return Err(self.invalid(
                "max_sequence_length",
                format!(
                    "{} cannot hold a {side}×{side} page ({} image + {PROMPT_TOKENS} template tokens) \
                     plus max_new_tokens_limit {}: needs {need}",
                    self.max_sequence_length,
                    self.max_prompt_tokens() - PROMPT_TOKENS,
                    self.max_new_tokens_limit,
                    side = self.max_image_side,
                ),
            ));
        }
        check_gb(self, "kv_cache_gb", self.kv_cache_gb, false)?;
        if self.uses_gpu() && self.kv_cache_gb > self.gpu_memory_gb {
            return Err(self.invalid(
                "kv_cache_gb",
                format!(
                    "{} is more than gpu_memory_gb {}",
                    self.kv_cache_gb, self.gpu_memory_gb
                ),
            ));
        }
        if self.max_images_per_request == 0 {
            return Err(self.invalid("max_images_per_request", "must be at least 1"));
        }
        if self.decode_memory_mb == 0 {
            return Err(self.invalid("decode_memory_mb", "must be at least 1"));
        }
        if self.max_body_mb == 0 {
            return Err(self.invalid("max_body_mb", "must be at least 1"));
        }
        if self.has(Provider::TensorRt) && self.tensorrt.is_none() {
            return Err(self.invalid("tensorrt", "is missing but providers lists tensorrt"));
        }
        if self.has(Provider::Cuda) && self.cuda.is_none() {
            return Err(self.invalid("cuda", "is missing but providers lists cuda"));
        }
        if self.has(Provider::Cpu) && self.cpu.is_none() {
            return Err(self.invalid("cpu", "is missing but providers lists cpu"));
        }
        if let Some(t) = &self.tensorrt {
            check_gb(self, "tensorrt.workspace_gb", t.workspace_gb, false)?;
            if self.uses_gpu() && t.workspace_gb >= self.gpu_memory_gb {
                return Err(self.invalid(
                    "tensorrt.workspace_gb",
                    format!(
                        "{} is not less than gpu_memory_gb {}",
                        t.workspace_gb, self.gpu_memory_gb
                    ),
                ));
            }
            if t.engine_cache_dir.as_os_str().is_empty() {
                return Err(self.invalid("tensorrt.engine_cache_dir", "is empty"));
            }
            if t.timing_cache_dir.as_os_str().is_empty() {
                return Err(self.invalid("tensorrt.timing_cache_dir", "is empty"));
            }
            if t.builder_optimization_level > 5 {
                return Err(self.invalid(
                    "tensorrt.builder_optimization_level",
                    format!("{} is outside 0..=5", t.builder_optimization_level),
                ));
            }
        }
        if let Some(c) = &self.cuda {
            check_gb(self, "cuda.memory_limit_gb", c.memory_limit_gb, false)?;
            if self.uses_gpu() && c.memory_limit_gb > self.gpu_memory_gb {
                return Err(self.invalid(
                    "cuda.memory_limit_gb",
                    format!(
                        "{} is more than gpu_memory_gb {}",
                        c.memory_limit_gb, self.gpu_memory_gb
                    ),
                ));
            }
        }
        if let Some(c) = &self.cpu {
            if c.threads > 4096 {
                return Err(self.invalid(
                    "cpu.threads",
                    format!("{} is more than 4096 (0 means all cores)", c.threads),
                ));
            }
        }
        Ok(())
    }
}

/// A GiB value: finite, not negative, at most 64 TiB; zero only where `zero_ok`.
fn check_gb(p: &Profile, field: &str, v: f64, zero_ok: bool) -> Result<(), ProfileError> {
    if !v.is_finite() {
        return Err(p.invalid(field, format!("{v} is not a finite number of GiB")));
    }
    if v < 0.0 {
        return Err(p.invalid(field, format!("{v} is negative")));
    }
    if v == 0.0 && !zero_ok {
        return Err(p.invalid(field, "must be more than 0 GiB"));
    }
    if v > 65536.0 {
        return Err(p.invalid(field, format!("{v} GiB is implausibly large")));
    }
    Ok(())
}

/// The model dimensions the memory calculator and the TensorRT shapes need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelDims {
    /// Vision encoder width.
    pub vision_hidden: u64,
    /// Vision encoder layers.
    pub vision_layers: u64,
    /// Vision attention heads.
    pub vision_heads: u64,
    /// Vision head dimension.
    pub vision_head_dim: u64,
    /// Vision MLP width.
    pub vision_intermediate: u64,
    /// Patch side, px.
    pub patch: u64,
    /// Largest image side the model was trained for, px.
    pub image_size: u64,
    /// Decoder width (also the width of `inputs_embeds`).
    pub text_hidden: u64,
    /// Decoder layers.
    pub text_layers: u64,
    /// Decoder query heads.
    pub text_heads: u64,
    /// Decoder key/value heads.
    pub text_kv_heads: u64,
    /// Decoder head dimension.
    pub text_head_dim: u64,
    /// Decoder MLP width.
    pub text_intermediate: u64,
    /// Vocabulary size (logits width).
    pub vocab: u64,
    /// Spatial merge of the projector (2: 2×2 patches per image token).
    pub merge: u64,
    /// `max_position_embeddings` of the decoder.
    pub max_positions: u64,
}

impl ModelDims {
    /// LightOnOCR-2-1B (the hub's `config.json`).
    pub const LIGHTONOCR_2_1B: ModelDims = ModelDims {
        vision_hidden: 1024,
        vision_layers: 24,
        vision_heads: 16,
        vision_head_dim: 64,
        vision_intermediate: 4096,
        patch: 14,
        image_size: 1540,
        text_hidden: 1024,
        text_layers: 28,
        text_heads: 16,
        text_kv_heads: 8,
        text_head_dim: 128,
        text_intermediate: 3072,
        vocab: 151936,
        merge: 2,
        max_positions: 16384,
    };

    /// The dimensions of a parsed `config.json` (e.g. an export's manifest).
    pub fn from_config(c: &ModelConfig) -> ModelDims {
        let u = |x: usize| x as u64;
        ModelDims {
            vision_hidden: u(c.vision.hidden_size),
            vision_layers: u(c.vision.num_layers),
            vision_heads: u(c.vision.num_heads),
            vision_head_dim: u(c.vision.head_dim),
            vision_intermediate: u(c.vision.intermediate_size),
            patch: u(c.vision.patch_size),
            image_size: u(c.vision.image_size),
            text_hidden: u(c.text.hidden_size),
            text_layers: u(c.text.num_layers),
            text_heads: u(c.text.num_heads),
            text_kv_heads: u(c.text.num_kv_heads),
            text_head_dim: u(c.text.head_dim),
            text_intermediate: u(c.text.intermediate_size),
            vocab: u(c.text.vocab_size),
            merge: u(c.spatial_merge_size),
            max_positions: u(c.text.max_position_embeddings),
        }
    }

    /// Pixels per image token along one side (patch × merge).
    pub fn image_unit(&self) -> u64 {
        self.patch * self.merge
    }

    /// Image tokens of a preprocessed `h`×`w` image.
    pub fn image_tokens(&self, h: u64, w: u64) -> u64 {
        let a = self.image_unit().max(1);
        (h / a) * (w / a)
    }

    /// Vision patches of a preprocessed `h`×`w` image (before merging).
    pub fn patches(&self, h: u64, w: u64) -> u64 {
        let p = self.patch.max(1);
        (h / p) * (w / p)
    }

    /// KV-cache bytes per token: layers × (key + value) × kv_heads × head_dim × element size.
    pub fn kv_bytes_per_token(&self, elem_bytes: u64) -> u64 {
        mul(&[
            self.text_layers,
            2,
            self.text_kv_heads,
            self.text_head_dim,
            elem_bytes,
        ])
    }
}

fn mul(xs: &[u64]) -> u64 {
    xs.iter().fold(1u64, |a, &x| a.saturating_mul(x))
}

/// Bytes per activation (and KV) element of a precision: 2 for fp16 activations, else 4.
pub fn activation_bytes(p: Precision) -> u64 {
    match p {
        Precision::Fp16 | Precision::Int4Fp16 => 2,
        Precision::Fp32 | Precision::Int4 => 4,
    }
}

/// One graph's `trt_profile_{min,opt,max}_shapes` values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShapeRange {
    /// `trt_profile_min_shapes`.
    pub min: String,
    /// `trt_profile_opt_shapes`.
    pub opt: String,
    /// `trt_profile_max_shapes`.
    pub max: String,
}

/// TensorRT shape profiles for the three graphs of an export.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TrtShapes {
    /// `vision_encoder`: `pixel_values [1, 3, H, W]`.
    pub vision_encoder: ShapeRange,
    /// `embed_tokens`: `input_ids [B, S]`.
    pub embed_tokens: ShapeRange,
    /// `decoder_model_merged`: embeddings, mask, positions and every layer's past.
    pub decoder: ShapeRange,
}

/// An A4 portrait page whose long side is `side`, preprocessed: the short side scaled by
/// 210/297 (floored) and rounded up to a multiple of `unit` (1540 → 1540×1092).
pub fn a4_page(side: u64, unit: u64) -> (u64, u64) {
    let unit = unit.max(1);
    let short = side * 210 / 297;
    let short = short.div_ceil(unit) * unit;
    (side, short.min(side))
}

/// Derives the TensorRT EP's min/opt/max shapes from a profile and the model.
///
/// - Vision (one image per call): min 28×28, opt an A4 page at `max_image_side`
///   (1540×1092), max `max_image_side`².
/// - Embeddings: min `1x1`, opt a decode step of the full batch (`Bx1`), max
///   `B x max_sequence_length`.
/// - Decoder: min batch 1, one new token and an empty past (P = 0, the prefill; TensorRT ≥ 8
///   accepts zero-length dimensions in profiles, and ONNX Runtime GenAI's TensorRT profiles
///   use a zero past minimum too); opt a decode step of the full batch at half the sequence
///   length (decode steps dominate OCR time); max the full batch with S and the mask at
///   `max_sequence_length` (a whole-sequence prefill) and P at `max_sequence_length` − 1 (the
///   last decode step). TensorRT sizes its activation memory for the max shapes.
pub fn trt_shapes(p: &Profile, d: &ModelDims) -> TrtShapes {
    let side = p.max_image_side as u64;
    let (oh, ow) = a4_page(side, d.image_unit());
    let unit = d.image_unit();
    let vision = ShapeRange {
        min: format!("pixel_values:1x3x{unit}x{unit}"),
        opt: format!("pixel_values:1x3x{oh}x{ow}"),
        max: format!("pixel_values:1x3x{side}x{side}"),
    };
    let b = p.max_batch_size as u64;
    let seq = p.max_sequence_length as u64;
    let embed = ShapeRange {
        min: "input_ids:1x1".to_string(),
        opt: format!("input_ids:{b}x1"),
        max: format!("input_ids:{b}x{seq}"),
    };
    let opt_past = seq / 2;
    let decoder = ShapeRange {
        min: decoder_shapes(d, 1, 1, 0, 1),
        opt: decoder_shapes(d, b, 1, opt_past, opt_past + 1),
        max: decoder_shapes(d, b, seq, seq.saturating_sub(1), seq),
    };
    TrtShapes {
        vision_encoder: vision,
        embed_tokens: embed,
        decoder,
    }
}

/// The decoder's shapes for batch `b`, `s` new tokens, a past of `past` tokens and an
/// attention mask of `mask` positions.
fn decoder_shapes(d: &ModelDims, b: u64, s: u64, past: u64, mask: u64) -> String {
    let mut parts = vec![
        format!("inputs_embeds:{b}x{s}x{}", d.text_hidden),
        format!("attention_mask:{b}x{mask}"),
        format!("position_ids:{b}x{s}"),
    ];
    for i in 0..d.text_layers {
        for kind in ["key", "value"] {
            parts.push(format!(
                "past_key_values.{i}.{kind}:{b}x{}x{past}x{}",
                d.text_kv_heads, d.text_head_dim
            ));
        }
    }
    parts.join(",")
}

/// One line of a [`Budget`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BudgetRow {
    /// What the memory is for.
    pub item: String,
    /// Bytes.
    pub bytes: u64,
    /// How the figure was obtained.
    pub detail: String,
}

/// Assumptions of [`budget_with`] that depend on the export and the engine, not the profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetOptions {
    /// The decoder's `present.*` outputs are new tensors next to the `past_key_values.*`
    /// inputs (a Concat-based graph, as exported today), so one step holds the KV cache
    /// twice. False for a decoder that updates a shared past/present buffer in place.
    pub kv_step_copy: bool,
    /// Requests prefilled together (the engine prefills one request at a time and then
    /// joins it to the decode batch: 1).
    pub prefill_batch: u64,
    /// The vision encoder's attention runs fused (no patches² score tensors):
    /// `com.microsoft.MultiHeadAttention` in `--target ort` exports, or TensorRT's own fusion.
    /// False counts the unfused scores of one layer.
    pub vision_attention_fused: bool,
}

impl Default for BudgetOptions {
    fn default() -> Self {
        BudgetOptions {
            kv_step_copy: true,
            prefill_batch: 1,
            vision_attention_fused: true,
        }
    }
}

/// A reason a profile does not fit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Problem {
    /// The total exceeds the device memory less the headroom.
    Memory { total: u64, usable: u64 },
    /// The batch's KV cache at full length exceeds `kv_cache_gb`.
    KvBudget { need: u64, budget: u64 },
    /// What ONNX Runtime allocates exceeds `cuda.memory_limit_gb`.
    Arena { need: u64, limit: u64 },
    /// `max_sequence_length` exceeds the decoder's position table.
    Positions { length: u64, max: u64 },
    /// `max_image_side` exceeds the model's largest image.
    ImageSide { side: u64, max: u64 },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Memory { total, usable } => write!(
                f,
                "needs {} but only {} is usable ({:.0}% headroom kept)",
                gib_str(*total),
                gib_str(*usable),
                MIN_HEADROOM_FRACTION * 100.0
            ),
            Problem::KvBudget { need, budget } => write!(
                f,
                "the KV cache at max_batch_size × max_sequence_length needs {} but kv_cache_gb allows {}",
                gib_str(*need),
                gib_str(*budget)
            ),
            Problem::Arena { need, limit } => write!(
                f,
                "ONNX Runtime allocates {} (weights, KV cache, activations) but cuda.memory_limit_gb is {}",
                gib_str(*need),
                gib_str(*limit)
            ),
            Problem::Positions { length, max } => write!(
                f,
                "max_sequence_length {length} exceeds the decoder's max_position_embeddings {max}"
            ),
            Problem::ImageSide { side, max } => write!(
                f,
                "max_image_side {side} exceeds the model's image_size {max}"
            ),
        }
    }
}

/// A change to the profile that would make it fit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Advice {
    /// The profile field to change.
    pub field: String,
    /// Its current value.
    pub current: String,
    /// The value that fits, if any value of this field does.
    pub suggested: Option<String>,
    /// What else the change implies, or why no value helps.
    pub note: String,
}

impl fmt::Display for Advice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.suggested {
            Some(s) => write!(f, "set `{}` to {} (now {})", self.field, s, self.current)?,
            None => write!(f, "`{}` (now {}) cannot fix it", self.field, self.current)?,
        }
        if !self.note.is_empty() {
            write!(f, "; {}", self.note)?;
        }
        Ok(())
    }
}

/// The memory a profile needs on one device, row by row, and whether it fits.
#[derive(Debug, Clone)]
pub struct Budget {
    /// The rows, in print order; their sum is [`Budget::total`].
    pub rows: Vec<BudgetRow>,
    /// Sum of the rows, bytes.
    pub total: u64,
    /// Memory checked against, bytes (`None`: unknown, only the other limits are checked).
    pub capacity: Option<u64>,
    /// What the capacity is (`GPU memory (profile)`, `GPU memory (--gpu-memory)`, `host memory`).
    pub capacity_label: String,
    /// The batch's KV cache at full length (one copy), bytes.
    pub kv_cache: u64,
    /// `kv_cache_gb`, bytes.
    pub kv_budget: u64,
    /// What ONNX Runtime's allocator holds and `cuda.memory_limit_gb`, when CUDA is listed.
    pub arena: Option<(u64, u64)>,
    /// Everything that does not fit (empty when the profile fits).
    pub problems: Vec<Problem>,
    /// Figures not counted in the total and assumptions worth knowing.
    pub notes: Vec<String>,
    profile: Profile,
    dims: ModelDims,
    weights_bytes: u64,
    gpu_memory_bytes: Option<u64>,
    options: BudgetOptions,
}

/// [`budget_with`] with the default options (today's Concat-based decoder, one prefill at a
/// time). `weights_bytes` is what the export's graphs of `profile.precision` hold
/// ([`weights_bytes`]); `gpu_memory_bytes` overrides `gpu_memory_gb` (for a CPU-only profile
/// it is the host memory to check against; `None` leaves the total unchecked).
pub fn budget(
    profile: &Profile,
    dims: &ModelDims,
    weights_bytes: u64,
    gpu_memory_bytes: Option<u64>,
) -> Budget {
    budget_with(
        profile,
        dims,
        weights_bytes,
        gpu_memory_bytes,
        BudgetOptions::default(),
    )
}

/// The memory budget of `profile` for a model of `dims`; see [`budget`].
///
/// Rows: weights; KV cache (batch × sequence × bytes per token) and, with
/// [`BudgetOptions::kv_step_copy`], its second copy during a step; vision activations of one
/// `max_image_side`² image (plus one layer's attention scores unless
/// [`BudgetOptions::vision_attention_fused`]); decoder prefill activations of
/// [`BudgetOptions::prefill_batch`] full-page prompts with the exported (unfused) attention;
/// the decode step's logits (last position only, float32); the TensorRT workspace when
/// TensorRT is listed; the runtime overhead ([`CUDA_RUNTIME_BYTES`],
/// [`TENSORRT_RUNTIME_BYTES`], or [`CPU_RUNTIME_BYTES`] on a CPU-only profile). The vision
/// and decoder sessions keep separate arenas, so their activation peaks add up.
pub fn budget_with(
    profile: &Profile,
    dims: &ModelDims,
    weights_bytes: u64,
    gpu_memory_bytes: Option<u64>,
    options: BudgetOptions,
) -> Budget {
    let p = profile;
    let d = dims;
    let eb = activation_bytes(p.precision);
    let b = p.max_batch_size as u64;
    let seq = p.max_sequence_length as u64;
    let side = p.max_image_side as u64;
    let mut rows = Vec::new();
    let mut notes = Vec::new();

    rows.push(BudgetRow {
        item: "weights".into(),
        bytes: weights_bytes,
        detail: format!("{} graphs of the export", p.precision.name()),
    });

    let per_token = d.kv_bytes_per_token(eb);
    let kv = mul(&[b, seq, per_token]);
    rows.push(BudgetRow {
        item: "KV cache".into(),
        bytes: kv,
        detail: format!(
            "{b} × {seq} tokens × {} ({} layers × 2 × {} kv heads × {} × {eb} B)",
            kib_str(per_token),
            d.text_layers,
            d.text_kv_heads,
            d.text_head_dim
        ),
    });
    if options.kv_step_copy {
        rows.push(BudgetRow {
            item: "KV step copy".into(),
            bytes: kv,
            detail: "present.* of a step next to past_key_values.* (Concat-based decoder)".into(),
        });
    }

    // Vision: one image per call; fused attention has no patches² score tensor.
    let patches = d.patches(side, side);
    let scores = mul(&[d.vision_heads, patches, patches, 4]);
    let vision_act = mul(&[
        patches,
        HIDDEN_COPIES * d.vision_hidden + MLP_COPIES * d.vision_intermediate,
        eb,
    ])
    .saturating_add(mul(&[3, side, side, eb]));
    if options.vision_attention_fused {
        rows.push(BudgetRow {
            item: "vision activations".into(),
            bytes: vision_act,
            detail: format!("one {side}×{side} image, {patches} patches, fused attention"),
        });
        notes.push(format!(
            "unfused, the vision attention at {side}×{side} would need {} per layer for one \
             float32 score tensor ({} heads × {patches}² × 4 B), twice that with the softmax \
             next to it; the vision row assumes a fused kernel",
            gib_str(scores),
            d.vision_heads
        ));
    } else {
        rows.push(BudgetRow {
            item: "vision activations".into(),
            bytes: vision_act.saturating_add(mul(&[scores, SCORE_BYTES / 4])),
            detail: format!(
                "one {side}×{side} image, {patches} patches, UNFUSED attention: scores {} per layer",
                gib_str(mul(&[scores, SCORE_BYTES / 4]))
            ),
        });
    }

    // Decoder prefill: the longest prompt, standard attention as exported.
    let s = (d.image_tokens(side, side) + PROMPT_TOKENS).min(seq);
    let per_seq = mul(&[
        s,
        HIDDEN_COPIES * d.text_hidden
            + 3 * d.text_heads * d.text_head_dim
            + MLP_COPIES * d.text_intermediate,
        eb,
    ])
    .saturating_add(mul(&[d.text_heads, s, s, SCORE_BYTES]))
    .saturating_add(mul(&[s, s]));
    let prefill = mul(&[options.prefill_batch.max(1), per_seq]);
    rows.push(BudgetRow {
        item: "decoder prefill".into(),
        bytes: prefill,
        detail: format!(
            "{} × {s}-token prompt, unfused attention scores {} per layer",
            options.prefill_batch.max(1),
            mib_str(mul(&[d.text_heads, s, s, SCORE_BYTES]))
        ),
    });
    if options.prefill_batch <= 1 {
        notes.push(
            "prefill is counted for one request at a time (joined to the decode batch when \
             done); prefilling k requests together multiplies that row by k"
                .into(),
        );
    }

    let logits = mul(&[b, d.vocab, 4]);
    rows.push(BudgetRow {
        item: "logits".into(),
        bytes: logits,
        detail: format!("{b} × {} × 4 B (last position only)", d.vocab),
    });

    let gpu = p.uses_gpu();
    if p.has(Provider::TensorRt) {
        let ws = p
            .tensorrt
            .as_ref()
            .map_or(0, |t| gib_to_bytes(t.workspace_gb));
        rows.push(BudgetRow {
            item: "TensorRT workspace".into(),
            bytes: ws,
            detail: "tensorrt.workspace_gb".into(),
        });
    }
    let overhead = if gpu {
        CUDA_RUNTIME_BYTES
            + if p.has(Provider::TensorRt) {
                TENSORRT_RUNTIME_BYTES
            } else {
                0
            }
    } else {
        CPU_RUNTIME_BYTES
    };
    rows.push(BudgetRow {
        item: "runtime overhead".into(),
        bytes: overhead,
        detail: if gpu {
            if p.has(Provider::TensorRt) {
                "CUDA context, cuBLAS/cuDNN (ORT and TensorRT)".into()
            } else {
                "CUDA context, cuBLAS/cuDNN".into()
            }
        } else {
            "ONNX Runtime, tokenizer, image buffers".into()
        },
    });

    let total = rows.iter().fold(0u64, |a, r| a.saturating_add(r.bytes));
    let (capacity, capacity_label) = match gpu_memory_bytes {
        Some(c) if gpu => (Some(c), "GPU memory (--gpu-memory)".to_string()),
        Some(c) => (Some(c), "host memory".to_string()),
        None if gpu => (
            Some(gib_to_bytes(p.gpu_memory_gb)),
            "GPU memory (gpu_memory_gb)".to_string(),
        ),
        None => (None, "host memory".to_string()),
    };

    let mut problems = Vec::new();
    if let Some(c) = capacity {
        let usable = (c as f64 * (1.0 - MIN_HEADROOM_FRACTION)) as u64;
        if total > usable {
            problems.push(Problem::Memory { total, usable });
        }
    }
    let kv_budget = gib_to_bytes(p.kv_cache_gb);
    if kv > kv_budget {
        problems.push(Problem::KvBudget {
            need: kv,
            budget: kv_budget,
        });
    }
    let arena = match (&p.cuda, p.has(Provider::Cuda)) {
        (Some(c), true) => {
            let ws = rows
                .iter()
                .filter(|r| r.item == "TensorRT workspace" || r.item == "runtime overhead")
                .fold(0u64, |a, r| a.saturating_add(r.bytes));
            Some((total.saturating_sub(ws), gib_to_bytes(c.memory_limit_gb)))
        }
        _ => None,
    };
    if let Some((need, limit)) = arena {
        if need > limit {
            problems.push(Problem::Arena { need, limit });
        }
    }
    if seq > d.max_positions {
        problems.push(Problem::Positions {
            length: seq,
            max: d.max_positions,
        });
    }
    if side > d.image_size {
        problems.push(Problem::ImageSide {
            side,
            max: d.image_size,
        });
    }
    if let (Some(c), Some(cuda)) = (capacity, &p.cuda) {
        if cuda.arena_extend_strategy == ArenaExtendStrategy::NextPowerOfTwo
            && p.has(Provider::Cuda)
            && total as f64 > 0.8 * c as f64
        {
            notes.push(
                "cuda.arena_extend_strategy next_power_of_two can overshoot a budget this tight; \
                 same_as_requested extends by what is asked"
                    .into(),
            );
        }
    }

    Budget {
        rows,
        total,
        capacity,
        capacity_label,
        kv_cache: kv,
        kv_budget,
        arena,
        problems,
        notes,
        profile: profile.clone(),
        dims: *dims,
        weights_bytes,
        gpu_memory_bytes,
        options,
    }
}

impl Budget {
    /// Whether the profile fits: memory, KV budget, arena limit, positions and image side.
    pub fn fits(&self) -> bool {
        self.problems.is_empty()
    }

    /// Device (or host) memory left after the total, bytes (negative when over).
    pub fn headroom(&self) -> Option<i64> {
        self.capacity
            .map(|c| c as i64 - self.total.min(i64::MAX as u64) as i64)
    }

    /// The profile the budget was computed for.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    fn refit(&self, f: impl FnOnce(&mut Profile)) -> Budget {
        let mut p = self.profile.clone();
        f(&mut p);
        budget_with(
            &p,
            &self.dims,
            self.weights_bytes,
            self.gpu_memory_bytes,
            self.options,
        )
    }

    /// What to lower for the profile to fit, each with the largest value that fits: empty
    /// when it fits. Levers: `max_batch_size`, `max_sequence_length` (with the
    /// `max_new_tokens_limit` it implies), `max_image_side`, `precision` (activations and KV
    /// cache only: the weights of another precision come from its own export), and the
    /// limits `kv_cache_gb` / `cuda.memory_limit_gb` when only they are short.
    pub fn advice(&self) -> Vec<Advice> {
        if self.fits() {
            return Vec::new();
        }
        let p = &self.profile;
        let mut out = Vec::new();

        let batch = (1..p.max_batch_size)
            .rev()
            .find(|&b| self.refit(|q| q.max_batch_size = b).fits());
        out.push(Advice {
            field: "max_batch_size".into(),
            current: p.max_batch_size.to_string(),
            suggested: batch.map(|b| b.to_string()),
            note: match batch {
                Some(b) => format!(
                    "KV cache {} at {b} sequences",
                    gib_str(self.refit(|q| q.max_batch_size = b).kv_cache)
                ),
                None if p.max_batch_size > 1 => "even 1 does not fit".into(),
                None => "already 1".into(),
            },
        });

        let prompt = p.max_prompt_tokens();
        let lowest = prompt + 1;
        let seq = p.max_sequence_length as u64;
        let mut candidates: Vec<u64> = (lowest..seq)
            .filter(|s| s.is_multiple_of(256))
            .rev()
            .collect();
        if lowest < seq {
            candidates.push(lowest);
        }
        let found = candidates
            .into_iter()
            .find(|&s| self.refit(|q| q.max_sequence_length = s as u32).fits());
        out.push(Advice {
            field: "max_sequence_length".into(),
            current: p.max_sequence_length.to_string(),
            suggested: found.map(|s| s.to_string()),
            note: match found {
                Some(s) if s - prompt < p.max_new_tokens_limit as u64 => format!(
                    "max_new_tokens_limit then at most {} for a {}×{} page",
                    s - prompt,
                    p.max_image_side,
                    p.max_image_side
                ),
                Some(_) => String::new(),
                None => format!(
                    "not even {lowest} (a full {}×{} prompt and one new token)",
                    p.max_image_side, p.max_image_side
                ),
            },
        });

        let side = (1..p.max_image_side / IMAGE_SIDE_UNIT)
            .rev()
            .map(|k| k * IMAGE_SIDE_UNIT)
            .find(|&s| self.refit(|q| q.max_image_side = s).fits());
        out.push(Advice {
            field: "max_image_side".into(),
            current: p.max_image_side.to_string(),
            suggested: side.map(|s| s.to_string()),
            note: match side {
                Some(_) => "pages are downscaled further (small print suffers)".into(),
                None => "lowering it alone is not enough".into(),
            },
        });

        let eb = activation_bytes(p.precision);
        let lighter: Vec<Precision> = [Precision::Fp16, Precision::Int4Fp16]
            .into_iter()
            .filter(|&c| activation_bytes(c) < eb)
            .collect();
        let prec = lighter
            .into_iter()
            .find(|&c| self.refit(|q| q.precision = c).fits());
        out.push(Advice {
            field: "precision".into(),
            current: p.precision.name().into(),
            suggested: prec.map(|c| c.name().to_string()),
            note: match prec {
                Some(c) => format!(
                    "16-bit activations and KV cache; export `--precision {}` (its weights are smaller too)",
                    c.name()
                ),
                None if eb == 2 => {
                    "activations are already 16-bit; int4-fp16 weights shrink only the weights row"
                        .into()
                }
                None => "16-bit activations alone are not enough".into(),
            },
        });

        for pr in &self.problems {
            match pr {
                Problem::KvBudget { need, .. } => {
                    let others_ok = self
                        .refit(|q| {
                            q.kv_cache_gb = (*need as f64 / GIB as f64 * 100.0).ceil() / 100.0
                        })
                        .fits();
                    out.push(Advice {
                        field: "kv_cache_gb".into(),
                        current: format!("{}", p.kv_cache_gb),
                        suggested: Some(format!(
                            "{:.2}",
                            (*need as f64 / GIB as f64 * 100.0).ceil() / 100.0
                        )),
                        note: if others_ok {
                            "the device has room for it".into()
                        } else {
                            "raising it alone is not enough".into()
                        },
                    });
                }
                Problem::Arena { need, .. } => {
                    let v = (*need as f64 / GIB as f64 * 100.0).ceil() / 100.0;
                    out.push(Advice {
                        field: "cuda.memory_limit_gb".into(),
                        current: p
                            .cuda
                            .as_ref()
                            .map_or(String::new(), |c| c.memory_limit_gb.to_string()),
                        suggested: Some(format!("{v:.2}")),
                        note: "the arena must hold the weights, the KV cache and the activations"
                            .into(),
                    });
                }
                // Lowering max_sequence_length / max_image_side (above) covers these.
                Problem::Positions { .. } | Problem::ImageSide { .. } => {}
                Problem::Memory { .. } => {}
            }
        }
        out
    }
}

fn gib_str(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / GIB as f64)
}

fn mib_str(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / MIB as f64)
}

fn kib_str(b: u64) -> String {
    if b.is_multiple_of(1024) {
        format!("{} KiB", b / 1024)
    } else {
        format!("{:.1} KiB", b as f64 / 1024.0)
    }
}

impl fmt::Display for Budget {
    /// An aligned table: item, MiB, GiB, how; then total, capacity, headroom, limits, the
    /// verdict and the notes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.profile;
        writeln!(
            f,
            "profile {} ({}): {}, batch {} × {} tokens, images up to {}×{}",
            p.name,
            p.source,
            p.precision.name(),
            p.max_batch_size,
            p.max_sequence_length,
            p.max_image_side,
            p.max_image_side
        )?;
        let mut lines: Vec<(String, Option<i128>, String)> = self
            .rows
            .iter()
            .map(|r| (r.item.clone(), Some(r.bytes as i128), r.detail.clone()))
            .collect();
        lines.push(("".into(), None, "".into()));
        lines.push(("total".into(), Some(self.total as i128), String::new()));
        match self.capacity {
            Some(c) => {
                lines.push((self.capacity_label.clone(), Some(c as i128), String::new()));
                lines.push((
                    "headroom".into(),
                    Some(c as i128 - self.total as i128),
                    format!(
                        "at least {:.0}% ({}) required",
                        MIN_HEADROOM_FRACTION * 100.0,
                        gib_str((c as f64 * MIN_HEADROOM_FRACTION) as u64)
                    ),
                ));
            }
            None => lines.push((
                self.capacity_label.clone(),
                None,
                "unknown: pass --gpu-memory to compare".into(),
            )),
        }
        lines.push((
            "kv_cache_gb".into(),
            Some(self.kv_budget as i128),
            format!(
                "KV cache needs {} ({})",
                gib_str(self.kv_cache),
                if self.kv_cache <= self.kv_budget {
                    "within"
                } else {
                    "OVER"
                }
            ),
        ));
        if let Some((need, limit)) = self.arena {
            lines.push((
                "cuda.memory_limit_gb".into(),
                Some(limit as i128),
                format!(
                    "ONNX Runtime allocates {} ({})",
                    gib_str(need),
                    if need <= limit { "within" } else { "OVER" }
                ),
            ));
        }
        let w = lines
            .iter()
            .map(|l| l.0.chars().count())
            .max()
            .unwrap_or(0)
            .max(4);
        writeln!(f, "{:<w$}  {:>10}  {:>8}  how", "item", "MiB", "GiB")?;
        for (item, bytes, detail) in &lines {
            match bytes {
                Some(b) => writeln!(
                    f,
                    "{}",
                    format!(
                        "{:<w$}  {:>10.1}  {:>8.3}  {}",
                        item,
                        *b as f64 / MIB as f64,
                        *b as f64 / GIB as f64,
                        detail
                    )
                    .trim_end()
                )?,
                None if item.is_empty() => writeln!(f)?,
                None => writeln!(f, "{:<w$}  {:>10}  {:>8}  {}", item, "-", "-", detail)?,
            }
        }
        // Memory and the model's own limits are different verdicts: a profile can fit in
        // memory and still ask for more positions than the model takes.
        let (model_limits, memory): (Vec<&Problem>, Vec<&Problem>) = self
            .problems
            .iter()
            .partition(|p| matches!(p, Problem::Positions { .. } | Problem::ImageSide { .. }));
        if self.fits() {
            writeln!(f, "verdict: fits")?;
        } else if memory.is_empty() {
            writeln!(
                f,
                "verdict: fits in memory, but the model cannot take these limits"
            )?;
        } else {
            writeln!(f, "verdict: does NOT fit in memory")?;
            for pr in &memory {
                writeln!(f, "  - {pr}")?;
            }
            if !model_limits.is_empty() {
                writeln!(f, "and the model cannot take these limits:")?;
            }
        }
        for pr in &model_limits {
            writeln!(f, "  - {pr}")?;
        }
        if !self.notes.is_empty() {
            writeln!(f, "notes:")?;
            for n in &self.notes {
                writeln!(f, "  - {n}")?;
            }
        }
        Ok(())
    }
}

/// Bytes of an export's graphs of one precision: each graph's external data
/// (`data_bytes` in `ocrctl.json`) plus its `.onnx` file.
pub fn weights_bytes(
    model_dir: &Path,
    manifest: &Manifest,
    precision: Precision,
) -> Result<u64, ProfileError> {
    let mfile = model_dir.join(MANIFEST);
    let graphs = manifest
        .graphs
        .get(&precision)
        .ok_or_else(|| ProfileError::Model {
            file: mfile.clone(),
            reason: format!(
                "precision `{}` was not exported (this export has: {}); re-export with \
                 `--precision {}` or choose a profile for one of those",
                precision.name(),
                manifest
                    .graphs
                    .keys()
                    .map(|p| p.name())
                    .collect::<Vec<_>>()
                    .join(", "),
                precision.name()
            ),
        })?;
    let mut total = 0u64;
    for (part, g) in graphs {
        let f = model_dir.join("onnx").join(&g.file);
        let len = std::fs::metadata(&f)
            .map_err(|e| ProfileError::Model {
                file: f.clone(),
                reason: format!(
                    "graph `{part}` listed in {} is unreadable: {e}",
                    mfile.display()
                ),
            })?
            .len();
        total = total.saturating_add(len).saturating_add(g.data_bytes);
    }
    Ok(total)
}

/// Notes about an export under a profile with TensorRT: contrib ops TensorRT cannot parse,
/// and a vision encoder whose memory relies on TensorRT fusing its attention.
pub fn export_notes(profile: &Profile, manifest: &Manifest, dims: &ModelDims) -> Vec<String> {
    let mut notes = Vec::new();
    let Some(graphs) = manifest.graphs.get(&profile.precision) else {
        return notes;
    };
    if profile.has(Provider::TensorRt) {
        let contrib: usize = graphs
            .values()
            .flat_map(|g| g.op_counts.iter())
            .filter(|(op, _)| op.starts_with("com.microsoft."))
            .map(|(_, n)| *n)
            .sum();
        if contrib > 0 {
            notes.push(format!(
                "the graphs hold {contrib} com.microsoft nodes, which TensorRT cannot parse: \
                 they run on the next provider; export with `--target tensorrt` for TensorRT"
            ));
        }
    }
    if profile.has(Provider::TensorRt) && !vision_attention_fused_in(manifest, profile.precision) {
        let side = profile.max_image_side as u64;
        let n = dims.patches(side, side);
        notes.push(format!(
            "this export's vision encoder has no fused attention node: the vision row relies on \
             TensorRT fusing it; on another provider each layer needs {} for the scores at \
             {side}×{side}",
            gib_str(mul(&[dims.vision_heads, n, n, SCORE_BYTES]))
        ));
    }
    notes
}

/// Whether the export's vision encoder of `precision` has a fused attention node
/// (`com.microsoft.MultiHeadAttention` or ONNX `Attention`).
pub fn vision_attention_fused_in(manifest: &Manifest, precision: Precision) -> bool {
    manifest
        .graphs
        .get(&precision)
        .and_then(|g| g.get("vision_encoder"))
        .is_some_and(|g| {
            g.op_counts
                .keys()
                .any(|op| op.ends_with("MultiHeadAttention") || op == "Attention")
        })
}

/// Whether the export's decoder updates its KV cache in place (a `GroupQueryAttention` with a
/// shared buffer: the `decoder_gqa` graph, which the runner prefers when it exists); otherwise
/// a step holds past and present at once.
pub fn decoder_updates_kv_in_place(manifest: &Manifest, precision: Precision) -> bool {
    let parts = manifest.graphs.get(&precision);
    parts
        .and_then(|g| {
            g.get("decoder_gqa")
                .or_else(|| g.get("decoder_model_merged"))
        })
        .is_some_and(|g| {
            g.op_counts
                .keys()
                .any(|op| op.ends_with("GroupQueryAttention"))
        })
}

/// Total host memory (`MemTotal` of `/proc/meminfo`), bytes; `None` where unreadable.
pub fn host_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn yaml_16gb() -> &'static str {
        builtin("16gb").unwrap()
    }

    fn parse(text: &str) -> Result<Profile, ProfileError> {
        Profile::parse(text, ProfileSource::File("t/p.yaml".into()))
    }

    /// Replaces the line starting with `key:` (first occurrence) by `key: value`.
    fn with(text: &str, key: &str, value: &str) -> String {
        let mut done = false;
        text.lines()
            .map(|l| {
                if !done && l.trim_start().starts_with(&format!("{key}:")) {
                    done = true;
                    let indent = &l[..l.len() - l.trim_start().len()];
                    format!("{indent}{key}: {value}")
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn dims_of_the_embedded_config_match_the_constant() {
        let v: serde_json::Value =
            serde_json::from_str(ocrctl_exporters::config::LIGHTONOCR_2_1B_CONFIG).unwrap();
        let c = ModelConfig::from_json(&v, Path::new("config.json")).unwrap();
        assert_eq!(ModelDims::from_config(&c), ModelDims::LIGHTONOCR_2_1B);
    }

    #[test]
    fn kv_per_token_is_112_kib_in_16_bit() {
        let d = ModelDims::LIGHTONOCR_2_1B;
        assert_eq!(d.kv_bytes_per_token(2), 28 * 2 * 8 * 128 * 2);
        assert_eq!(d.kv_bytes_per_token(2), 112 * 1024);
        assert_eq!(d.kv_bytes_per_token(4), 224 * 1024);
        assert_eq!(d.image_tokens(1540, 1540), 3025);
        assert_eq!(d.image_tokens(1540, 1092), 2145);
        assert_eq!(d.patches(1540, 1540), 12100);
    }

    #[test]
    fn a4_page_at_1540_is_1540_by_1092() {
        assert_eq!(a4_page(1540, 28), (1540, 1092));
        assert_eq!(a4_page(1120, 28), (1120, 812));
        assert_eq!(a4_page(28, 28), (28, 28));
    }

    #[test]
    fn wrong_type_names_file_and_field() {
        let e = parse(&with(yaml_16gb(), "max_batch_size", "\"lots\""))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("t/p.yaml: "), "{e}");
        assert!(e.contains("max_batch_size"), "{e}");
        assert!(e.contains("invalid type"), "{e}");
    }

    #[test]
    fn nested_unknown_field_is_named() {
        let t = yaml_16gb().replace("  cuda_graphs:", "  cuda_graph_typo: false\n  cuda_graphs:");
        let e = parse(&t).unwrap_err().to_string();
        assert!(e.contains("t/p.yaml"), "{e}");
        assert!(e.contains("unknown field `cuda_graph_typo`"), "{e}");
    }

    #[test]
    fn gb_fields_reject_nan_and_negative() {
        let e = parse(&with(yaml_16gb(), "kv_cache_gb", ".nan"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("field `kv_cache_gb`") && e.contains("finite"),
            "{e}"
        );
        let e = parse(&with(yaml_16gb(), "workspace_gb", "-1"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("field `tensorrt.workspace_gb`: -1 is negative"),
            "{e}"
        );
    }

    #[test]
    fn missing_provider_section_is_named() {
        let t: String = yaml_16gb().split("\ncuda:").next().unwrap().to_string();
        // Everything from the cuda section on is gone (cuda and cpu sections).
        let e = parse(&t).unwrap_err().to_string();
        assert!(
            e.contains("field `cuda`: is missing but providers lists cuda"),
            "{e}"
        );
    }

    #[test]
    fn decoder_shapes_at_min_opt_max() {
        let d = ModelDims {
            text_layers: 2,
            ..ModelDims::LIGHTONOCR_2_1B
        };
        assert_eq!(
            decoder_shapes(&d, 1, 1, 0, 1),
            "inputs_embeds:1x1x1024,attention_mask:1x1,position_ids:1x1,\
             past_key_values.0.key:1x8x0x128,past_key_values.0.value:1x8x0x128,\
             past_key_values.1.key:1x8x0x128,past_key_values.1.value:1x8x0x128"
        );
        assert!(decoder_shapes(&d, 4, 1, 100, 101).starts_with(
            "inputs_embeds:4x1x1024,attention_mask:4x101,position_ids:4x1,past_key_values.0.key:4x8x100x128"
        ));
        assert!(decoder_shapes(&d, 4, 512, 511, 512)
            .starts_with("inputs_embeds:4x512x1024,attention_mask:4x512,position_ids:4x512"));
    }

    #[test]
    fn names_and_paths_are_told_apart() {
        assert!(looks_like_path("./16gb.yaml"));
        assert!(looks_like_path("16gb.yml"));
        assert!(looks_like_path("dir/16gb"));
        assert!(!looks_like_path("16gb"));
        assert!(valid_name("a100-40gb_v2.1"));
        assert!(!valid_name(".hidden"));
        assert!(!valid_name("a b"));
        assert!(!valid_name(""));
        let e = Profile::load("bad name").unwrap_err().to_string();
        assert!(e.starts_with("profile `bad name` not found"), "{e}");
    }

    #[test]
    fn an_fp32_profile_is_advised_to_16_bit_activations() {
        // The cpu profile (int4, float32 activations) on a 12 GiB host: fp16 activations
        // halve the KV cache (2 × 5.25 → 2 × 2.625 GiB) and fit, and so does a smaller batch.
        let p = Profile::parse(
            builtin("cpu").unwrap(),
            ProfileSource::BuiltIn("cpu".into()),
        )
        .unwrap();
        let d = ModelDims::LIGHTONOCR_2_1B;
        let b = budget(&p, &d, 949 * MIB, Some(12 * GIB));
        assert!(!b.fits());
        assert_eq!(
            b.problems,
            vec![Problem::Memory {
                total: b.total,
                usable: (12.0 * GIB as f64 * 0.95) as u64
            }]
        );
        let adv = b.advice();
        let prec = adv.iter().find(|a| a.field == "precision").unwrap();
        assert_eq!(prec.suggested.as_deref(), Some("fp16"));
        let batch = adv.iter().find(|a| a.field == "max_batch_size").unwrap();
        // 11.4 usable GiB − 3.39 GiB of weights, activations and runtime = 8.0 GiB for
        // sequences of 2 × 6144 × 224 KiB = 2.625 GiB each: 3.
        assert_eq!(batch.suggested.as_deref(), Some("3"));
        assert_eq!(
            batch.to_string(),
            "set `max_batch_size` to 3 (now 4); KV cache 3.94 GiB at 3 sequences"
        );
    }

    #[test]
    fn kv_budget_and_arena_limits_are_checked() {
        let t = with(yaml_16gb(), "kv_cache_gb", "4");
        let p = parse(&with(&t, "memory_limit_gb", "10")).unwrap();
        let b = budget(&p, &ModelDims::LIGHTONOCR_2_1B, 900 * MIB, None);
        assert!(!b.fits());
        assert!(b.problems.contains(&Problem::KvBudget {
            need: 5376 * MIB,
            budget: 4 * GIB
        }));
        assert!(
            matches!(b.problems.last(), Some(Problem::Arena { limit, .. }) if *limit == 10 * GIB)
        );
        let adv: Vec<String> = b.advice().iter().map(|a| a.to_string()).collect();
        assert!(
            adv.iter()
                .any(|a| a.starts_with("set `kv_cache_gb` to 5.25 (now 4)")),
            "{adv:?}"
        );
        assert!(
            adv.iter()
                .any(|a| a.starts_with("set `cuda.memory_limit_gb` to")),
            "{adv:?}"
        );
        // Batch 4: KV 3.5 GiB within 4, arena within 10 GiB.
        assert_eq!(b.advice()[0].suggested.as_deref(), Some("4"));
    }

    #[test]
    fn budget_rows_for_a_small_profile_by_hand() {
        let p = parse(
            &with(
                &with(
                    &with(yaml_16gb(), "max_batch_size", "2"),
                    "max_sequence_length",
                    "4096",
                ),
                "max_new_tokens_limit",
                "1024",
            )
            .replace(
                "default_max_new_tokens: 4096",
                "default_max_new_tokens: 1024",
            ),
        )
        .unwrap();
        let d = ModelDims::LIGHTONOCR_2_1B;
        let b = budget(&p, &d, 1000 * MIB, Some(16 * GIB));
        let row = |n: &str| b.rows.iter().find(|r| r.item == n).unwrap().bytes;
        assert_eq!(row("KV cache"), 2 * 4096 * 112 * 1024);
        assert_eq!(row("KV step copy"), 2 * 4096 * 112 * 1024);
        assert_eq!(row("logits"), 2 * 151936 * 4);
        assert_eq!(row("weights"), 1000 * MIB);
        // 12100 patches × (6·1024 + 3·4096) × 2 B + pixel values 3 × 1540² × 2 B.
        assert_eq!(
            row("vision activations"),
            12100 * (6 * 1024 + 3 * 4096) * 2 + 3 * 1540 * 1540 * 2
        );
        // 3041 tokens × (6·1024 + 3·16·128 + 3·3072) × 2 B + 16 × 3041² × 8 B + 3041² B.
        assert_eq!(
            row("decoder prefill"),
            3041 * (6 * 1024 + 3 * 16 * 128 + 3 * 3072) * 2 + 16 * 3041 * 3041 * 8 + 3041 * 3041
        );
        assert_eq!(b.total, b.rows.iter().map(|r| r.bytes).sum::<u64>());
        assert!(b.fits(), "{b}");
        assert!(b.advice().is_empty());
    }
}
