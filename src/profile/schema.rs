//! The profile schema (serde, unknown fields rejected), loading and validation.

use super::*;

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
         is in {searched} (give a path to load another file){hint}"
    )]
    NotFound {
        name: String,
        builtins: String,
        searched: String,
        /// `; did you mean `…`?` for a name close to a built-in's, else empty.
        hint: String,
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
pub use crate::runtime::providers::Provider;

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

/// Compute capabilities TensorRT-RTX builds for and its plugin runs on.
pub const TRT_RTX_TARGETS: [&str; 4] = ["sm86", "sm89", "sm120", "sm121"];

/// TensorRT-RTX settings (the `NvTensorRTRTXExecutionProvider` plugin and
/// `ocrctl build-engines`). Shape ranges are derived like TensorRT's ([`trt_shapes`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorRtRtxSection {
    /// Builder and run-time workspace limit (`nv_max_workspace_size`), GiB; 0 = TensorRT-RTX's
    /// default.
    pub workspace_gb: f64,
    /// GPU architectures engines are built for (`sm86` Ampere RTX 30, `sm89` Ada RTX 40,
    /// `sm120`/`sm121` Blackwell RTX 50).
    pub compute_capabilities: Vec<String>,
    /// Folder of prebuilt engines, relative to the model directory; a profile's engines go in
    /// `<engines_dir>/<profile name>/`.
    pub engines_dir: PathBuf,
    /// Kernels compiled at run time, kept across starts (`nv_runtime_cache_path`); relative to
    /// the model directory.
    pub runtime_cache_dir: PathBuf,
    /// `enable_cuda_graph` (fixed shapes only).
    pub cuda_graphs: bool,
}

/// CUDA EP settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CudaSection {
    /// Arena limit per session (`gpu_mem_limit`), GiB.
    pub memory_limit_gb: f64,
    /// `arena_extend_strategy`.
    pub arena_extend_strategy: ArenaExtendStrategy,
    /// `enable_cuda_graph` for the GQA decoder's decode steps (one captured graph per batch
    /// bucket; other graphs run uncaptured). `--cuda-graphs` overrides it.
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
    /// Images one chat request may carry.
    pub max_images_per_request: u32,
    /// Pages of one document a `/v1/ocr` upload may have (`serve --max-pages-per-request`
    /// overrides it). The pages are rendered and queued a few at a time, so the decode budget,
    /// not this, bounds their memory. Default 500.
    #[serde(default = "default_max_pages_per_request")]
    pub max_pages_per_request: u32,
    /// HTTP request body limit, MiB.
    pub max_body_mb: u32,
    /// Requests waiting for a batch slot before new ones are refused (0: refuse when full).
    pub queue_size: u32,
    /// Memory the server may spend decoding request images and holding their preprocessed
    /// pages until they are queued, MiB (up to 11 bytes a source pixel plus 3 a model pixel;
    /// a request larger than this runs alone). Default 1024.
    #[serde(default = "default_decode_memory_mb")]
    pub decode_memory_mb: u32,
    /// TensorRT EP settings (required when `providers` lists `tensorrt`).
    #[serde(default)]
    pub tensorrt: Option<TensorRtSection>,
    /// TensorRT-RTX settings (required when `providers` lists `tensorrt-rtx`).
    #[serde(default)]
    pub tensorrt_rtx: Option<TensorRtRtxSection>,
    /// CUDA EP settings (required when `providers` lists `cuda`).
    #[serde(default)]
    pub cuda: Option<CudaSection>,
    /// CPU EP settings (required when `providers` lists `cpu`).
    #[serde(default)]
    pub cpu: Option<CpuSection>,
    /// The `derived:` section `profiles show` prints below a profile (KV size, TensorRT
    /// shapes): read and ignored, so that what `show` prints loads as a profile.
    #[serde(default, skip_serializing)]
    pub derived: Option<yaml_serde::Value>,
    /// Where the profile was read from (not part of the YAML).
    #[serde(skip)]
    pub source: ProfileSource,
}

pub(crate) fn default_decode_memory_mb() -> u32 {
    1024
}

pub(crate) fn default_max_pages_per_request() -> u32 {
    500
}

pub(crate) fn gib_to_bytes(gb: f64) -> u64 {
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
        let mut p: Profile = yaml_serde::from_str(text).map_err(|e| ProfileError::Schema {
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

    /// Whether `providers` lists a TensorRT (classic or RTX): shape ranges and the
    /// `--target tensorrt` graphs apply.
    pub fn has_tensorrt(&self) -> bool {
        self.providers.iter().any(|p| p.is_tensorrt())
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
        // In this order: the first field at fault is the one named.
        self.check_identity()?;
        self.check_lengths()?;
        self.check_memory()?;
        self.check_sections_present()?;
        self.check_sections()
    }

    /// Name, description, GPU memory and the providers listed.
    fn check_identity(&self) -> Result<(), ProfileError> {
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
        Ok(())
    }

    /// Batch, image side, sequence and token limits, and that a largest page fits.
    fn check_lengths(&self) -> Result<(), ProfileError> {
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
        Ok(())
    }

    /// The KV cache, request and decoding memory limits.
    fn check_memory(&self) -> Result<(), ProfileError> {
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
        if self.max_pages_per_request == 0 {
            return Err(self.invalid("max_pages_per_request", "must be at least 1"));
        }
        if self.decode_memory_mb == 0 {
            return Err(self.invalid("decode_memory_mb", "must be at least 1"));
        }
        if self.max_body_mb == 0 {
            return Err(self.invalid("max_body_mb", "must be at least 1"));
        }
        Ok(())
    }

    /// A section for each provider listed, and the TensorRT-RTX one's values.
    fn check_sections_present(&self) -> Result<(), ProfileError> {
        if self.has(Provider::TensorRt) && self.tensorrt.is_none() {
            return Err(self.invalid("tensorrt", "is missing but providers lists tensorrt"));
        }
        if self.has(Provider::TensorRtRtx) && self.tensorrt_rtx.is_none() {
            return Err(self.invalid(
                "tensorrt_rtx",
                "is missing but providers lists tensorrt-rtx",
            ));
        }
        if let Some(t) = &self.tensorrt_rtx {
            check_gb(self, "tensorrt_rtx.workspace_gb", t.workspace_gb, true)?;
            if t.compute_capabilities.is_empty() {
                return Err(self.invalid(
                    "tensorrt_rtx.compute_capabilities",
                    format!("is empty (list some of {})", TRT_RTX_TARGETS.join(", ")),
                ));
            }
            if let Some(c) = t
                .compute_capabilities
                .iter()
                .find(|c| !TRT_RTX_TARGETS.contains(&c.as_str()))
            {
                return Err(self.invalid(
                    "tensorrt_rtx.compute_capabilities",
                    format!(
                        "`{c}` is not one TensorRT-RTX targets ({})",
                        TRT_RTX_TARGETS.join(", ")
                    ),
                ));
            }
            if t.engines_dir.as_os_str().is_empty() {
                return Err(self.invalid("tensorrt_rtx.engines_dir", "is empty"));
            }
            if t.runtime_cache_dir.as_os_str().is_empty() {
                return Err(self.invalid("tensorrt_rtx.runtime_cache_dir", "is empty"));
            }
        }
        if self.has(Provider::Cuda) && self.cuda.is_none() {
            return Err(self.invalid("cuda", "is missing but providers lists cuda"));
        }
        if self.has(Provider::Cpu) && self.cpu.is_none() {
            return Err(self.invalid("cpu", "is missing but providers lists cpu"));
        }
        Ok(())
    }

    /// The TensorRT, CUDA and CPU sections' values.
    fn check_sections(&self) -> Result<(), ProfileError> {
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
pub(crate) fn check_gb(
    p: &Profile,
    field: &str,
    v: f64,
    zero_ok: bool,
) -> Result<(), ProfileError> {
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
