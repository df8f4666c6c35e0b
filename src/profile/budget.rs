//! The memory calculator: weights, KV cache, activations, workspace and runtime overhead of a
//! profile on one device ([`budget`]), and what an export supports.

use super::*;
use ocrctl_exporters::contract::{graph, tensor};

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
    /// Weights the prefill stage loads a second time (its own GQA decoder and embedding
    /// sessions, on a GPU, with `--prefill-stage on`): 0 without a stage.
    pub stage_weights_bytes: u64,
    /// Bytes per KV cache element when the export's cache is not of the activation type
    /// (1 for `--kv-cache fp8|int8`); `None`: the precision's activation size.
    pub kv_element_bytes: Option<u64>,
}

impl Default for BudgetOptions {
    fn default() -> Self {
        BudgetOptions {
            kv_step_copy: true,
            prefill_batch: 1,
            vision_attention_fused: true,
            stage_weights_bytes: 0,
            kv_element_bytes: None,
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
    pub(crate) profile: Profile,
    pub(crate) dims: ModelDims,
    pub(crate) weights_bytes: u64,
    pub(crate) gpu_memory_bytes: Option<u64>,
    pub(crate) options: BudgetOptions,
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
    let mut t = Tally::default();
    t.weights(profile, weights_bytes, &options);
    let kv = t.kv_cache(profile, dims, &options);
    t.vision(profile, dims, &options);
    t.prefill(profile, dims, &options);
    t.runtime(profile, dims);
    let Tally { rows, mut notes } = t;
    let gpu = profile.uses_gpu();
    let total = rows.iter().fold(0u64, |a, r| a.saturating_add(r.bytes));
    let (capacity, capacity_label) = match gpu_memory_bytes {
        Some(c) if gpu => (Some(c), "GPU memory (--gpu-memory)".to_string()),
        Some(c) => (Some(c), "host memory".to_string()),
        None if gpu => (
            Some(gib_to_bytes(profile.gpu_memory_gb)),
            "GPU memory (gpu_memory_gb)".to_string(),
        ),
        None => (None, "host memory".to_string()),
    };
    let arena = match (&profile.cuda, profile.has(Provider::Cuda)) {
        (Some(c), true) => {
            let ws = rows
                .iter()
                .filter(|r| r.item == "TensorRT workspace" || r.item == "runtime overhead")
                .fold(0u64, |a, r| a.saturating_add(r.bytes));
            Some((total.saturating_sub(ws), gib_to_bytes(c.memory_limit_gb)))
        }
        _ => None,
    };
    let kv_budget = gib_to_bytes(profile.kv_cache_gb);
    let problems = problems(profile, dims, (total, capacity), (kv, kv_budget), arena);
    if let (Some(c), Some(cuda)) = (capacity, &profile.cuda) {
        if cuda.arena_extend_strategy == ArenaExtendStrategy::NextPowerOfTwo
            && profile.has(Provider::Cuda)
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

/// What a profile's memory goes to, row by row, with the notes the rows leave.
#[derive(Default)]
struct Tally {
    rows: Vec<BudgetRow>,
    notes: Vec<String>,
}

impl Tally {
    fn row(&mut self, item: &str, bytes: u64, detail: String) {
        self.rows.push(BudgetRow {
            item: item.into(),
            bytes,
            detail,
        });
    }

    /// The export's weights, and the prefill stage's second copy.
    fn weights(&mut self, p: &Profile, weights_bytes: u64, options: &BudgetOptions) {
        let detail = format!("{} graphs of the export", p.precision.name());
        self.row("weights", weights_bytes, detail);
        if options.stage_weights_bytes > 0 {
            self.row(
                "prefill stage weights",
                options.stage_weights_bytes,
                "GQA decoder and embeddings loaded again for the prefill stage \
                 (--prefill-stage on)"
                    .into(),
            );
        }
    }

    /// The KV cache (and a Concat decoder's step copy of it); returns the cache's bytes.
    fn kv_cache(&mut self, p: &Profile, d: &ModelDims, options: &BudgetOptions) -> u64 {
        let (b, seq) = (p.max_batch_size as u64, p.max_sequence_length as u64);
        let kv_eb = options
            .kv_element_bytes
            .unwrap_or(activation_bytes(p.precision));
        let per_token = d.kv_bytes_per_token(kv_eb);
        let kv = mul(&[b, seq, per_token]);
        let detail = format!(
            "{b} × {seq} tokens × {} ({} layers × 2 × {} kv heads × {} × {kv_eb} B)",
            kib_str(per_token),
            d.text_layers,
            d.text_kv_heads,
            d.text_head_dim
        );
        self.row("KV cache", kv, detail);
        if options.kv_step_copy {
            let detail =
                "present.* of a step next to past_key_values.* (Concat-based decoder)".into();
            self.row("KV step copy", kv, detail);
        }
        kv
    }

    /// One image through the vision encoder; fused attention has no patches² score tensor.
    fn vision(&mut self, p: &Profile, d: &ModelDims, options: &BudgetOptions) {
        let (eb, side) = (activation_bytes(p.precision), p.max_image_side as u64);
        let patches = d.patches(side, side);
        let scores = mul(&[d.vision_heads, patches, patches, 4]);
        let vision_act = mul(&[
            patches,
            HIDDEN_COPIES * d.vision_hidden + MLP_COPIES * d.vision_intermediate,
            eb,
        ])
        .saturating_add(mul(&[3, side, side, eb]));
        if options.vision_attention_fused {
            let detail = format!("one {side}×{side} image, {patches} patches, fused attention");
            self.row("vision activations", vision_act, detail);
            self.notes.push(format!(
                "unfused, the vision attention at {side}×{side} would need {} per layer for one \
                 float32 score tensor ({} heads × {patches}² × 4 B), twice that with the softmax \
                 next to it; the vision row assumes a fused kernel",
                gib_str(scores),
                d.vision_heads
            ));
        } else {
            let unfused = mul(&[scores, SCORE_BYTES / 4]);
            let detail = format!(
                "one {side}×{side} image, {patches} patches, UNFUSED attention: scores {} per layer",
                gib_str(unfused)
            );
            self.row(
                "vision activations",
                vision_act.saturating_add(unfused),
                detail,
            );
        }
    }

    /// The decoder's prefill of the longest prompt, standard attention as exported.
    fn prefill(&mut self, p: &Profile, d: &ModelDims, options: &BudgetOptions) {
        let (eb, side) = (activation_bytes(p.precision), p.max_image_side as u64);
        let s = (d.image_tokens(side, side) + PROMPT_TOKENS).min(p.max_sequence_length as u64);
        let per_seq = mul(&[
            s,
            HIDDEN_COPIES * d.text_hidden
                + 3 * d.text_heads * d.text_head_dim
                + MLP_COPIES * d.text_intermediate,
            eb,
        ])
        .saturating_add(mul(&[d.text_heads, s, s, SCORE_BYTES]))
        .saturating_add(mul(&[s, s]));
        let k = options.prefill_batch.max(1);
        let detail = format!(
            "{k} × {s}-token prompt, unfused attention scores {} per layer",
            mib_str(mul(&[d.text_heads, s, s, SCORE_BYTES]))
        );
        self.row("decoder prefill", mul(&[k, per_seq]), detail);
        if options.prefill_batch <= 1 {
            self.notes.push(
                "prefill is counted for one request at a time (joined to the decode batch when \
                 done); prefilling k requests together multiplies that row by k"
                    .into(),
            );
        }
    }

    /// The last position's logits, TensorRT's workspace and the runtime's own memory.
    fn runtime(&mut self, p: &Profile, d: &ModelDims) {
        let b = p.max_batch_size as u64;
        let detail = format!("{b} × {} × 4 B (last position only)", d.vocab);
        self.row(tensor::LOGITS, mul(&[b, d.vocab, 4]), detail);
        let trt = p.has_tensorrt();
        if trt {
            // One TensorRT runs a graph: the larger workspace of the two that may.
            let ws = |g: Option<f64>| g.map_or(0, gib_to_bytes);
            let classic = ws(p.tensorrt.as_ref().map(|t| t.workspace_gb));
            let rtx = ws(p.tensorrt_rtx.as_ref().map(|t| t.workspace_gb));
            let detail = match rtx > classic {
                true => "tensorrt_rtx.workspace_gb",
                false => "tensorrt.workspace_gb",
            };
            self.row("TensorRT workspace", classic.max(rtx), detail.into());
        }
        let (bytes, detail) = match (p.uses_gpu(), trt) {
            (true, true) => (
                CUDA_RUNTIME_BYTES + TENSORRT_RUNTIME_BYTES,
                "CUDA context, cuBLAS/cuDNN (ORT and TensorRT)",
            ),
            (true, false) => (CUDA_RUNTIME_BYTES, "CUDA context, cuBLAS/cuDNN"),
            (false, _) => (CPU_RUNTIME_BYTES, "ONNX Runtime, tokenizer, image buffers"),
        };
        self.row("runtime overhead", bytes, detail.into());
    }
}

/// What the profile cannot hold: its total past the capacity's headroom, the KV cache past
/// `kv_cache_gb`, the CUDA arena past its limit, lengths past the model's.
fn problems(
    p: &Profile,
    d: &ModelDims,
    (total, capacity): (u64, Option<u64>),
    (kv, kv_budget): (u64, u64),
    arena: Option<(u64, u64)>,
) -> Vec<Problem> {
    let mut problems = Vec::new();
    if let Some(c) = capacity {
        let usable = (c as f64 * (1.0 - MIN_HEADROOM_FRACTION)) as u64;
        if total > usable {
            problems.push(Problem::Memory { total, usable });
        }
    }
    if kv > kv_budget {
        problems.push(Problem::KvBudget {
            need: kv,
            budget: kv_budget,
        });
    }
    if let Some((need, limit)) = arena {
        if need > limit {
            problems.push(Problem::Arena { need, limit });
        }
    }
    let (seq, side) = (p.max_sequence_length as u64, p.max_image_side as u64);
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
    problems
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

/// Bytes of the graphs a prefill stage loads a second time (the GQA decoder and the
/// embeddings of `precision`; see [`BudgetOptions::stage_weights_bytes`]): 0 when the export
/// has no GQA decoder for it.
pub fn stage_weights_bytes(manifest: &Manifest, model_dir: &Path, precision: Precision) -> u64 {
    let Some(graphs) = manifest.graphs.get(&precision) else {
        return 0;
    };
    let gqa = ocrctl_exporters::export::DecoderVariant::Gqa.part();
    if !graphs.contains_key(gqa) {
        return 0;
    }
    [gqa, graph::EMBED]
        .iter()
        .filter_map(|part| graphs.get(*part))
        .map(|g| {
            let f = model_dir.join("onnx").join(&g.file);
            let len = std::fs::metadata(f).map_or(0, |m| m.len());
            len.saturating_add(g.data_bytes)
        })
        .sum()
}

/// Notes about an export under a profile with TensorRT: contrib ops TensorRT cannot parse,
/// and a vision encoder whose memory relies on TensorRT fusing its attention.
pub fn export_notes(profile: &Profile, manifest: &Manifest, dims: &ModelDims) -> Vec<String> {
    let mut notes = Vec::new();
    let Some(graphs) = manifest.graphs.get(&profile.precision) else {
        return notes;
    };
    if profile.has_tensorrt() {
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
    if profile.has_tensorrt() && !vision_attention_fused_in(manifest, profile.precision) {
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
        .and_then(|g| g.get(graph::VISION))
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
                .or_else(|| g.get(graph::DECODER_MERGED))
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
